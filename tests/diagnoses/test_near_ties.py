"""The near_ties diagnosis (diag/diagnoses/near_ties.py): the worked example on hand-made
logits, the section on a hand-made pass and head, its note's threshold, and the demo on the
zoo pair with the section in report.json (valid against the generated schema) and report.md."""

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch

from diag.cli.main import main
from diag.diagnoses import DIAGNOSES
from diag.diagnoses.near_ties import MARGIN, NearTies, NearTiesSection, near_tie_mask, near_ties_section, top2_gap
from diag.diagnoses.typed import from_json, to_json
from diag.diagnoses.hooks import report_schema
from diag.target.passes import Sequence

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "diag" / "schema" / "report.schema.json"


def logits(*probs) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in row] for row in probs])


def test_worked_example():
    x = logits([0.50, 0.46, 0.04], [0.7, 0.2, 0.1], [0.2, 0.7, 0.1], [0.45, 0.05, 0.5])
    assert top2_gap(x).tolist() == pytest.approx([0.04, 0.5, 0.5, 0.05])
    assert near_tie_mask(x).tolist() == [True, False, False, False]     # 0.05 itself is not within
    assert near_tie_mask(x, margin=0.06).tolist() == [True, False, False, True]


class Head(torch.nn.Module):
    """lm_head whose weight is the identity: a state's entries are its logits."""
    def __init__(self, vocab: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(vocab))


def test_section_counts_continuation_decisions_only():
    # prompt_len 2, emitted 5: decisions at j = 1, 2, 3 (choosing tokens 2, 3, 4); rows 0 and 4 never count
    tie, clear = [math.log(p) for p in (0.50, 0.46, 0.04)], [math.log(p) for p in (0.7, 0.2, 0.1)]
    seqs = [_seq("a", [0, 1, 2, 0, 1], 2), _seq("b", [0, 1, 2, 0, 1], 2)]
    states = [torch.tensor([tie, tie, clear, clear, tie]), torch.tensor([clear, clear, clear, clear, clear])]
    sec = near_ties_section(seqs, states, Head(3), lambda ids: "abc"[ids[0]], seed=0, n_boot=100)
    assert (sec.positions, sec.near_ties, sec.continuations) == (6, 1, 2)
    assert sec.share == pytest.approx(1 / 6) and sec.per_continuation == 0.5
    (ex,) = sec.examples
    assert (ex.prompt, ex.position, ex.first, ex.second) == ("a", 1, "a", "b") and ex.gap == pytest.approx(0.04)
    assert NearTies().verdicts(sec) == []                  # 0.5 near ties per continuation: below the note
    # two near ties per continuation: the note
    states = [torch.tensor([tie] * 5), torch.tensor([tie] * 5)]
    loud = near_ties_section(seqs, states, Head(3), lambda ids: "abc"[ids[0]], seed=0, n_boot=100)
    (v,) = NearTies().verdicts(loud)
    assert v.severity == "info" and "6 of the target's 6 greedy decisions" in v.text and v.evidence == to_json(loud)
    back = json.loads(json.dumps(to_json(loud)))
    assert from_json(NearTiesSection, back) == loud
    assert not list(jsonschema.Draft202012Validator(NearTies().schema()).iter_errors(back))
    assert NearTies().markdown(loud, {})[0] == "## Near ties"


def test_an_id_the_tokenizer_lacks_is_named_by_its_number():
    """The runner-up can be a padded row of the lm_head (a tokenizer of 2 ids, 3 rows)."""
    tie = [math.log(p) for p in (0.04, 0.50, 0.46)]                     # top-2: ids 1 and 2
    seqs = [_seq("a", [0, 1, 1], 1)]
    sec = near_ties_section(seqs, [torch.tensor([tie] * 3)], Head(3), lambda ids: "ab"[ids[0]], seed=0, n_boot=10)
    assert (sec.examples[0].first, sec.examples[0].second) == ("b", "<id 2>")


def _seq(pid, ids, prompt_len):
    return Sequence(pid, "chat", prompt_len, torch.tensor(ids))


def test_registered():
    assert "near_ties" in [d.name for d in DIAGNOSES]
    assert MARGIN == 0.05


@pytest.mark.slow
def test_demo_shows_the_section(tmp_path):
    out = tmp_path / "demo"
    assert main(["run", "cases/demo.toml", "--out", str(out), "--quiet"]) == 0
    rep = json.loads((out / "report.json").read_text())
    sec = rep["near_ties"]
    assert sec["margin"] == 0.05 and sec["positions"] > 1000 and sec["continuations"] == 48
    assert 0 < sec["near_ties"] < sec["positions"] and sec["share"] == sec["near_ties"] / sec["positions"]
    schema = report_schema(json.loads(SCHEMA_FILE.read_text()))
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(rep)]
    md = (out / "report.md").read_text()
    assert "## Near ties" in md and f"{sec['near_ties']} of {sec['positions']} continuation positions" in md
    noted = [v for v in rep["verdicts"] if v["kind"] == "near-ties"]
    assert bool(noted) == (sec["per_continuation"] >= 1.0)
