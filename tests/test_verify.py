"""Greedy verification: chains, trees, the target window convention, trajectories."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from diag.drafter.tree_build import DraftTree, expand_step, finalize, first_step
from diag.metrics import AcceptCounts, accept_length
from diag.trees import PAD
from diag.replay.verify import (accepted_chain, accepted_path, accepted_tree, target_next_windows,
                         trajectory)


def test_accepted_chain_golden():
    draft = torch.tensor([[5, 6, 9], [4, 6, 7], [5, 6, 7], [5, 9, 7]])
    target = torch.tensor([[5, 6, 7]] * 4)
    assert accepted_chain(draft, target).tolist() == [2, 0, 3, 1]


def test_target_windows_convention():
    # target_argmax[j] = t_{j+1}; round at j must match t_{j+2..j+1+S}
    argmax = torch.tensor([11, 12, 13, 14])
    w = target_next_windows(argmax, 2)
    assert w.tolist() == [[12, 13], [13, 14], [14, PAD], [PAD, PAD]]
    # a perfect drafter accepts everything except past the end of the sequence
    assert accepted_chain(w.clamp(min=0), w).tolist() == [2, 2, 1, 0]
    batched = target_next_windows(argmax.expand(3, 4), 2)
    assert batched.shape == (3, 4, 2)


def _tree(tokens, parents, depths, valid=None):
    t = torch.tensor([tokens])
    v = torch.ones_like(t, dtype=torch.bool) if valid is None else torch.tensor([valid])
    return DraftTree(t, torch.tensor([parents]), torch.tensor([depths]), v,
                     torch.ones(t.shape, dtype=torch.float32))


def test_accepted_tree_golden_second_branch():
    tree = _tree([99, 5, 8, 6, 6], [-1, 0, 0, 1, 2], [0, 1, 1, 2, 2])
    acc, path = accepted_path(tree, torch.tensor([[8, 6]]))
    assert acc.tolist() == [2] and path.tolist() == [[0, 2, 4]]
    acc, path = accepted_path(tree, torch.tensor([[5, 7]]))
    assert acc.tolist() == [1] and path.tolist() == [[0, 1, -1]]
    assert accepted_tree(tree, torch.tensor([[3, 6]])).tolist() == [0]


def test_unreachable_nodes_are_never_accepted():
    # node 2 (token 8) is an orphan; node 3 hangs below it
    tree = _tree([99, 5, 8, 6], [-1, 0, -1, -1], [0, 1, 1, 2], [True, True, False, False])
    assert accepted_tree(tree, torch.tensor([[8, 6]])).tolist() == [0]


def test_trajectory_golden():
    assert trajectory([2, 0, 1, 0, 3, 1]).tolist() == [0, 3, 4]
    assert trajectory([0, 0, 0]).tolist() == [0, 1, 2]
    assert trajectory([5, 0], start=1).tolist() == [1]


def _random_dists(seed, P, S, K, V):
    g = torch.Generator().manual_seed(seed)
    first = torch.randn(P, V, generator=g).mul(2).log_softmax(-1)
    later = [torch.randn(P, K, V, generator=g).mul(2).log_softmax(-1) for _ in range(S - 1)]
    return first, later


def _build(first, later, K, D):
    hist = [first_step(first, K)]
    for lp in later:
        hist.append(expand_step(hist[-1], lp))
    return finalize(hist, D)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 3), st.integers(2, 12))
def test_tree_properties(seed, S, K, D):
    P, V = 6, 5
    first, later = _random_dists(seed, P, S, K, V)
    g = torch.Generator().manual_seed(seed + 1)
    target = torch.randint(0, V, (P, S), generator=g)
    small = _build(first, later, K, D)
    big = _build(first, later, K, D + 3)
    a_small, a_big = accepted_tree(small, target), accepted_tree(big, target)
    assert (a_small <= S).all() and (a_small >= 0).all()
    assert (a_big >= a_small).all()  # more draft tokens never lose acceptance
    # a target that follows a tree path exactly is accepted to that path's depth
    acc, path = accepted_path(big, target)
    last = path.gather(1, acc[:, None]).squeeze(1)
    assert (big.depths.gather(1, last[:, None]).squeeze(1) == acc).all()


def chain_tree(draft_tokens: torch.Tensor, root_tokens: torch.Tensor | None = None) -> DraftTree:
    """Reference: a topk=1 chain as a DraftTree: draft_tokens [P, S] -> D = S+1 nodes,
    parents [-1, 0, 1, ..., S-1]."""
    P, S = draft_tokens.shape
    dev = draft_tokens.device
    parents = torch.arange(-1, S, device=dev).expand(P, S + 1).clone()
    depths = torch.arange(S + 1, device=dev).expand(P, S + 1).clone()
    tokens = torch.cat([torch.full((P, 1), PAD, dtype=torch.int64, device=dev),
                        draft_tokens.to(torch.int64)], dim=-1)
    if root_tokens is not None:
        tokens[:, 0] = root_tokens
    return DraftTree(tokens, parents, depths, torch.ones(P, S + 1, dtype=torch.bool, device=dev),
                     torch.ones(P, S + 1, dtype=torch.float32, device=dev))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5))
def test_k1_tree_equals_chain(seed, S):
    P, V = 5, 7
    first, later = _random_dists(seed, P, S, 1, V)
    tree = _build(first, later, 1, S + 1)
    # a greedy chain: argmax of each step, fed with the previous argmax
    chain = torch.stack([first.argmax(-1)] + [lp[:, 0].argmax(-1) for lp in later], dim=-1)
    ref = chain_tree(chain)
    assert torch.equal(tree.tokens[:, 1:], ref.tokens[:, 1:])
    assert torch.equal(tree.parents, ref.parents) and torch.equal(tree.depths, ref.depths)
    target = torch.randint(0, V, (P, S), generator=torch.Generator().manual_seed(seed))
    target[::2] = chain[::2]  # half the rows match fully
    assert torch.equal(accepted_tree(tree, target), accepted_chain(chain, target))


@given(st.lists(st.integers(0, 4), min_size=1, max_size=60))
def test_trajectory_accept_length_is_mean_over_visited(a):
    v = trajectory(a).tolist()
    visited = [a[i] for i in v]
    emitted = sum(x + 1 for x in visited)
    # the visited rounds tile the positions from 0 up to the last round's end
    assert emitted == v[-1] + a[v[-1]] + 1
    # diag's accept length over the visited rounds is tokens emitted per verify round
    counts = AcceptCounts.from_accepted(visited, num_steps=4, num_draft_tokens=5)
    assert accept_length(counts) == pytest.approx(emitted / len(visited))
    assert all(v[i + 1] == v[i] + a[v[i]] + 1 for i in range(len(v) - 1))
    assert v[-1] + a[v[-1]] + 1 >= len(a)
