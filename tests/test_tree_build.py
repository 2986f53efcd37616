"""Tree building on hand-made draft distributions: SGLang's selection, order, ties, orphans."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.drafter.tree_build import expand_step, finalize, first_step
from diag.trees import PAD
from diag.trees import TreeShape, ancestor_mask, depths


def dist(V, probs: dict[int, float]) -> torch.Tensor:
    """log-probabilities [V] with the given mass on some tokens, the rest spread thin."""
    p = torch.full((V,), 1e-12, dtype=torch.float64)
    for tok, q in probs.items():
        p[tok] = q
    return (p / p.sum()).log().float()


V = 10


def test_first_and_expand_step_golden():
    b0 = first_step(dist(V, {0: .6, 1: .3, 7: .1})[None], 2)
    assert b0.tokens.tolist() == [[0, 1]] and b0.node.tolist() == [[0, 1]]
    assert b0.cand_parent.tolist() == [[-1, -1]]
    rows = torch.stack([dist(V, {2: .5, 3: .4, 9: .1}), dist(V, {4: .9, 5: .1})])[None]
    b1 = expand_step(b0, rows)
    # expansions e = r*K + c: [.30, .24, .27, .03]; keep e = 0 (c, row 0) then e = 2 (e, row 1)
    assert b1.cand_tokens.tolist() == [[2, 3, 4, 5]]
    assert torch.allclose(b1.cand_scores, torch.tensor([[.30, .24, .27, .03]]), atol=1e-5)
    assert b1.tokens.tolist() == [[2, 4]] and b1.source_row.tolist() == [[0, 1]]
    assert b1.node.tolist() == [[2, 4]]  # candidate index = K + K^2*(step-1) + e
    assert b1.cand_parent.tolist() == [[0, 0, 1, 1]]
    tree = finalize([b0, b1], 5, root_tokens=torch.tensor([8]))
    # best 4 of [.6, .3, .30, .24, .27, .03] = {0, 1, 2, 4}, kept in candidate order
    assert tree.tokens.tolist() == [[8, 0, 1, 2, 4]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 2]]
    assert tree.depths.tolist() == [[0, 1, 1, 2, 2]]
    assert tree.valid.all()
    assert torch.equal(tree.depths, depths(tree.parents))


def test_beam_reorders_rows():
    # row 1 expands better than row 0: the new beam's row 0 comes from old row 1
    b0 = first_step(dist(V, {0: .5, 1: .4})[None], 2)
    rows = torch.stack([dist(V, {2: .3, 3: .3}), dist(V, {4: .95, 5: .05})])[None]
    b1 = expand_step(b0, rows)
    assert b1.source_row.tolist() == [[1, 0]]
    assert b1.tokens.tolist() == [[4, 2]]


def test_ties_go_to_lower_index():
    lp = torch.log(torch.tensor([[.25, .5, .25, 0., .0, .0, .0, .0, .0, .0]]))
    assert lp.exp()[0, 0].item() == .25  # exact round trip in float32
    b0 = first_step(lp, 2)
    assert b0.tokens.tolist() == [[1, 0]]  # .25 tie between tokens 0 and 2 -> 0
    # tree tie: candidate 1 (score .25) vs candidate 2 (.5 * .5 = .25): lower index wins
    rows = torch.log(torch.tensor([[.5, .0, .0, .5, 0, 0, 0, 0, 0, 0],
                                   [.0, .0, .0, .0, .5, .5, 0, 0, 0, 0]]))[None]
    b1 = expand_step(b0, rows)
    assert b1.cand_scores[0, 0].item() == .25
    tree = finalize([b0, b1], 3)
    assert tree.tokens[0, 1:].tolist() == [1, 0]  # candidates 0 and 1, not 2
    assert tree.parents.tolist() == [[-1, 0, 0]]


def test_nan_logits_make_orphans():
    # row 0's distribution is NaN: its expansions rank first (as in torch.topk) while
    # their parent (candidate 0) is not selected -> unreachable, as SGLang warns
    b0 = first_step(dist(V, {0: .6, 1: .3})[None], 2)
    rows = torch.stack([torch.full((V,), float("nan")), dist(V, {4: .9, 5: .1})])[None]
    b1 = expand_step(b0, rows)
    tree = finalize([b0, b1], 3)
    assert tree.valid.tolist() == [[True, False, False]]
    assert tree.parents.tolist() == [[-1, -1, -1]]
    assert tree.depths.tolist() == [[0, 2, 2]]  # orphans keep their draft depth


def test_more_slots_than_candidates_pads():
    shape = TreeShape(2, 1, 3)
    b0 = first_step(dist(V, {3: .7})[None], 1)
    b1 = expand_step(b0, dist(V, {6: .8})[None, None])
    tree = finalize([b0, b1], shape.num_candidates + 3)  # D - 1 = 4 > 2 candidates
    assert tree.tokens.tolist() == [[PAD, 3, 6, PAD, PAD]]
    assert tree.valid.tolist() == [[True, True, True, False, False]]
    assert tree.parents.tolist() == [[-1, 0, 1, -1, -1]]


def test_token_map_applies_after_topk():
    d2t_table = torch.arange(V) + 100  # draft id d -> target id d + 100
    b0 = first_step(dist(V, {2: .9})[None], 1, token_map=d2t_table)
    assert b0.tokens.tolist() == [[102]]


def test_batched_positions_independent():
    a = dist(V, {0: .6, 1: .3})
    b = dist(V, {5: .8, 6: .15})
    b0 = first_step(torch.stack([a, b]), 2)
    assert b0.tokens.tolist() == [[0, 1], [5, 6]]
    rows = torch.stack([torch.stack([dist(V, {2: .9}), dist(V, {3: .9})])] * 2)
    tree = finalize([b0, expand_step(b0, rows)], 4)
    assert tree.tokens[:, 1:].tolist() == [[0, 1, 2], [5, 6, 2]]
    m = ancestor_mask(tree.parents)
    assert m[0, 3].tolist() == [True, True, False, True]


def test_source_rows_follow_the_best_expansions():
    """The carried hidden state follows source_row (SGLang reorders it; its draft KV stays
    per row, diag/drafter/model.py)."""
    K = 2
    b0 = first_step(dist(V, {0: .6, 1: .4})[None], K)
    # step 1: expansions [.30, .30, .36, .04] -> keep row 1's .36, then row 0's .30
    b1 = expand_step(b0, torch.stack([dist(V, {2: .5, 3: .5}), dist(V, {4: .9, 5: .1})])[None])
    # step 2: [.18, .18, .15, .15] -> both kept rows expand step-1 row 0
    b2 = expand_step(b1, torch.stack([dist(V, {6: .5, 7: .5}), dist(V, {8: .5, 9: .5})])[None])
    assert b1.source_row.tolist() == [[1, 0]] and b2.source_row.tolist() == [[0, 0]]


@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 10_000), st.sampled_from([3, 1000]))
@settings(max_examples=80, deadline=None)
def test_top_equals_stable_sort(k, width, seed, levels):
    """_top (one topk over value-then-index keys) equals a full stable descending sort, ties to
    the lower index, NaN first (tied with +inf), -0.0 tied with 0.0, on values of both signs
    drawn from few levels (ties common) or many (ties rare)."""
    from diag.drafter.tree_build import _top
    k = min(k, width)
    g = torch.Generator().manual_seed(seed)
    vals = (torch.randint(-levels, levels, (4, 3, width), generator=g).float() / levels) ** 3 * 7
    vals[torch.rand(4, 3, width, generator=g) < 0.1] = float("nan")
    vals[torch.rand(4, 3, width, generator=g) < 0.05] = -0.0
    vals[torch.rand(4, 3, width, generator=g) < 0.05] = float("inf")
    key = torch.where(torch.isnan(vals), torch.full_like(vals, float("inf")), vals)
    ref = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :k]
    got_vals, got = _top(vals, k)
    assert torch.equal(got, ref)
    assert torch.equal(got_vals.isnan(), vals.gather(-1, ref).isnan())


def test_top_worked_examples():
    """_top's docstring: [.2, .5, .1, .3], k 2 -> values [.5, .3] at [1, 3]; [.2, .5, .2, .2], k 2
    -> [.5, .2] at [1, 0] (the lowest index of the tied three); _sortable orders both signs and
    ties -0.0 with 0.0."""
    from diag.drafter.tree_build import _sortable, _top
    v, i = _top(torch.tensor([0.2, 0.5, 0.1, 0.3]), 2)
    assert i.tolist() == [1, 3] and torch.equal(v, torch.tensor([0.5, 0.3]))
    v, i = _top(torch.tensor([0.2, 0.5, 0.2, 0.2]), 2)
    assert i.tolist() == [1, 0] and torch.equal(v, torch.tensor([0.5, 0.2]))
    keys = _sortable(torch.tensor([-2.0, -1.0, -0.0, 0.0, 1.0, float("nan")])).tolist()
    assert keys[0] < keys[1] < keys[2] == keys[3] < keys[4] < keys[5]
