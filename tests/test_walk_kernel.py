"""The sampled walk and its bonus against SGLang 0.5.23's kernel read line by line
(kernels/jit/include/sgl_kernel/speculative/sampling.cuh, TreeSpeculativeSamplingTargetOnly),
transliterated here to scalar Python, one request at a time: the siblings walked through
retrive_next_sibling in index order, prob_acc in float32, a rejected child's target probability
*written* into draft_probs at its parent's row (so a token drafted twice is removed once, whole),
no exclusion loaded when the walk reached the last depth, and the bonus drawn from
relu(q - p) by DeviceSamplingFromProb (the first index whose running sum exceeds coin x total,
else the last index with mass, else V - 1). The kernel is CUDA; its rules are executed here.
Both of diag's paths are held to it: the rule on every node's distributions and the decode
loop's accept step, which computes distributions only where they are read."""

import numpy as np
import pytest
import torch

from diag.engines.decoding import sampled
from diag.replay.accept import accept_round, probabilities
from diag.replay.verifiers import sampled_rule


def kernel_row(tokens, parents, valid, probs, coins, final_coin, num_steps, ts, ta):
    """One request (block bx) of TreeSpeculativeSamplingTargetOnly -> (accepted nodes, bonus)."""
    D, V = probs.shape
    children = [[c for c in range(D) if valid[c] and parents[c] == i] for i in range(D)]
    draft_probs = np.zeros((D, V), dtype=np.float32)
    f32 = np.float32
    prob_acc, coin, cur, path = f32(0), f32(coins[0]), 0, [0]
    for _ in range(1, num_steps + 1):
        took = None
        for c in children[cur]:                               # retrive_next_token, then _sibling
            p = f32(probs[cur, tokens[c]])
            prob_acc = f32(prob_acc + p)
            if p > 0 and (coin < f32(prob_acc / f32(ta)) or p >= f32(ts)):
                prob_acc, coin, took = f32(0), f32(coins[c]), c
                break
            draft_probs[cur, tokens[c]] = p                     # written, not added
        if took is None:
            break
        path.append(took)
        cur = took
    q = probs[cur].astype(np.float32)
    p = draft_probs[cur] if len(path) - 1 != num_steps else np.zeros(V, dtype=np.float32)
    relu = np.maximum(q - p, 0).astype(np.float32)
    u = f32(final_coin) * relu.sum(dtype=np.float32)
    run = np.cumsum(relu, dtype=np.float32)
    above = np.nonzero(run > u)[0]
    if len(above):
        bonus = int(above[0])
    else:
        mass = np.nonzero(relu > 0)[0]
        bonus = int(mass[-1]) if len(mass) else V - 1
    return path, bonus


def random_trees(B, D, S, V, g):
    """Trees in SGLang's order (a parent before its children, depth <= S), children often
    drafting the same token twice, tokens the target likes more than chance."""
    parents = torch.full((B, D), -1, dtype=torch.long)
    depth = torch.zeros(B, D, dtype=torch.long)
    for b in range(B):
        for i in range(1, D):
            cands = [j for j in range(i) if depth[b, j] < S]
            parents[b, i] = cands[int(torch.randint(len(cands), (1,), generator=g))]
            depth[b, i] = depth[b, parents[b, i]] + 1
    valid = torch.ones(B, D, dtype=torch.bool)
    cut = torch.rand(B, generator=g) < 0.3                     # a padded tail: the last node invalid
    valid[cut, -1] = False
    parents[cut, -1] = -1
    depth[cut, -1] = 0
    logits = torch.randn(B, D, V, generator=g) * 3
    best = logits.topk(3, -1).indices                          # [B, D, 3]
    pick = torch.randint(0, 3, (B, D, 1), generator=g)
    liked = best.gather(-1, pick)[..., 0].gather(1, parents.clamp(min=0))
    tokens = torch.where(torch.rand(B, D, generator=g) < 0.85, liked, torch.randint(0, V, (B, D), generator=g))
    return {"tokens": tokens, "parents": parents, "valid": valid, "depths": depth}, logits


@pytest.mark.parametrize("decoding", [sampled(1.0, 0.95), sampled(0.8, 1.0, top_k=5),
                                      sampled(1.0, 0.9, threshold_single=0.4, threshold_acc=0.7)],
                         ids=["T1-top-p", "top-k", "thresholds"])
def test_the_walk_and_its_bonus_are_sglangs_kernel(decoding):
    g = torch.Generator().manual_seed(11)
    B, D, S, V = 300, 8, 3, 40
    t, logits = random_trees(B, D, S, V, g)
    coins = torch.rand(B, D + 1, generator=g)
    probs = probabilities(logits, decoding)
    ts, ta = decoding.threshold_single, decoding.threshold_acc
    rule = sampled_rule("tree-target-only")
    full = rule.verify(t["tokens"], t["parents"], t["valid"], probs, coins[:, :D], coins[:, D], S,
                       threshold_single=ts, threshold_acc=ta)
    fast, _ = accept_round(rule, t, logits, decoding, coins, S)
    kinds = {"deep": 0, "leaf": 0, "excluded": 0, "duplicate": 0}
    for b in range(B):
        path, bonus = kernel_row(t["tokens"][b].tolist(), t["parents"][b].tolist(), t["valid"][b].tolist(),
                                 probs[b].numpy(), coins[b, :D].numpy(), float(coins[b, D]), S, ts, ta)
        want = path + [-1] * (S + 1 - len(path))
        for got in (full, fast):
            assert got.path[b].tolist() == want and int(got.accepted[b]) == len(path) - 1, b
            assert int(got.bonus[b]) == bonus, b
        kids = [c for c in range(D) if t["valid"][b, c] and t["parents"][b, c] == path[-1]]
        kinds["deep"] += len(path) - 1 == S
        kinds["leaf"] += not kids
        kinds["excluded"] += bool(kids)
        toks = [int(t["tokens"][b, c]) for c in kids]
        kinds["duplicate"] += len(toks) != len(set(toks))
    assert all(v > 0 for v in kinds.values()), kinds          # every case of the kernel was reached


def test_the_chain_rule_excludes_the_rejected_draft_only():
    """vLLM's chain rule: the first rejected draft's token is removed from its parent's
    distribution, nothing else; a fully accepted chain draws from the last node untouched."""
    g = torch.Generator().manual_seed(12)
    B, S, V = 400, 3, 30
    tokens = torch.randint(0, 6, (B, S + 1), generator=g)              # small ids: drafts repeat
    logits = torch.randn(B, S + 1, V, generator=g)
    logits[..., :6] += 2.5
    dec = sampled(1.0, 1.0)
    probs = probabilities(logits, dec)
    coins = torch.rand(B, S + 2, generator=g)
    rule = sampled_rule("chain-rejection")
    parents = torch.arange(-1, S).expand(B, S + 1)
    t = {"tokens": tokens, "parents": parents, "valid": torch.ones(B, S + 1, dtype=torch.bool),
         "depths": torch.arange(S + 1).expand(B, S + 1)}
    fast, _ = accept_round(rule, t, logits, dec, coins, S)
    for b in range(B):
        a = 0
        while a < S and float(coins[b, a]) < float(probs[b, a, tokens[b, a + 1]]):
            a += 1
        q = probs[b, a].clone()
        if a < S:
            q[tokens[b, a + 1]] = 0.0
        cdf = torch.cumsum(q, 0)
        want = int(torch.searchsorted(cdf, (coins[b, S + 1] * cdf[-1])[None], right=True)[0])
        assert int(fast.accepted[b]) == a and int(fast.bonus[b]) == min(want, V - 1), b
    assert 0 < int((fast.accepted == S).sum()) < B
