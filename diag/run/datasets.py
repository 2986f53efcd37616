"""Readers for public prompt datasets kept as local JSONL files (nothing is downloaded): each
line of MT-bench, GSM8K, HumanEval or ShareGPT becomes one Prompt, its category naming the
dataset, so acceptance per dataset falls out of acceptance per category. A line is recognised
by its keys, so files of different datasets can be concatenated into one prompt set:

    MT-bench   {"question_id": 81, "category": "writing", "turns": ["Compose ...", "Rewrite ..."]}
               -> id "mt-bench-81", category "mt-bench/writing", messages [user: turns[0]]
    GSM8K      {"question": "Natalia sold ...", "answer": "... #### 72"}
               -> id "gsm8k-{line}", category "gsm8k", messages [user: question]
    HumanEval  {"task_id": "HumanEval/0", "prompt": "from typing import ...", "entry_point": ...}
               -> id "HumanEval/0", category "humaneval", text = prompt (a raw completion)
    ShareGPT   {"id": "x1", "conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}
               -> id "x1", category "sharegpt", messages up to and including the first user turn
               ({"role", "content"} turns are read too; roles human/user, gpt/assistant, system)

Only the first turn of a multi-turn set is a prompt: later turns need the model's own replies.
This module knows these file layouts; nothing about tokenizers or models.
"""

from __future__ import annotations

from diag.errors import DiagError
from diag.run.prompts import Prompt

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "system": "system"}
KNOWN = "MT-bench (question_id, turns), GSM8K (question, answer), HumanEval (task_id, prompt), " \
        "ShareGPT (conversations)"


def _text(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise DiagError(f"dataset line has no text in {key!r}", file=where, field=key,
                        expected="a non-empty string", found=repr(value)[:80])
    return value


def _sharegpt(obj: dict, where: str) -> Prompt:
    turns, msgs = obj["conversations"], []
    if not isinstance(turns, list):
        raise DiagError("ShareGPT conversations is not a list", file=where, field="conversations",
                        expected='[{"from": "human", "value": ...}, ...]', found=type(turns).__name__)
    for n, t in enumerate(turns):
        role = ROLES.get(str(t.get("from", t.get("role", ""))).lower()) if isinstance(t, dict) else None
        if role is None:
            raise DiagError("ShareGPT turn has an unknown speaker", file=where, field=f"conversations[{n}]",
                            expected=f"from / role one of {sorted(ROLES)}", found=str(t)[:80])
        msgs.append((role, _text(t, "value" if "value" in t else "content", where)))
        if role == "user":
            break
    if not msgs or msgs[-1][0] != "user":
        raise DiagError("ShareGPT conversation has no user turn", file=where, field="conversations",
                        expected="at least one human / user turn", found=[m[0] for m in msgs])
    return Prompt(str(obj.get("id", where)), "sharegpt", None, tuple(msgs))


def dataset_prompt(obj: dict, line: int, where: str) -> Prompt | None:
    """The Prompt a dataset line stands for, or None when its keys are no known dataset's."""
    if "turns" in obj and "question_id" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise DiagError("MT-bench line has no first turn", file=where, field="turns",
                            expected="a list of strings", found=repr(turns)[:80])
        return Prompt(f"mt-bench-{obj['question_id']}", f"mt-bench/{obj.get('category', 'uncategorised')}",
                      None, (("user", turns[0]),))
    if "question" in obj and "answer" in obj:
        return Prompt(f"gsm8k-{line}", "gsm8k", None, (("user", _text(obj, "question", where)),))
    if "task_id" in obj and "prompt" in obj:
        return Prompt(str(obj["task_id"]), "humaneval", _text(obj, "prompt", where), None)
    if "conversations" in obj:
        return _sharegpt(obj, where)
    return None
