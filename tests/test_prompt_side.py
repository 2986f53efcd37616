"""The prompt-side measurements on hand-made data (issue 14.2-14.5): acceptance per category,
and the hand-made passes and evaluations the diagnoses' tests share (tests/diagnoses/: coverage,
loops, long context)."""

import torch

from diag.replay.categories import by_category
from diag.replay.evaluation import Axes, Evaluation, PromptRounds
from diag.metrics import AcceptCounts
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
