"""Prompt files as users have them: the serving engines' {"prompt"}, MT-bench turns, ShareGPT
conversations (both spellings, JSONL or one JSON array), GSM8K, HumanEval, records without an id,
categories from the file name; and a clear error for a record diag cannot read."""

import json

import pytest

from diag.errors import DiagError
from diag.run.prompts import read_prompt_set, tokenize


def write(path, rows, *, array=False):
    path.write_text(json.dumps(rows) if array else "\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_mt_bench_first_turn_with_question_id_and_category(tmp_path):
    rows = [{"question_id": 81, "category": "writing", "turns": ["Compose a blog post.", "Rewrite it."]},
            {"question_id": 101, "category": "reasoning", "turns": ["Who is second?"]}]
    pset = read_prompt_set(write(tmp_path / "question.jsonl", rows))
    p = pset.prompts[0]
    assert (p.id, p.category) == ("mt-bench-81", "mt-bench/writing")           # formats.py's dataset names
    assert p.messages == (("user", "Compose a blog post."),) and p.text is None
    assert any("first user turn" in n for n in pset.notes)


@pytest.mark.parametrize("array", [False, True])
def test_sharegpt_both_spellings(tmp_path, array):
    rows = [{"id": "a1", "conversations": [{"from": "system", "value": "Be brief."},
                                            {"from": "human", "value": "Hi there"},
                                            {"from": "gpt", "value": "Hello!"},
                                            {"from": "human", "value": "Bye"}]},
            {"conversations": [{"role": "user", "content": "What is 2+2?"},
                               {"role": "assistant", "content": "4"}]}]
    pset = read_prompt_set(write(tmp_path / "sharegpt.json", rows, array=array))
    a, b = pset.prompts
    assert a.messages[-1] == ("user", "Hi there") and a.category == "sharegpt"
    assert b.messages[0] == ("user", "What is 2+2?") and b.category == "sharegpt"


def test_engine_benchmark_prompt_gsm8k_humaneval_and_text(tmp_path):
    rows = [{"prompt": "Write a haiku."},
            {"question": "Natalia sold 48 clips...", "answer": "72"},
            {"task_id": "HumanEval/0", "prompt": "def has_close_elements(numbers):\n"},
            {"text": "def f(x):\n    return", "category": "code"}]
    pset = read_prompt_set(write(tmp_path / "mixed.jsonl", rows))
    got = [(p.id, p.category, p.format, p.text, p.messages) for p in pset.prompts]
    assert got == [("1", "mixed", "prompt", None, (("user", "Write a haiku."),)),
                   ("gsm8k-2", "gsm8k", "gsm8k", None, (("user", "Natalia sold 48 clips..."),)),
                   ("HumanEval/0", "humaneval", "humaneval", "def has_close_elements(numbers):\n", None),
                   ("4", "code", "text", "def f(x):\n    return", None)]


def test_blank_lines_keep_line_numbers_as_ids(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b"}\n')
    assert [p.id for p in read_prompt_set(path).prompts] == ["1", "3"]


def test_existing_prompt_set_keeps_its_hash():
    """Adding formats must not change the hash of the prompt sets reports already cite."""
    import hashlib
    path = "cases/prompts/mixed-48.jsonl"
    pset = read_prompt_set(path)
    rows = [json.loads(l) for l in open(path) if l.strip()]
    old = [{"id": r["id"], "category": r.get("category", "uncategorised"), "text": r.get("text"),
            "messages": [[m["role"], m["content"]] for m in r["messages"]] if "messages" in r else None}
           for r in rows]
    assert pset.sha256 == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize("row, message, field", [
    ({"text": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one", "text, messages"),
    ({"id": "x"}, "exactly one", None),
    ({"turns": []}, "MT-bench", "turns"),
    ({"conversations": [{"from": "gpt", "value": "hi"}]}, "no user turn", "conversations"),
    ({"conversations": [{"speaker": "human", "text": "hi"}]}, "malformed ShareGPT turn", "conversations[0]"),
    ({"conversations": [{"from": "robot", "value": "hi"}]}, "ShareGPT turn has an unknown speaker", "conversations[0]"),
    ({"prompt": ["not", "a", "string"]}, "must be a non-empty string", "2.prompt"),
    ({"messages": [{"role": "user"}]}, "malformed messages", "2.messages"),
])
def test_bad_records_name_the_line_and_field(tmp_path, row, message, field):
    path = write(tmp_path / "bad.jsonl", [{"text": "fine"}, row])
    with pytest.raises(DiagError, match=message) as err:
        read_prompt_set(path)
    assert err.value.file == f"{path}:2" and err.value.field == field


def test_duplicate_ids_after_defaults(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"id": "2", "text": "a"}, {"text": "b"}])   # line 2 -> id "2"
    with pytest.raises(DiagError, match="not unique"):
        read_prompt_set(path)


def test_tokenize_prompt_format_goes_through_the_template():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, msgs, add_generation_prompt, tokenize, **kw):
            assert add_generation_prompt and tokenize
            return [len(m["content"]) for m in msgs]

    from diag.run.prompts.records import Prompt
    assert tokenize(Prompt("1", "c", None, (("user", "abc"),), "prompt"), Tok()) == [3]
