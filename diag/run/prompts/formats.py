"""Prompt records as users have them: the one reader of prompt records, one entry per format
(presets as data), each with how a line of its public dataset is named.

| format     | record (keys that identify it)                       | becomes                         |
|------------|------------------------------------------------------|---------------------------------|
| messages   | {"messages": [{"role", "content"}, ...]}             | the chat turns                  |
| sharegpt   | {"conversations": [{"from", "value"} or {"role", "content"}]} | leading system turn + first user turn |
| mt-bench   | {"question_id", "category", "turns": [str, ...]}     | first turn as the user message  |
| humaneval  | {"task_id", "prompt"}                                | raw completion text (code)      |
| gsm8k      | {"question", "answer"?}                              | the question as the user message|
| prompt     | {"prompt": str} (SGLang / vLLM benchmark files)      | the user message (vLLM's custom dataset applies the chat template by default) |
| text       | {"text": str}                                        | raw completion text             |

Public datasets kept as local JSONL files (nothing is downloaded): a line that has its
dataset's keys takes its id and category from the dataset, so acceptance per dataset falls
out of acceptance per category, and files of different datasets can be concatenated:

| dataset    | keys                        | id                    | category              |
|------------|-----------------------------|-----------------------|-----------------------|
| MT-bench   | question_id, turns          | "mt-bench-81"         | "mt-bench/writing"    |
| GSM8K      | question, answer            | "gsm8k-{line}"        | "gsm8k"               |
| HumanEval  | task_id, prompt             | "HumanEval/0"         | "humaneval"           |
| ShareGPT   | conversations               | its `id` ("x1")       | "sharegpt"            |

Multi-turn sets keep only what needs no model answer: MT-bench's second turn and ShareGPT's
later turns follow an answer the replayed target would write itself, so SGLang's and vLLM's
serving benchmarks (bench_serving sharegpt / mt-bench) send the first turn, and so does diag.
ShareGPT speakers: human/user -> user, gpt/chatgpt/assistant/bard/bing -> assistant, system.
Any other record: the id is its `id`, `question_id` or `task_id`, else the line number ("7");
the category is the record's `category`, else the file's name (gsm8k.jsonl -> "gsm8k").
Example: {"question_id": 81, "category": "writing", "turns": ["Compose a blog post", "Rewrite it"]}
-> Prompt(id "mt-bench-81", category "mt-bench/writing", messages (("user", "Compose a blog post"),),
format "mt-bench"); without its question_id it would be Prompt(id "7", category "writing", ...).

This module knows records and keys; nothing about files or tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from diag.errors import DiagError
from diag.run.prompts.records import Prompt

_SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
             "assistant": "assistant", "bard": "assistant", "bing": "assistant", "system": "system"}
_CONTENT_KEYS = ("text", "prompt", "messages", "conversations", "turns", "question")
_ID_KEYS = ("id", "question_id", "task_id")


@dataclass(frozen=True)
class Format:
    name: str
    keys: tuple[str, ...]                  # all present -> this format
    read: Callable[[dict, str, str], tuple[str | None, tuple | None]]   # (record, where, id) -> (text, messages)
    dataset: tuple[str, ...] = ()          # all present -> a line of this format's public dataset, named by
    named: Callable[[dict, int, str], tuple[str, str]] | None = None    # (record, line, where) -> (id, category)


def _string(obj: dict, key: str, where: str, pid: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or not value.strip():
        raise DiagError(f"prompt {key} must be a non-empty string", file=where, field=f"{pid}.{key}",
                        expected="a string", found=repr(value)[:80])
    return value


def _messages(obj: dict, where: str, pid: str):
    try:
        msgs = tuple((m["role"], m["content"]) for m in obj["messages"])
    except (TypeError, KeyError) as err:
        raise DiagError("malformed messages", file=where, field=f"{pid}.messages",
                        expected='[{"role": ..., "content": ...}]', found=str(err)) from err
    if not msgs or not all(isinstance(r, str) and isinstance(c, str) for r, c in msgs):
        raise DiagError("malformed messages", file=where, field=f"{pid}.messages",
                        expected='a non-empty list of {"role": string, "content": string}',
                        found=str(obj["messages"])[:80])
    return None, msgs


def _turn(t, n: int, where: str) -> tuple[str, str]:
    if isinstance(t, dict) and "from" in t and "value" in t:
        speaker, text = str(t["from"]).lower(), t["value"]
    elif isinstance(t, dict) and "role" in t and "content" in t:
        speaker, text = str(t["role"]).lower(), t["content"]
    else:
        raise DiagError("malformed ShareGPT turn", file=where, field=f"conversations[{n}]",
                        expected='{"from", "value"} or {"role", "content"}', found=str(t)[:80])
    if speaker not in _SPEAKERS:
        raise DiagError("ShareGPT turn has an unknown speaker", file=where, field=f"conversations[{n}]",
                        expected=f"from / role one of {sorted(_SPEAKERS)}", found=speaker)
    return _SPEAKERS[speaker], str(text)


def _sharegpt(obj: dict, where: str, pid: str):
    turns = obj["conversations"]
    if not isinstance(turns, list):
        raise DiagError("malformed ShareGPT conversation", file=where, field="conversations",
                        expected="a list of turns", found=type(turns).__name__)
    parsed = [_turn(t, n, where) for n, t in enumerate(turns)]
    first_user = next((i for i, (r, _) in enumerate(parsed) if r == "user"), None)
    if first_user is None:
        raise DiagError("ShareGPT conversation has no user turn", file=where, field="conversations",
                        expected='a turn from "human" or "user"', found=[r for r, _ in parsed])
    system = tuple(t for t in parsed[:first_user] if t[0] == "system")
    return None, system + (parsed[first_user],)


def _mt_bench(obj: dict, where: str, pid: str):
    turns = obj["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise DiagError("malformed MT-bench turns", file=where, field="turns",
                        expected="a non-empty list of strings", found=str(turns)[:80])
    return None, (("user", turns[0]),)


FORMATS: tuple[Format, ...] = (
    Format("messages", ("messages",), _messages),
    Format("sharegpt", ("conversations",), _sharegpt,
           ("conversations",), lambda o, n, w: (str(o.get("id", w)), "sharegpt")),
    Format("mt-bench", ("turns",), _mt_bench, ("turns", "question_id"),
           lambda o, n, w: (f"mt-bench-{o['question_id']}", f"mt-bench/{o.get('category') or 'uncategorised'}")),
    Format("humaneval", ("task_id", "prompt"), lambda o, w, i: (_string(o, "prompt", w, i), None),
           ("task_id", "prompt"), lambda o, n, w: (str(o["task_id"]), "humaneval")),
    Format("gsm8k", ("question",), lambda o, w, i: (None, (("user", _string(o, "question", w, i)),)),
           ("question", "answer"), lambda o, n, w: (f"gsm8k-{n}", "gsm8k")),
    Format("prompt", ("prompt",), lambda o, w, i: (None, (("user", _string(o, "prompt", w, i)),))),
    Format("text", ("text",), lambda o, w, i: (_string(o, "text", w, i), None)),
)


def format_of(obj: dict, where: str) -> Format:
    """The one format a record is written in; DiagError when none or several fit."""
    present = [k for k in _CONTENT_KEYS if k in obj]
    if not present and not any(k in obj for k in _ID_KEYS):
        raise DiagError("prompt line is not an object with an id or a prompt key", file=where, field="id",
                        expected="one of text / messages / prompt / conversations / turns / question "
                        "(id optional)", found=sorted(obj))
    if len(present) != 1:
        raise DiagError("a prompt needs exactly one of text / messages / prompt / conversations / "
                        "turns / question", file=where, field=", ".join(present) or None,
                        expected="exactly one", found=sorted(obj))
    return next(f for f in FORMATS if all(k in obj for k in f.keys))


def parse_record(obj: dict, where: str, *, line: int, default_category: str) -> Prompt:
    """One record (line `line` of a file whose name gives `default_category`) as a Prompt."""
    if not isinstance(obj, dict):
        raise DiagError("prompt line is not a JSON object", file=where, expected='{"text": ...} or another '
                        "format (diag/run/prompts/formats.py)", found=str(obj)[:80])
    dataset = next((f for f in FORMATS if f.dataset and all(k in obj for k in f.dataset)), None)
    pid, category = dataset.named(obj, line, where) if dataset else _named(obj, line, default_category, where)
    fmt = format_of(obj, where)
    text, messages = fmt.read(obj, where, pid)
    return Prompt(pid, category, text, messages, fmt.name)


def _named(obj: dict, line: int, default_category: str, where: str) -> tuple[str, str]:
    """(id, category) of a record that is no dataset's line: its own id key, else the line number."""
    pid = next((obj[k] for k in _ID_KEYS if obj.get(k) is not None), line)
    if not isinstance(pid, (str, int)) or isinstance(pid, bool):
        key = next(k for k in _ID_KEYS if obj.get(k) is not None)
        raise DiagError(f"prompt {key} must be a string or an integer", file=where, field=key,
                        expected='e.g. "p1" or 1', found=repr(pid))
    return str(pid), str(obj.get("category") or default_category)
