"""Tree shapes, presets, derivations from parents (SGLang's flag rules: test_tree_rules.py)."""

import pytest
import torch
from hypothesis import given, strategies as st

from diag.errors import DiagError
from diag.trees import PRESETS, TreeShape, ancestor_mask, depths, positions, tree_shape


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


def _depths_by_rounds(parents):
    """The definition, D rounds of a gather: d <- d[parent] + 1 where there is a parent, else 0."""
    d = torch.zeros_like(parents)
    for _ in range(parents.shape[-1]):
        d = torch.where(parents >= 0, d.gather(-1, parents.clamp(min=0)) + 1, torch.zeros_like(d))
    return d


def _ancestors_by_rounds(parents):
    """The definition, D rounds: row i = i, then row parent(i) where i has one."""
    D = parents.shape[-1]
    eye = torch.eye(D, dtype=torch.bool)
    mask = eye.expand(*parents.shape, D).clone()
    idx = parents.clamp(min=0)[..., None].expand(*parents.shape, D)
    for _ in range(D):
        mask = eye | ((parents >= 0)[..., None] & mask.gather(-2, idx))
    return mask


@given(st.integers(1, 40).flatmap(lambda d: st.lists(st.lists(st.integers(-1, d - 1), min_size=d, max_size=d),
                                                     min_size=1, max_size=4)))
def test_reach_by_squaring_is_the_rounds_definition_for_any_parents(rows):
    """trees.reach squares the one-step relation log2(D) times (inside the verify's graph, a few
    kernels, not D rounds of gathers); ancestor_mask and depths read it. Equal to the D-round
    definitions on any parents: trees, forests, self-loops and cycles (junk parents: depth D).
    Example: parents [1, 0] (a cycle) -> depths [2, 2]; [-1, 0, 0, 1] -> [0, 1, 1, 2]."""
    parents = torch.tensor(rows)
    assert torch.equal(ancestor_mask(parents), _ancestors_by_rounds(parents))
    assert torch.equal(depths(parents), _depths_by_rounds(parents))
    assert depths(torch.tensor([1, 0])).tolist() == [2, 2]
