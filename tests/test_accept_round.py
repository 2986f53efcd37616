"""The decode loop's fast paths compute what the plain ones do: the accept step with
probabilities only where the walk reads them, the accept step on fixed shapes that asks the host
nothing (a CUDA graph's), numpy's sort for the top-p pivot, and the shortest-prompt-first batches."""

import pytest
import torch

from diag.engines.decoding import GREEDY, sampled
from diag.replay.accept import accept_dense, accept_round, probabilities
from diag.replay.sampling import _ascending, renorm_top_p, target_kept, target_probs
from diag.replay.verifiers import sampled_rule
from diag.run.sampled import _batches
from diag.trees import tree_shape

TREE = ([-1, 0, 0, 1, 1, 2, 3, 3], [0, 1, 1, 2, 2, 2, 3, 3])     # parents, depths: 3 steps, 8 nodes
CHAIN = ([-1, 0, 1, 2], [0, 1, 2, 3])


def _round(parents, depths, B, V, g, invalid_tail=False):
    D = len(parents)
    par = torch.tensor(parents).expand(B, D).clone()
    dep = torch.tensor(depths).expand(B, D).clone()
    valid = torch.ones(B, D, dtype=torch.bool)
    if invalid_tail:                                   # some rows lose their last node: padding
        cut = torch.rand(B, generator=g) < 0.5
        valid[cut, -1] = False
        par[cut, -1] = -1
        dep[cut, -1] = 0
    logits = torch.randn(B, D, V, generator=g) * 6
    # drafts the target likes half of the time, so walks go deep and end on leaves too
    best = logits.argmax(-1)
    tokens = torch.randint(0, V, (B, D), generator=g)
    like = torch.rand(B, D, generator=g) < 0.9
    at_parent = best.gather(1, par.clamp(min=0))
    tokens = torch.where(like, at_parent, tokens)
    t = {"tokens": tokens, "parents": par, "valid": valid, "depths": dep}
    return t, logits, torch.rand(B, D + 1, generator=g)


@pytest.mark.parametrize("rule_name,shape", [("tree-target-only", TREE), ("tree-target-only", CHAIN),
                                             ("chain-rejection", CHAIN)])
@pytest.mark.parametrize("decoding", [sampled(1.0, 0.95), sampled(0.7, 1.0, top_k=20), GREEDY])
def test_accept_round_equals_the_rule_on_every_nodes_probabilities(rule_name, shape, decoding):
    g = torch.Generator().manual_seed(3)
    rule = sampled_rule(rule_name)
    t, logits, coins = _round(*shape, B=64, V=50, g=g, invalid_tail=rule_name != "chain-rejection")
    S = max(shape[1])
    res, exp = accept_round(rule, t, logits, decoding, coins, S)
    probs = probabilities(logits, decoding)
    ts, ta = (1.0, 1.0) if decoding.greedy else (decoding.threshold_single, decoding.threshold_acc)
    want = rule.verify(t["tokens"], t["parents"], t["valid"], probs, coins[:, :-1], coins[:, -1], S,
                       threshold_single=ts, threshold_acc=ta)
    want_exp = rule.expected(t["tokens"], t["parents"], t["valid"], probs, t["depths"], S,
                             threshold_single=ts, threshold_acc=ta)
    assert torch.equal(res.accepted, want.accepted) and torch.equal(res.path, want.path)
    assert torch.equal(res.bonus, want.bonus)
    assert torch.equal(exp, want_exp)
    last = want.path.gather(1, want.accepted[:, None])[:, 0]
    ends_on_leaf = ~(t["parents"] == last[:, None]).any(-1)
    assert 0 < int(ends_on_leaf.sum()) < len(last)     # both kinds of rows: a leaf's distribution computed


DECODINGS = [sampled(1.0, 0.95), sampled(0.7, 0.8, top_k=20), GREEDY]
THRESHOLDS = sampled(1.0, 0.95, threshold_single=0.5, threshold_acc=0.6)      # vLLM's chain rule has none


@pytest.mark.parametrize("rule_name,shape,decoding",
                         [("tree-target-only", TREE, d) for d in DECODINGS + [THRESHOLDS]] +
                         [("chain-rejection", CHAIN, d) for d in DECODINGS])
def test_the_accept_on_fixed_shapes_decides_what_accept_round_decides(rule_name, shape, decoding):
    """accept_dense (every node through the head: the shapes of a CUDA graph) gives accept_round's
    walks, bonuses and exact expectation, unsynced (the graph's: ok True, nothing read on the
    host; on 5000 ids the pivot is looked for among the 256 largest) or not."""
    g = torch.Generator().manual_seed(11)
    rule = sampled_rule(rule_name)
    t, logits, coins = _round(*shape, B=48, V=5000, g=g, invalid_tail=rule_name != "chain-rejection")
    S = max(shape[1])
    want, want_exp = accept_round(rule, t, logits, decoding, coins, S)
    for unsynced in (False, True):
        res, exp, ok = accept_dense(rule, t, logits, decoding, coins, S, unsynced=unsynced)
        assert torch.equal(res.accepted, want.accepted) and torch.equal(res.path, want.path)
        assert torch.equal(res.bonus, want.bonus) and torch.equal(exp, want_exp)
        assert (ok is None) if not unsynced else bool(ok)
    assert 0 < int(want.accepted.sum()) < S * len(want.accepted)


@pytest.mark.parametrize("decoding", DECODINGS + [THRESHOLDS])
def test_the_accept_on_fixed_shapes_reads_a_bf16_heads_logits_as_their_float32_widening(decoding):
    """accept_dense keeps a bf16 head's logits in bf16 (NodeLogits.rows(native=True)): the
    softmax widens them exactly and the top-p window ranks the ids by them, so every decision is
    the float32 logits' (logits rounded to bf16 first, so both hold the same numbers; on 5000 ids
    the window's top-k runs, on bf16 keys)."""
    g = torch.Generator().manual_seed(5)
    rule = sampled_rule("tree-target-only")
    t, logits, coins = _round(*TREE, B=48, V=5000, g=g, invalid_tail=True)
    half = logits.to(torch.bfloat16)
    S = max(TREE[1])
    for unsynced in (False, True):
        want, want_exp, want_ok = accept_dense(rule, t, half.float(), decoding, coins, S, unsynced=unsynced)
        res, exp, ok = accept_dense(rule, t, half, decoding, coins, S, unsynced=unsynced)
        assert torch.equal(res.accepted, want.accepted) and torch.equal(res.path, want.path)
        assert torch.equal(res.bonus, want.bonus) and torch.equal(exp, want_exp)
        assert (ok is None) == (want_ok is None) and (ok is None or bool(ok) == bool(want_ok))
    assert 0 < int(want.accepted.sum()) < S * len(want.accepted)


def test_node_logits_native_rows_are_the_heads_dtype_and_widen_to_the_float32_rows():
    from diag.target.tree_forward import NodeLogits

    head = torch.nn.Linear(16, 300, bias=False).to(torch.bfloat16)
    model = type("M", (torch.nn.Module,), {"get_output_embeddings": lambda self: head})()
    final = torch.randn(3, 4, 16).to(torch.bfloat16)
    nodes = NodeLogits(model, final)
    flat = torch.tensor([0, 5, 11])
    native, wide = nodes.rows(flat, native=True), nodes.rows(flat)
    assert native.dtype == torch.bfloat16 and wide.dtype == torch.float32
    assert torch.equal(native.float(), wide)


def test_unsynced_probabilities_sort_a_fixed_number_of_flat_rows_and_say_when_more_were():
    """target_kept unsynced: where every row's top-p pivot lies among the 256 largest of 5000 ids,
    target_probs' own probabilities and ok True; flat rows (their pivot deep among the 5000) are
    sorted whole up to DEEPER_MIN of them (still target_probs' own, ok True); past that, ok False,
    and only the flat rows left over differ from target_probs' (what the caller then recomputes)."""
    from diag.replay.sampling import DEEPER_MIN
    g = torch.Generator().manual_seed(2)
    peaked = torch.randn(24, 5000, generator=g) * 8
    d = sampled(1.0, 0.95)
    kept, ok = target_kept(peaked, d, unsynced=True)
    assert bool(ok) and torch.equal(kept.whole(), target_probs(peaked, d))
    for flat in (3, DEEPER_MIN, DEEPER_MIN + 4):
        mixed = peaked.clone()
        mixed[:2 * flat:2] = torch.randn(flat, 5000, generator=g) * 0.01     # nearly flat: 95% takes ~4750 ids
        kept, ok = target_kept(mixed, d, unsynced=True)
        p, want = kept.whole(), target_probs(mixed, d)
        assert int((want[0] > 0).sum()) > 4000
        same = [torch.equal(p[i], want[i]) for i in range(24)]
        assert bool(ok) == (flat <= DEEPER_MIN) and sum(same) == 24 - max(0, flat - DEEPER_MIN)
    kept, ok = target_kept(mixed, sampled(1.0, 1.0), unsynced=True)          # no top-p: nothing to search
    assert bool(ok) and torch.equal(kept.whole(), target_probs(mixed, sampled(1.0, 1.0)))


def test_accept_round_with_thresholds():
    g = torch.Generator().manual_seed(5)
    rule = sampled_rule("tree-target-only")
    dec = sampled(1.0, 0.95, threshold_single=0.5, threshold_acc=0.6)
    t, logits, coins = _round(*TREE, B=64, V=40, g=g)
    res, exp = accept_round(rule, t, logits, dec, coins, 3)
    probs = probabilities(logits, dec)
    want = rule.verify(t["tokens"], t["parents"], t["valid"], probs, coins[:, :-1], coins[:, -1], 3,
                       threshold_single=0.5, threshold_acc=0.6)
    assert torch.equal(res.bonus, want.bonus) and torch.equal(res.path, want.path)
    assert torch.equal(exp, rule.expected(t["tokens"], t["parents"], t["valid"], probs, t["depths"], 3,
                                          threshold_single=0.5, threshold_acc=0.6))


def test_numpy_sort_gives_torch_sorts_values_and_the_same_pivot():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(300, 2048, generator=g) * 2, -1)
    p[0] = 1 / 2048                                      # all tied
    p[1, :1000] = 0.0                                    # zeros
    assert torch.equal(_ascending(p), torch.sort(p, dim=-1).values)
    kept = renorm_top_p(p, 0.95)
    asc = torch.sort(p, dim=-1).values
    cut = torch.searchsorted(torch.cumsum(asc, -1).contiguous(), torch.full((300, 1), 1 - 0.95),
                             right=False).clamp(max=2047)
    pivot = asc.gather(-1, cut)
    ref = torch.where(p >= pivot, p, torch.zeros_like(p))
    assert torch.equal(kept > 0, ref > 0)                             # the same pivot: the same ids kept
    torch.testing.assert_close(kept, ref / ref.sum(-1, keepdim=True), rtol=1e-6, atol=0)   # mass: summed in order


def test_batches_go_shortest_prompt_first_with_every_lane_of_a_prompt_together():
    lens = [300, 40, 40, 300]                            # prompts 1, 2 short; 0, 3 long
    rows = [(li, p) for li in range(75) for p in range(4)]
    shape = tree_shape("chain-3")                        # D 4: a row costs len + 64 + 8 tokens
    out = _batches(rows, lens, shape, 64, 16384)
    flat = [r for b in out for r in b]
    assert sorted(flat) == sorted(rows)
    assert [lens[p] for _, p in flat] == sorted(lens[p] for _, p in flat)
    for b in out:
        assert len(b) * (max(lens[p] for _, p in b) + 64 + 8) <= 16384
    # 150 short rows: 146 fit (16384 // 112); 4 short + 40 long (16384 // 372 = 44), then 44, 44, 22 long
    assert [len(b) for b in out] == [146, 44, 44, 44, 22]
    firsts = [flat.index((li, 1)) for li in range(75)]
    assert firsts == sorted(firsts) and max(firsts) - min(firsts) == 74     # prompt 1's lanes in a run
