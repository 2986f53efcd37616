"""diag's draft trees and greedy verification against SGLang's own code, every known version.

SGLang side (tests/sglang_chain.py): the version's select_top_k_tokens ->
organize_draft_results -> build_tree_kernel_efficient -> verify_tree_greedy_func, Triton
kernels interpreted on the CPU. diag side: drafter.tree_build first_step / expand_step /
finalize and replay.verify.accepted_path on the same draft distributions. Compared: the
tree (tokens, parents, positions = prefix + depth) and the accepted path and count.

Inputs: SGLang's golden vectors (tests/sglang_golden.py), a hand-made tree, and 112 random
trees per version (7 shapes x 16). Versions whose chain is the same code (the same source
text of every definition run, `Chain.code_key`) share one SGLang run of the random trees.
"""

from __future__ import annotations

import pytest
import torch

import sglang_chain as C
import sglang_golden as G
import sglang_wheels as wheels
from diag.drafter.tree_build import Beam, DraftTree, expand_step, finalize, first_step
from diag.engines.sglang.versions import RELEASES
from diag.replay.verify import accepted_path
from diag.trees import PAD, depths

pytestmark = pytest.mark.sglang

SHAPES = [(2, 2, 4), (3, 2, 6), (3, 4, 8), (4, 3, 10), (5, 4, 8), (3, 1, 4), (2, 4, 12)]   # (S, K, D)
TREES_PER_SHAPE = 16
VOCAB = 48


@pytest.fixture(scope="module", autouse=True)
def _wheels():
    wheels.fetch_all(RELEASES)


# ---- diag's view of SGLang's draft lists -------------------------------------------------

def history_from_lists(score_list, token_list, parents_list, topk: int) -> list[Beam]:
    """SGLang's per-step (scores, tokens, parents) as diag Beams (only the candidate fields
    finalize reads). Candidate c of step s >= 1 at beam row r, column j: parent =
    parents_list[s-1][r] (for s = 1 the step-0 node r), i.e. SGLang's parent_list[c // K]."""
    out = []
    for s, (sc, tok) in enumerate(zip(score_list, token_list)):
        P = sc.shape[0]
        if s == 0:
            parent = torch.full((P, topk), -1, dtype=torch.long)
        else:
            rows = parents_list[s - 1][:, 1:] if s == 1 else parents_list[s - 1]    # [P, K]
            parent = rows.repeat_interleave(topk, dim=-1)                          # [P, K*K]
        flat = sc.reshape(P, -1)
        z = torch.zeros(P, topk, dtype=torch.long)
        out.append(Beam(s, z, z.float(), z, z, tok.long(), flat.float(), parent))
    return out


def sglang_tree(positions, r_next, r_sib, draft_tokens, seq_lens) -> tuple:
    P, D = r_next.shape
    parents = C.parents_from_links(r_next, r_sib)
    return parents, draft_tokens.view(P, D).long(), positions.view(P, D) - seq_lens[:, None]


def assert_same_tree(tree: DraftTree, parents, tokens, depth):
    assert torch.equal(tree.parents, parents)
    assert torch.equal(tree.tokens, tokens)
    assert torch.equal(tree.depths, depth)
    assert torch.equal(depths(tree.parents), depth)
    assert bool(tree.valid.all())


# ---- golden vectors ------------------------------------------------------------------------

@pytest.mark.parametrize("version", RELEASES)
def test_golden_build_tree(version):
    ch = C.chain(version)
    B = G.BUILD
    positions, r_index, r_next, r_sib, draft_tokens = C.build(
        ch, B["score_list"], B["token_list"], B["parents_list"], B["bonus"], B["seq_lens"],
        B["topk"], B["depth"], B["num_draft_token"])
    assert positions.tolist() == B["positions"]
    assert r_index.tolist() == B["retrieve_index"]
    assert r_next.tolist() == B["retrieve_next_token"]
    assert r_sib.tolist() == B["retrieve_next_sibling"]
    assert draft_tokens.tolist() == B["draft_tokens"]
    hist = history_from_lists(B["score_list"], B["token_list"], B["parents_list"], B["topk"])
    tree = finalize(hist, B["num_draft_token"], root_tokens=B["bonus"].long())
    assert_same_tree(tree, *sglang_tree(positions, r_next, r_sib, draft_tokens, B["seq_lens"]))


def _diag_tree_from_links(candidates, r_next, r_sib) -> DraftTree:
    parents = C.parents_from_links(r_next, r_sib)
    d = depths(parents)
    return DraftTree(candidates.long(), parents, d, torch.ones_like(parents, dtype=torch.bool),
                     torch.ones_like(parents, dtype=torch.float32))


def _continuation(target_predict, accept_index, steps):
    """target_next for diag: the target's predictions along SGLang's accepted path, which is
    what a greedy continuation is (then PAD past the path's bonus token)."""
    P, D = target_predict.shape
    out = torch.full((P, steps), PAD, dtype=torch.long)
    flat = target_predict.reshape(-1)
    for p in range(P):
        path = [int(i) for i in accept_index[p] if int(i) >= 0]
        for d, node in enumerate(path[:steps]):
            out[p, d] = flat[node]
    return out


@pytest.mark.parametrize("version", RELEASES)
def test_golden_verify_tree_greedy(version):
    ch = C.chain(version)
    V = G.VERIFY
    steps = V["num_spec_step"] - 1
    predicts, accept_index, accept_num = C.verify(
        ch, V["candidates"], V["retrieve_index"], V["retrieve_next_token"], V["retrieve_next_sibling"],
        V["target_predict"], steps)
    assert predicts.tolist() == V["predicts"]
    assert accept_index.tolist() == V["accept_index"]
    assert accept_num.tolist() == V["accept_token_num"]
    tree = _diag_tree_from_links(V["candidates"], V["retrieve_next_token"], V["retrieve_next_sibling"])
    accepted, path = accepted_path(tree, _continuation(V["target_predict"], accept_index, steps))
    assert accepted.tolist() == V["accept_token_num"]
    base = V["retrieve_index"][:, :1]
    assert torch.equal(torch.where(path >= 0, path + base, -1), accept_index.long())


# ---- random trees --------------------------------------------------------------------------

def _distributions(shape, seed):
    """Draft logits per step: [P, V] then [P*K, V] (row p*K + r after beam row r)."""
    S, K, _ = shape
    g = torch.Generator().manual_seed(seed)
    P = TREES_PER_SHAPE
    return [torch.randn(P if s == 0 else P * K, VOCAB, generator=g) * 2.5 for s in range(S)]


def _target_predict(tree_tokens, tree_parents, steps, seed):
    """A greedy continuation per tree: follow a random node's root path, then diverge; every
    node's prediction is the continuation token at its depth + 1 (what the target's argmax
    after that node's prefix is when the node lies on the continuation)."""
    g = torch.Generator().manual_seed(seed + 1)
    P, D = tree_tokens.shape
    d = depths(tree_parents)
    cont = torch.randint(0, VOCAB, (P, steps + 1), generator=g)
    for p in range(P):
        node = int(torch.randint(0, D, (1,), generator=g))
        while node > 0:
            cont[p, int(d[p, node]) - 1] = tree_tokens[p, node]
            node = int(tree_parents[p, node])
    return cont.gather(1, d), cont[:, :steps]


_RUNS: dict = {}


def _sglang_run(ch, shape, seed):
    """SGLang's chain on one shape's random trees; shared by versions with the same code."""
    key = (ch.code_key, shape, seed)
    if key not in _RUNS:
        S, K, D = shape
        logits = _distributions(shape, seed)
        probs = [torch.softmax(x.float(), -1) for x in logits]
        lists = C.draft(ch, probs, K)
        P = TREES_PER_SHAPE
        seq_lens = torch.arange(P) + 7
        bonus = torch.full((P,), VOCAB + 1, dtype=torch.int32)
        positions, r_index, r_next, r_sib, draft_tokens = C.build(ch, *lists, bonus, seq_lens, K, S, D)
        parents, tokens, depth = sglang_tree(positions, r_next, r_sib, draft_tokens, seq_lens)
        node_predict, cont = _target_predict(tokens, parents, S, seed)
        predicts, accept_index, accept_num = C.verify(ch, tokens, r_index, r_next, r_sib, node_predict, S)
        _RUNS[key] = (logits, parents, tokens, depth, cont, accept_index.clone(), accept_num.clone(), r_index)
    return _RUNS[key]


def _diag_tree(logits, shape):
    S, K, D = shape
    P = TREES_PER_SHAPE
    beam = first_step(torch.log_softmax(logits[0].float(), -1), K)
    history = [beam]
    for x in logits[1:]:
        beam = expand_step(beam, torch.log_softmax(x.float(), -1).view(P, K, -1))
        history.append(beam)
    return finalize(history, D, root_tokens=torch.full((P,), VOCAB + 1))


@pytest.mark.parametrize("version", RELEASES)
def test_random_trees_match_sglang(version):
    ch = C.chain(version)
    checked, accepted_counts = 0, []
    for i, shape in enumerate(SHAPES):
        logits, parents, tokens, depth, cont, accept_index, accept_num, r_index = _sglang_run(ch, shape, 100 + i)
        tree = _diag_tree(logits, shape)
        assert_same_tree(tree, parents, tokens, depth)
        accepted, path = accepted_path(tree, cont)
        assert torch.equal(accepted, accept_num.long()), (version, shape)
        base = r_index[:, :1]
        assert torch.equal(torch.where(path >= 0, path + base, -1), accept_index.long()), (version, shape)
        checked += tree.tokens.shape[0]
        accepted_counts += accepted.tolist()
    assert checked >= 100
    assert min(accepted_counts) == 0 and max(accepted_counts) >= 3   # both ends exercised


def test_hand_made_tree_worked_example():
    """tree_build's docstring example (without its tie) through SGLang 0.5.23's own chain:
    K=2, S=2, D=4; tokens a=0, b=1 at step 0 (probabilities .6, .3), rows a -> c=2 (.55),
    d=3 (.4) and b -> e=4 (.9), f=5 (.1)."""
    ch = C.chain(RELEASES[-1])
    p0 = torch.tensor([[0.6, 0.3, 0.1, 0.0, 0.0, 0.0]])
    p1 = torch.tensor([[0.0, 0.0, 0.55, 0.4, 0.05, 0.0],
                       [0.0, 0.0, 0.0, 0.0, 0.9, 0.1]])
    lists = C.draft(ch, [p0, p1], 2)
    positions, r_index, r_next, r_sib, draft_tokens = C.build(
        ch, *lists, torch.tensor([9], dtype=torch.int32), torch.tensor([7]), 2, 2, 4)
    parents, tokens, depth = sglang_tree(positions, r_next, r_sib, draft_tokens, torch.tensor([7]))
    # candidates a(.6) b(.3) c(.33) d(.24) e(.27) f(.03): best 3 = a, c, b -> sorted [a, b, c]
    assert tokens.tolist() == [[9, 0, 1, 2]] and parents.tolist() == [[-1, 0, 0, 1]]
    assert positions.tolist() == [7, 8, 8, 9]
    beam = first_step(p0.log(), 2)
    tree = finalize([beam, expand_step(beam, p1.log().view(1, 2, -1))], 4, root_tokens=torch.tensor([9]))
    assert_same_tree(tree, parents, tokens, depth)
