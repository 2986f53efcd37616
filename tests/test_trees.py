"""Tree shapes, presets, SGLang flag resolution, derivations from parents."""

import pytest
import torch
from hypothesis import given, strategies as st

from diag.errors import DiagError
from diag.trees import (PRESETS, TreeShape, ancestor_mask, depths, grid, positions,
                        resolve_sglang_shape, tree_shape)


def test_names_and_candidates():
    assert TreeShape(3, 1, 4).name == "chain-3"
    assert TreeShape(3, 4, 5).name == "s3-k4-d5"
    assert TreeShape(3, 4, 5).num_candidates == 4 + 2 * 16
    assert TreeShape(5, 1, 6).num_candidates == 5
    assert PRESETS["s3-k1-d4"] == PRESETS["chain-3"]
    assert PRESETS["s5-k4-d8"] == TreeShape(5, 4, 8)


def test_parse():
    assert tree_shape("chain-2") == TreeShape(2, 1, 3)
    assert tree_shape(" S3-K4-D8 ") == TreeShape(3, 4, 8)
    assert tree_shape("sglang-llama-default") == TreeShape(5, 4, 8)
    for bad in ["chain-0", "s3-k4", "tree", "s0-k1-d2"]:
        with pytest.raises(DiagError):
            tree_shape(bad)


def test_resolve_seed_example_topk1_rewrite():
    r = resolve_sglang_shape(1, 1, 16)
    assert r.shape == TreeShape(1, 1, 2) and r.crash is None
    assert "16" in r.notes[0] and "num_steps + 1" in r.notes[0]


def test_resolve_auto_defaults_and_partial_flags():
    assert resolve_sglang_shape(None, None, None, "llama").shape == TreeShape(5, 4, 8)
    assert resolve_sglang_shape(None, None, None, "deepseek").shape == TreeShape(3, 1, 4)
    for flags in [(None, 4, 8), (None, None, 8), (3, None, 8), (3, 4, None)]:
        r = resolve_sglang_shape(*flags)
        assert r.crash is not None and r.shape is None, flags
    assert "AssertionError" in resolve_sglang_shape(None, 1, None).crash
    # S and topk=1 given: the topk=1 rule fills D, SGLang runs
    assert resolve_sglang_shape(4, 1, None).shape == TreeShape(4, 1, 5)
    with pytest.raises(DiagError):
        resolve_sglang_shape(None, None, None, "mystery")


def test_resolve_too_many_draft_tokens():
    r = resolve_sglang_shape(2, 2, 8)  # 7 slots > 2 + 4 candidates
    assert r.shape == TreeShape(2, 2, 8)
    assert "out of range" in r.crash and r.notes


def test_grid_rewrites_and_dedups():
    shapes, rewritten = grid([3], [1, 4], [4, 8])
    assert [s.name for s in shapes] == ["chain-3", "s3-k4-d4", "s3-k4-d8"]
    assert rewritten == [((3, 1, 8), TreeShape(3, 1, 4))]


def test_derivations_golden():
    par = torch.tensor([-1, 0, 0, 1])
    assert depths(par).tolist() == [0, 1, 1, 2]
    assert positions(par, 7).tolist() == [7, 8, 8, 9]
    assert positions(par.expand(2, 4), torch.tensor([7, 20])).tolist() == [[7, 8, 8, 9],
                                                                             [20, 21, 21, 22]]
    assert ancestor_mask(par).tolist() == [[True, False, False, False],
                                           [True, True, False, False],
                                           [True, False, True, False],
                                           [True, True, False, True]]


@st.composite
def parent_arrays(draw):
    n = draw(st.integers(1, 12))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]


@given(parent_arrays())
def test_derivations_agree_with_walk(par_list):
    par = torch.tensor(par_list)
    d, m = depths(par), ancestor_mask(par)
    for i in range(len(par_list)):
        chain, j = {i}, i
        while par_list[j] >= 0:
            j = par_list[j]
            chain.add(j)
        assert d[i] == len(chain) - 1
        assert set(torch.nonzero(m[i]).flatten().tolist()) == chain
    assert (m.sum(-1) == d + 1).all()
