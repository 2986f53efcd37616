"""Public prompt datasets read from local JSONL files (issue 14.2): one line of MT-bench,
GSM8K, HumanEval and ShareGPT each (their published layouts), concatenated into one prompt
set; each becomes its dataset's Prompt and category, a run reports acceptance per dataset,
and lines of no known layout fail naming the line."""

import json

import pytest

import tiny
from diag.errors import DiagError
from diag.run.case import read_case
from diag.run.pipeline import run_case
from diag.run.prompts import Prompt, read_prompt_set

MT_BENCH = {"question_id": 81, "category": "writing",
            "turns": ["Compose an engaging travel blog post about a recent trip to Hawaii.",
                      "Rewrite your previous response. Start every sentence with the letter A."]}
GSM8K = {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                     "clips in May. How many clips did Natalia sell altogether in April and May?",
         "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"}
HUMANEVAL = {"task_id": "HumanEval/0", "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: "
             "List[float], threshold: float) -> bool:\n    \"\"\" Check if in given list of numbers, are any two "
             "numbers closer to each other than\n    given threshold.\n    \"\"\"\n",
             "canonical_solution": "    return False\n", "test": "def check(candidate):\n    pass\n",
             "entry_point": "has_close_elements"}
SHAREGPT = {"id": "QWJhYvA_0", "conversations": [{"from": "system", "value": "Be brief."},
                                                 {"from": "human", "value": "Summarize the plot of Hamlet."},
                                                 {"from": "gpt", "value": "A prince avenges his father."},
                                                 {"from": "human", "value": "Shorter."}]}


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_each_dataset_line_becomes_its_prompt(tmp_path):
    own = {"id": "p1", "category": "code", "text": "def f(x):"}
    pset = read_prompt_set(_write(tmp_path / "mix.jsonl", [MT_BENCH, GSM8K, HUMANEVAL, SHAREGPT, own]))
    mt, gsm, he, sg, p1 = pset.prompts
    assert mt == Prompt("mt-bench-81", "mt-bench/writing", None, (("user", MT_BENCH["turns"][0]),), "mt-bench")
    assert gsm == Prompt("gsm8k-2", "gsm8k", None, (("user", GSM8K["question"]),), "gsm8k")  # id: its line
    assert he == Prompt("HumanEval/0", "humaneval", HUMANEVAL["prompt"], None, "humaneval")  # a raw completion
    assert (sg.id, sg.category, sg.format) == ("QWJhYvA_0", "sharegpt", "sharegpt")
    assert sg.messages == (("system", "Be brief."), ("user", "Summarize the plot of Hamlet."))  # to the 1st user turn
    assert p1 == Prompt("p1", "code", "def f(x):", None)


@pytest.mark.parametrize("row, match, field", [
    ({"prompt_text": "hi"}, "not an object with an id", "id"),
    ({"question_id": 1, "turns": []}, "malformed MT-bench turns", "turns"),
    ({"question": "", "answer": "1"}, "question must be a non-empty string", "gsm8k-2.question"),
    ({"id": "s", "conversations": [{"from": "robot", "value": "x"}]}, "unknown speaker", "conversations[0]"),
    ({"id": "s", "conversations": [{"from": "gpt", "value": "x"}]}, "no user turn", "conversations"),
])
def test_dataset_mistakes_name_the_line_and_key(tmp_path, row, match, field):
    with pytest.raises(DiagError, match=match) as err:
        read_prompt_set(_write(tmp_path / "bad.jsonl", [GSM8K, row]))
    assert err.value.file.endswith("bad.jsonl:2") and err.value.field == field


def test_a_run_reports_acceptance_per_dataset(tmp_path):
    d = tmp_path / "m"
    target, drafter = tiny.make_target(d / "t"), tiny.make_drafter(d / "d")
    rows = [dict(HUMANEVAL, task_id=f"HumanEval/{i}") for i in range(2)] + [
        dict(GSM8K, question=GSM8K["question"][i:]) for i in range(2)]
    case = tiny.write_case(tmp_path / "case.toml", target, drafter, str(_write(tmp_path / "p.jsonl", rows)),
                           trees=["chain-2"])
    run = run_case(read_case(str(case)), progress=False, use_cache=False)
    cats = {c.category: c for e in run.evaluations[:1] for c in e.by_category}
    assert set(cats) == {"humaneval", "gsm8k"}
    assert all(c.prompts == 2 for c in cats.values())
