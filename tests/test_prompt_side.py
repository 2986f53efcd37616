"""The prompt-side measurements on hand-made data (issue 14.2-14.5): acceptance per category,
vocabulary coverage and its ceiling, the loop detector, the long-context ladder and its marks.
Every worked example of the modules' docstrings is checked here."""

import pytest
import torch

from diag.errors import DiagError
from diag.replay.categories import by_category
from diag.replay.evaluation import Axes, Evaluation, PromptRounds
from diag.metrics import AcceptCounts
from diag.run.long_context import ladder, long_context_section, rung_lengths
from diag.target.passes import Sequence, TargetPass
from diag.trees import tree_shape


def evaluation(per_prompt, tree="chain-3") -> Evaluation:
    shape = tree_shape(tree)
    S, D = shape.num_steps, shape.num_draft_tokens
    flat = [a for p in per_prompt for a in p.accepted]
    c = AcceptCounts.from_accepted(flat, S, D)
    return Evaluation(Axes("embed+L2+L4", "eagle3", shape.name, "as-loaded", "as-loaded", "auto"), shape, c, c,
                      1 + sum(flat) / len(flat), (None, None), (), tuple(per_prompt))


# ---- categories ---------------------------------------------------------------------------

def test_by_category_worked_example():
    rows = by_category([PromptRounds("a", (2, 1), (), "code"), PromptRounds("b", (0,), (), "code"),
                        PromptRounds("c", (3,), (), "math")], seed=0, n_boot=200)
    assert [(r.category, r.prompts, r.rounds, r.accept_length) for r in rows] == \
        [("code", 2, 3, 2.0), ("math", 1, 1, 4.0)]
    assert rows[1].ci95 == (4.0, 4.0)                    # one prompt: the interval is the point


def test_categories_survive_report_json():
    e = evaluation([PromptRounds("a", (2, 1), (5, 8), "code"), PromptRounds("c", (3,), (4,), "math")])
    e = Evaluation(**{**e.__dict__, "by_category": by_category(e.per_prompt, seed=0, n_boot=100)})
    back = Evaluation.from_json(e.to_json())
    assert [p.category for p in back.per_prompt] == ["code", "math"] and back.by_category == e.by_category
    old = {k: v for k, v in e.to_json().items() if k not in ("rendering", "by_category")}
    old["axes"].pop("rendering")
    for p in old["per_prompt"]:
        p.pop("category")
    legacy = Evaluation.from_json(old)                   # a 2.0 report: rendering auto, no categories
    assert legacy.axes.rendering == "auto" and legacy.key == e.key and legacy.by_category == ()


# ---- shared by the diagnoses' tests (tests/diagnoses/) -------------------------------------

def _pass(seqs: list[list[int]], prompt_len: int, cats=None) -> TargetPass:
    """A greedy pass: argmax[j] = t_{j+1} (the sequence's own next token), last one repeated."""
    cats = cats or ["c"] * len(seqs)
    sequences = [Sequence(f"p{i}", cats[i], prompt_len, torch.tensor(s)) for i, s in enumerate(seqs)]
    argmax = [torch.tensor(s[1:] + s[-1:]) for s in seqs]
    return TargetPass("as-loaded", sequences, {}, argmax)


# ---- long context -------------------------------------------------------------------------

def test_rung_lengths_worked_example():
    assert rung_lengths(1024, 64, 4) == [16, 320, 640, 960]


def test_ladder_cuts_prompts_of_each_length(tmp_path):
    import tiny
    from transformers import AutoTokenizer
    tiny.make_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    text = " ".join(f"word{i}" for i in range(400))
    rows = ladder(tok, text, "t.txt", length=200, max_new_tokens=20, rungs=3, per_rung=2)
    assert [(pid, len(ids)) for pid, _, ids in rows] == \
        [("long-16-0", 16), ("long-16-1", 16), ("long-90-0", 90), ("long-90-1", 90), ("long-180-0", 180),
         ("long-180-1", 180)]
    assert rows[0][2] != rows[1][2]                      # other offsets of the text
    with pytest.raises(DiagError, match="too short") as err:
        ladder(tok, "word " * 10, "t.txt", length=200, max_new_tokens=20, rungs=3, per_rung=2)
    assert err.value.file == "t.txt"


def test_long_context_marks_rungs_below_half_of_the_short_one():
    e = evaluation([PromptRounds("long-16-0", (2, 2, 2)), PromptRounds("long-500-0", (1, 1, 0)),
                    PromptRounds("long-900-0", (0, 1, 0, 0))])
    sec = long_context_section(e, length=1000, source="t.txt", seed=0, n_boot=100)
    assert [r["accepted_drafts"] for r in sec["rungs"]] == pytest.approx([2.0, 2 / 3, 0.25])
    assert sec["half_of_short"] == 1.0
    assert [r["below_half"] for r in sec["rungs"]] == [False, True, True] and sec["falls_below_half_at"] == 500
