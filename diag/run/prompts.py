"""Prompt sets and recorded continuations: reading JSONL files and tokenizing.

A prompt set is JSONL, one object per line: {"id", "category", "text"} for a raw completion
prompt or {"id", "category", "messages": [{"role", "content"}...]} for chat. Chat prompts go
through the tokenizer's chat template (generation prompt added); a tokenizer without one
gets the turns joined as "role: content" lines, and the report says so.

Recorded continuations (what a live server produced) are JSONL {"id", "token_ids": [...]}
or {"id", "text"}. This module knows files and tokenizers; nothing about models.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from diag.errors import DiagError


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str | None
    messages: tuple[tuple[str, str], ...] | None


@dataclass(frozen=True)
class PromptSet:
    path: str
    sha256: str
    prompts: tuple[Prompt, ...]


def _parse_line(obj: dict, where: str) -> Prompt:
    if not isinstance(obj, dict) or "id" not in obj:
        raise DiagError("prompt line is not an object with an id", file=where, field="id",
                        expected='{"id": ..., "text" | "messages": ...}', found=str(obj)[:80])
    has_text, has_msgs = "text" in obj, "messages" in obj
    if has_text == has_msgs:
        raise DiagError("a prompt needs exactly one of text / messages", file=where, field=str(obj["id"]),
                        expected="text or messages", found=sorted(obj))
    msgs = None
    if has_msgs:
        try:
            msgs = tuple((m["role"], m["content"]) for m in obj["messages"])
        except (TypeError, KeyError) as err:
            raise DiagError("malformed messages", file=where, field=f"{obj['id']}.messages",
                            expected='[{"role": ..., "content": ...}]', found=str(err)) from err
    return Prompt(str(obj["id"]), str(obj.get("category", "uncategorised")), obj.get("text"), msgs)


def read_prompt_set(path: str | Path, limit: int | None = None,
                    categories: tuple[str, ...] | None = None) -> PromptSet:
    path = Path(path)
    if not path.is_file():
        raise DiagError("prompt file not found", file=str(path), expected="a JSONL prompt set",
                        found="no such file")
    raw = path.read_bytes()
    prompts = []
    for n, line in enumerate(raw.decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise DiagError("prompt line is not JSON", file=f"{path}:{n}", expected="one JSON object per line",
                            found=str(err)) from err
        prompts.append(_parse_line(obj, f"{path}:{n}"))
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
    digest = hashlib.sha256(json.dumps([p.__dict__ for p in prompts], sort_keys=True).encode()).hexdigest()
    return PromptSet(str(path), digest[:16], tuple(prompts))


def tokenize(prompt: Prompt, tokenizer) -> list[int]:
    """Token ids of one prompt, chat template applied when the tokenizer has one."""
    if prompt.messages is None:
        return list(tokenizer(prompt.text, add_special_tokens=True)["input_ids"])
    msgs = [{"role": r, "content": c} for r, c in prompt.messages]
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)
    text = "\n".join(f"{r}: {c}" for r, c in prompt.messages) + "\nassistant:"
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def read_recorded(path: str | Path, tokenizer, ids: list[str]) -> dict[str, list[int]]:
    """Recorded continuations keyed by prompt id; every prompt must have one."""
    path = Path(path)
    if not path.is_file():
        raise DiagError("recorded continuation file not found", file=str(path),
                        expected='JSONL {"id", "token_ids"} or {"id", "text"}', found="no such file")
    out: dict[str, list[int]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        obj = json.loads(line)
        if "token_ids" in obj:
            out[str(obj["id"])] = [int(t) for t in obj["token_ids"]]
        elif "text" in obj:
            out[str(obj["id"])] = list(tokenizer(obj["text"], add_special_tokens=False)["input_ids"])
        else:
            raise DiagError("recorded continuation needs token_ids or text", file=f"{path}:{n}",
                            field=str(obj.get("id")), expected="token_ids or text", found=sorted(obj))
    missing = [i for i in ids if i not in out]
    if missing:
        raise DiagError("recorded continuations are missing prompts", file=str(path), field="id",
                        expected="one line per prompt", found=f"missing {missing[:5]}")
    return out
