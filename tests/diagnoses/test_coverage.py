"""The coverage diagnosis (diag/diagnoses/coverage.py): the ceiling's worked example, the
perfect drafter's rounds, rejections at uncovered tokens, the typed section through
report.json and its schema, the verdict and the Markdown."""

import json

import jsonschema
import pytest
import torch

from diag.diagnoses.coverage import (Coverage, CoverageSection, TopToken, ceiling, coverage_section, perfect_rounds,
                                     rejected_uncovered)
from diag.diagnoses.typed import from_json, to_json
from diag.replay.evaluation import PromptRounds
from test_prompt_side import _pass, evaluation


def test_ceiling_formula_worked_example():
    assert ceiling(0.1, 3) == pytest.approx(3.439)
    assert ceiling(0.0, 3) == 4.0


def test_perfect_rounds_stop_at_the_first_uncovered_token():
    covered = torch.ones(20, dtype=torch.bool)
    covered[3] = False
    tp = _pass([[1, 2, 7, 3, 9, 9, 9, 9, 9, 9]], prompt_len=2)
    # roots j = 1..5 (max_steps 3, T 10); windows t_{j+2..j+4}: j=1 [3,9,9] -> 0, then j=2 [9,9,9] -> 3
    assert perfect_rounds(tp, 0, covered, 3, 3) == [0, 3]


def test_rejections_at_uncovered_tokens_and_the_section():
    covered = torch.ones(20, dtype=torch.bool)
    covered[3] = False
    tp = _pass([[1, 2, 7, 3, 9, 9, 9, 9, 9, 9], [1, 2, 5, 6, 5, 6, 5, 6, 5, 6]], prompt_len=2, cats=["a", "b"])
    e = evaluation([PromptRounds("p0", (0, 1), (1, 2), "a"), PromptRounds("p1", (3, 2), (1, 5), "b")])
    # p0: root 1 rejected at argmax[2] = 3 (uncovered); root 2 rejected at argmax[4] = 9 (covered)
    assert rejected_uncovered(tp, e, covered) == [(1, 2), (0, 1)]
    sec = coverage_section(tp, covered, e, lambda ids: f"<{ids[0]}>", max_steps=3, seed=0, n_boot=100)
    assert sec.uncovered.count == 1 and sec.uncovered.of == 16
    assert sec.top_uncovered == (TopToken(3, "<3>", 1, 1 / 16),)
    assert sec.rejected_at_uncovered.share == pytest.approx(1 / 3)
    assert [c.category for c in sec.by_category] == ["a", "b"]
    assert sec.by_category[1].uncovered.share == 0.0 and sec.by_category[1].ceiling_formula == 4.0
    back = json.loads(json.dumps(to_json(sec)))
    assert back["top_uncovered"] == [{"token": 3, "text": "<3>", "count": 1, "share": 1 / 16}]
    assert from_json(CoverageSection, back) == sec
    assert not list(jsonschema.Draft202012Validator(Coverage().schema()).iter_errors(back))
    (v,) = Coverage().verdicts(sec)              # 1 of 3 rejections; the interval over 2 prompts starts at 0
    assert v.kind == "vocabulary-coverage-ok" and "33.3% of the drafter's rejections" in v.text
    md = Coverage().markdown(sec, {})
    assert md[0] == "## Draft-vocabulary coverage" and "| b | 1 | 0.0% | 0.0%–0.0% | " in md[-4]


