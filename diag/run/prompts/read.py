"""Reading prompt sets and recorded continuations from files, and tokenizing prompts.

A prompt set is JSONL (one record per line) or one JSON array of records (ShareGPT dumps are
shipped that way). Every record is read by formats.py's reader of its format (`text`, `prompt`,
`messages`, `conversations`, `turns`, `question`, id optional); a line of MT-bench, GSM8K,
HumanEval or ShareGPT takes its id and category from its dataset (formats.py too).
Chat prompts go through the tokenizer's chat template (generation prompt added); a tokenizer
without one gets the turns joined as "role: content" lines, and the report says so.

Recorded continuations (what a live server produced) are JSONL {"id", "token_ids": [...]}
or {"id", "text"}. This module knows files and tokenizers; nothing about models.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from diag.errors import DiagError
from diag.checkpoint.readable import require_readable
from diag.run.prompts.formats import parse_record
from diag.run.prompts.records import Prompt, PromptSet


def _records(path: Path) -> list[tuple[int, str, object]]:
    """(line number, where, parsed object) per record; a JSON array counts its items from 1."""
    lines = _lines(path)
    if "\n".join(t for _, t in lines).lstrip().startswith("["):
        try:
            items = json.loads("\n".join(t for _, t in lines))
        except json.JSONDecodeError as err:
            raise DiagError("prompt file is not valid JSON", file=str(path), expected="a JSON array of "
                            "records or one JSON object per line", found=str(err)) from err
        return [(i, f"{path}[{i - 1}]", obj) for i, obj in enumerate(items, 1)]
    out = []
    for n, line in lines:
        if not line.strip():
            continue
        try:
            out.append((n, f"{path}:{n}", json.loads(line)))
        except json.JSONDecodeError as err:
            raise DiagError("prompt line is not JSON", file=f"{path}:{n}", expected="one JSON object per line",
                            found=str(err)) from err
    return out


def _notes(prompts: list[Prompt]) -> tuple[str, ...]:
    kinds = sorted({p.format for p in prompts})
    notes = [f"prompt formats read: {', '.join(kinds)}"] if set(kinds) - {"text", "messages"} else []
    if {"mt-bench", "sharegpt"} & set(kinds):
        notes.append("multi-turn prompts (mt-bench, sharegpt): the first user turn only, as the engines' "
                     "serving benchmarks send it (later turns follow the model's own answer)")
    return tuple(notes)


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a UTF-8 file; invalid UTF-8 is an error naming the line."""
    out = []
    for n, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        try:
            out.append((n, raw.decode("utf-8")))
        except UnicodeDecodeError as err:
            raise DiagError("file is not valid UTF-8", file=f"{path}:{n}", expected="UTF-8 text",
                            found=f"byte {raw[err.start:err.start + 1]!r} at column {err.start + 1}") from None
    return out


def read_prompt_set(path: str | Path, limit: int | None = None,
                    categories: tuple[str, ...] | None = None) -> PromptSet:
    path = Path(path)
    if not path.is_file():
        raise DiagError("prompt file not found", file=str(path), expected="a JSONL prompt set",
                        found="no such file")
    require_readable(path, "prompt file")
    default_category = path.name.split(".")[0]
    prompts = [parse_record(obj, where, line=n, default_category=default_category)
               for n, where, obj in _records(path)]
    if categories:
        prompts = [p for p in prompts if p.category in categories]
    if limit is not None:
        prompts = prompts[:limit]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise DiagError("prompt ids are not unique", file=str(path), field="id",
                        expected="unique ids", found=sorted({i for i in ids if ids.count(i) > 1})[:5])
    if not prompts:
        raise DiagError("prompt set is empty after filtering", file=str(path),
                        expected="at least one prompt", found=0)
    digest = hashlib.sha256(json.dumps([_hashed(p) for p in prompts], sort_keys=True).encode()).hexdigest()
    return PromptSet(str(path), digest[:16], tuple(prompts), _notes(prompts))


def _hashed(p: Prompt) -> dict:
    """What the prompt-set hash covers: the prompt as it was before formats were recorded
    (id, category, text, messages), so existing prompt sets keep their hash."""
    return {"id": p.id, "category": p.category, "text": p.text, "messages": p.messages}


def tokenize(prompt: Prompt, tokenizer) -> list[int]:
    """Token ids of one prompt under the default rendering ("auto": chat template for
    messages, text raw); every rendering lives in render.py."""
    from diag.run.render import Renderer
    from diag.run.rendering import DEFAULT, parse
    return Renderer(tokenizer).ids(prompt, parse(DEFAULT))


def _recorded_line(line: str, where: str, tokenizer) -> tuple[str, list[int]]:
    """One JSONL line {"id", "token_ids": [ints]} or {"id", "text": str} -> (id, token ids)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise DiagError("recorded continuation line is not JSON", file=where,
                        expected="one JSON object per line", found=str(err)) from err
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), (str, int)) or isinstance(obj.get("id"), bool):
        raise DiagError("recorded continuation is not an object with an id", file=where, field="id",
                        expected='{"id": ..., "token_ids": [...]}', found=line[:80])
    pid = str(obj["id"])
    if "token_ids" in obj:
        ids = obj["token_ids"]
        if not isinstance(ids, list) or not ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise DiagError("recorded token_ids must be a non-empty list of token ids", file=where,
                            field=f"{pid}.token_ids", expected="non-negative integers", found=str(ids)[:80])
        return pid, list(ids)
    if "text" in obj:
        if not isinstance(obj["text"], str) or not obj["text"]:
            raise DiagError("recorded text must be a non-empty string", file=where, field=f"{pid}.text",
                            expected="a string", found=repr(obj["text"])[:80])
        return pid, list(tokenizer(obj["text"], add_special_tokens=False)["input_ids"])
    raise DiagError("recorded continuation needs token_ids or text", file=where,
                    field=pid, expected="token_ids or text", found=sorted(obj))


def read_recorded(path: str | Path, tokenizer, ids: list[str]) -> dict[str, list[int]]:
    """Recorded continuations keyed by prompt id; every prompt must have one."""
    path = Path(path)
    if not path.is_file():
        raise DiagError("recorded continuation file not found", file=str(path),
                        expected='JSONL {"id", "token_ids"} or {"id", "text"}', found="no such file")
    require_readable(path, "recorded continuation file")
    out: dict[str, list[int]] = {}
    for n, line in _lines(path):
        if not line.strip():
            continue
        pid, cont = _recorded_line(line, f"{path}:{n}", tokenizer)
        if pid in out:
            raise DiagError("recorded continuation appears twice", file=f"{path}:{n}", field="id",
                            expected="one line per prompt id", found=pid)
        out[pid] = cont
    missing = [i for i in ids if i not in out]
    if missing:
        raise DiagError("recorded continuations are missing prompts", file=str(path), field="id",
                        expected="one line per prompt", found=f"missing {missing[:5]}")
    return out
