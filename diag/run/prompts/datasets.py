"""Names for lines of public prompt datasets kept as local JSONL files (nothing is downloaded):
a line of MT-bench, GSM8K, HumanEval or ShareGPT becomes one Prompt whose id and category name
the dataset, so acceptance per dataset falls out of acceptance per category. A line is
recognised by its keys, so files of different datasets can be concatenated into one set:

    MT-bench   {"question_id": 81, "category": "writing", "turns": ["Compose ...", "Rewrite ..."]}
               -> id "mt-bench-81", category "mt-bench/writing"
    GSM8K      {"question": "Natalia sold ...", "answer": "... #### 72"}
               -> id "gsm8k-{line}", category "gsm8k"
    HumanEval  {"task_id": "HumanEval/0", "prompt": "from typing import ...", "entry_point": ...}
               -> id "HumanEval/0", category "humaneval"
    ShareGPT   {"id": "x1", "conversations": [{"from": "human", "value": ...}, ...]}
               -> id "x1", category "sharegpt"

What the prompt says (text or messages: the first user turn, a leading system turn kept) is
read by the format's own reader in prompts/formats.py, the one reader of each layout; this
module only names. It knows these datasets' keys; nothing about tokenizers or models.
"""

from __future__ import annotations

from diag.run.prompts.formats import format_of
from diag.run.prompts.records import Prompt


def _named(obj: dict, line: int, where: str) -> tuple[str, str] | None:
    """(id, category) of a dataset line, or None when its keys are no known dataset's."""
    if "turns" in obj and "question_id" in obj:
        return f"mt-bench-{obj['question_id']}", f"mt-bench/{obj.get('category') or 'uncategorised'}"
    if "question" in obj and "answer" in obj:
        return f"gsm8k-{line}", "gsm8k"
    if "task_id" in obj and "prompt" in obj:
        return str(obj["task_id"]), "humaneval"
    if "conversations" in obj:
        return str(obj.get("id", where)), "sharegpt"
    return None


def dataset_prompt(obj: dict, line: int, where: str) -> Prompt | None:
    """The Prompt a dataset line stands for, or None when its keys are no known dataset's."""
    named = _named(obj, line, where)
    if named is None:
        return None
    pid, category = named
    fmt = format_of(obj, where)
    text, messages = fmt.read(obj, where, pid)
    return Prompt(pid, category, text, messages, fmt.name)
