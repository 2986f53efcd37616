"""The loops diagnosis (diag/diagnoses/loops.py): the detector's worked examples, rounds split
in and out of loops, the typed section through report.json and its schema, verdict, Markdown."""

import json

import jsonschema
import pytest

from diag.diagnoses.loops import Loops, LoopsSection, find_loops, loop_section, repeating_mask, split_rounds
from diag.diagnoses.typed import from_json, to_json
from diag.replay.evaluation import PromptRounds
from test_prompt_side import _pass, evaluation


def test_loop_detector_worked_example():
    ids = [5, 1, 2, 1, 2, 1, 2, 1, 2, 9]
    (lp,) = find_loops(ids)
    assert (lp.period, lp.start, lp.end) == (2, 1, 9)
    assert [i for i, m in enumerate(repeating_mask(ids)) if m] == [3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("ids, loops", [
    ([7, 7, 7, 7], 0),                       # period 1 needs a run of MIN_RUN = 4 repeats
    ([7, 7, 7, 7, 7], 1),
    ([1, 2, 3, 1, 2, 3], 0),                 # a cycle shown twice is not a loop
    ([1, 2, 3, 1, 2, 3, 1, 2, 3], 1),        # three times is
    (list(range(30)), 0),
])
def test_loop_thresholds(ids, loops):
    assert len(find_loops(ids)) == loops


def test_rounds_inside_loops_are_split_off():
    p = PromptRounds("p", (3, 3, 0), (2, 6, 10))
    mask = [False] * 14
    mask[8] = True                           # t_8 repeats: the round rooted at 6 drafts it first
    assert split_rounds([p], [mask]) == ([[3, 0]], [[3]])


def test_loop_section_reports_with_and_without():
    seqs = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9]]
    tp = _pass(seqs, prompt_len=2)
    e = evaluation([PromptRounds("p0", (0, 1, 0), (1, 2, 4)), PromptRounds("p1", (3, 3), (1, 5))])
    sec = loop_section(tp.sequences, e, lambda ids: "".join(map(chr, [96 + i for i in ids])), seed=0, n_boot=100)
    assert sec.sequences_with_loops == 1 and sec.periods == (2,)
    assert sec.examples[0].cycle == "hi" and sec.examples[0].start == 2
    assert sec.in_loops.rounds == 1 and sec.without_loops.rounds == 4
    assert sec.all.accept_length == pytest.approx(1 + 7 / 5)
    assert sec.without_loops.accept_length == pytest.approx(1 + 4 / 4)
    back = to_json(sec)                      # report.json's keys: "from"/"to", lists for tuples
    assert back["examples"][0]["from"] == 2 and back["periods"] == [2] and back["all"]["ci95"] == list(sec.all.ci95)
    assert from_json(LoopsSection, json.loads(json.dumps(back))) == sec
    assert not list(jsonschema.Draft202012Validator(Loops().schema()).iter_errors(back))


def test_loop_verdict_and_markdown():
    seqs = [[1, 2, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9], [1, 2, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9]]
    tp = _pass(seqs, prompt_len=2)
    e = evaluation([PromptRounds("p0", (0, 3, 3), (1, 5, 7)), PromptRounds("p1", (0, 3), (1, 5))])
    sec = loop_section(tp.sequences, e, lambda ids: "".join(map(chr, [96 + i for i in ids])), seed=0, n_boot=100)
    (v,) = Loops().verdicts(sec)
    assert v.kind == "loops" and "60% of the verify rounds" in v.text and v.evidence == to_json(sec)
    md = Loops().markdown(sec, {})
    assert md[0] == "## Loops" and "| inside loops | 3 | 4.00 | 4.00–4.00 |" in md
    quiet = loop_section(tp.sequences[:0], evaluation([PromptRounds("p0", (1,), (1,))]), str, seed=0, n_boot=10)
    assert Loops().verdicts(quiet) == []


