"""SGLang's target-only sampled verification, ported to torch (diag.replay.sampling), on
hand-made distributions over 5 tokens: exact acceptance probabilities for a chain and a
2-level tree with thresholds at 1 and below 1, Monte-Carlo against them, and lossless
emission at thresholds 1 (chi-square)."""

import pytest
import torch

from diag.engines.decoding import sampled
from diag.replay.sampling import (accept_probs, expected_at_depth, reach_probs, renorm_top_k, renorm_top_p,
                                  sample, target_probs, uniforms, verify_chain_rejection, verify_tree)
from diag.trees import depths

P_ROOT = [0.10, 0.40, 0.30, 0.15, 0.05]
P_1 = [0.20, 0.10, 0.50, 0.10, 0.10]      # after token 1
P_2 = [0.25, 0.25, 0.10, 0.30, 0.10]      # after token 2
P_LEAF = [0.2] * 5                         # after any depth-2 node (only the bonus reads it)
CHI2_DF4_999 = 18.467                      # chi-square critical value, 4 dof, alpha 0.001


def tree(tokens, parents, node_probs, B=1):
    t = torch.tensor([tokens]).expand(B, -1)
    p = torch.tensor([parents]).expand(B, -1)
    probs = torch.tensor([node_probs], dtype=torch.float32).expand(B, -1, -1)
    return t, p, torch.ones_like(t, dtype=torch.bool), probs


# chain: root -> 1 -> 2
CHAIN = ([-1, 1, 2], [-1, 0, 1], [P_ROOT, P_1, P_LEAF])
# 2-level tree: root -> {1, 2}; 1 -> {2, 0}; 2 -> {3}
TREE = ([-1, 1, 2, 2, 0, 3], [-1, 0, 0, 1, 1, 2], [P_ROOT, P_1, P_2, P_LEAF, P_LEAF, P_LEAF])


def exact(spec, S, ts=1.0, ta=1.0):
    t, p, v, probs = tree(*spec)
    return expected_at_depth(t, p, v, probs, depths(p), S, threshold_single=ts, threshold_acc=ta)[0].tolist()


@pytest.mark.parametrize("ts, ta, want", [
    (1.0, 1.0, [0.4, 0.2]),              # .4, .4 x .5
    (0.45, 1.0, [0.4, 0.4]),             # depth 2 has p .5 >= .45: taken whenever reached
    (1.0, 0.5, [0.8, 0.8]),              # coin < p / .5
])
def test_chain_exact_acceptance(ts, ta, want):
    assert exact(CHAIN, 2, ts, ta) == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("ts, ta, want", [
    (1.0, 1.0, [0.7, 0.37]),             # nodes .4, .3; then .4x.5 + .4x.2 + .3x.3
    (1.0, 0.5, [1.0, 0.92]),             # root children .8, .2; node 1's first child 1.0; node 2's .6
    (0.35, 1.0, [1.0, 1.0]),             # the first child fires (p .4 >= .35) and so does its child
])
def test_two_level_tree_exact_acceptance(ts, ta, want):
    assert exact(TREE, 2, ts, ta) == pytest.approx(want, abs=1e-6)


def test_a_later_sibling_that_fires_takes_the_rest_of_the_coin():
    """Children in index order [token 2 (p .3), token 1 (p .4)], threshold_single .35: the first
    is taken iff coin < .3, the second (fires) whenever reached: .7."""
    t, p, v, probs = tree([-1, 2, 1], [-1, 0, 0], [P_ROOT, P_2, P_1])
    take = accept_probs(t, p, v, probs, threshold_single=0.35)
    assert take[0].tolist() == pytest.approx([1.0, 0.3, 0.7], abs=1e-6)
    assert reach_probs(p, take, 1)[0].tolist() == pytest.approx([1.0, 0.3, 0.7], abs=1e-6)


def mc(spec, S, ts=1.0, ta=1.0, B=200_000, seed=0):
    t, p, v, probs = tree(*spec, B=B)
    g = torch.Generator().manual_seed(seed)
    coins = torch.rand(B, t.shape[1], generator=g)
    final = torch.rand(B, generator=g)
    return t, verify_tree(t, p, v, probs, coins, final, S, threshold_single=ts, threshold_acc=ta)


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("ts, ta", [(1.0, 1.0), (0.45, 1.0), (1.0, 0.5), (0.35, 0.7)])
def test_monte_carlo_matches_the_exact_acceptance(spec, ts, ta):
    B = 50_000
    _, r = mc(spec, 2, ts, ta, B)
    got = [(r.accepted >= d).float().mean().item() for d in (1, 2)]
    want = exact(spec, 2, ts, ta)
    for g, w in zip(got, want):
        sigma = max((w * (1 - w) / B) ** 0.5, 1e-4)
        assert abs(g - w) < 5 * sigma, (got, want)


def chi2(tokens: torch.Tensor, p: list[float]) -> float:
    n = tokens.numel()
    obs = torch.bincount(tokens, minlength=5).double()
    exp = torch.tensor(p, dtype=torch.float64) * n
    return float(((obs - exp) ** 2 / exp).sum())


def emitted(t, r):
    """First and second emitted tokens of each round (second: -1 when the round emits one)."""
    rows = torch.arange(t.shape[0])
    x1 = torch.where(r.accepted >= 1, t[rows, r.path[:, 1].clamp(min=0)], r.bonus)
    x2 = torch.where(r.accepted >= 2, t[rows, r.path[:, 2].clamp(min=0)],
                     torch.where(r.accepted == 1, r.bonus, torch.full_like(r.bonus, -1)))
    return x1, x2


def test_lossless_at_thresholds_one_chi_square():
    """Emitted tokens follow the target: x1 ~ p(root); given x1 = 1, x2 ~ p(after 1); given
    x1 = 2, x2 ~ p(after 2), whatever the tree drafted."""
    t, r = mc(TREE, 2, B=100_000, seed=3)
    x1, x2 = emitted(t, r)
    assert chi2(x1, P_ROOT) < CHI2_DF4_999
    assert chi2(x2[x1 == 1], P_1) < CHI2_DF4_999
    assert chi2(x2[x1 == 2], P_2) < CHI2_DF4_999


def test_thresholds_below_one_are_lossy():
    """threshold_acc .5 accepts token 1 at the root 80% of the time, not 40%: the emitted
    distribution is no longer the target's (the chi-square statistic explodes)."""
    t, r = mc(TREE, 2, 1.0, 0.5, B=50_000, seed=4)
    x1, _ = emitted(t, r)
    assert chi2(x1, P_ROOT) > 100 * CHI2_DF4_999


def test_bonus_is_drawn_from_the_residual():
    """Both root children rejected (coin .95 >= .7): the bonus never is token 1 or 2; its law is
    relu(p - excluded) renormalised: tokens 0, 3, 4 with .1/.3, .15/.3, .05/.3."""
    B = 60_000
    t, p, v, probs = tree([-1, 1, 2], [-1, 0, 0], [P_ROOT, P_1, P_2], B=B)
    coins = torch.full((B, 3), 0.95)
    final = torch.rand(B, generator=torch.Generator().manual_seed(5))
    r = verify_tree(t, p, v, probs, coins, final, 1)
    assert int(r.accepted.sum()) == 0
    assert chi2(r.bonus, [1 / 3, 1e-12, 1e-12, 0.5, 1 / 6]) < CHI2_DF4_999
    assert not ((r.bonus == 1) | (r.bonus == 2)).any()


def test_vllm_chain_rule_has_sglangs_law():
    B = 200_000
    t, p, v, probs = tree(*CHAIN, B=B)
    g = torch.Generator().manual_seed(6)
    r = verify_chain_rejection(t, probs, torch.rand(B, 3, generator=g), torch.rand(B, generator=g))
    for d, w in zip((1, 2), exact(CHAIN, 2)):
        assert abs((r.accepted >= d).float().mean().item() - w) < 5 * (w * (1 - w) / B) ** 0.5
    x1, _ = emitted(t, r)
    assert chi2(x1[:50_000], P_ROOT) < CHI2_DF4_999


def test_target_probs_follow_sglangs_order_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.3, 0.15, 0.05]]))
    assert target_probs(logits, sampled(1.0))[0].tolist() == pytest.approx([0.1, 0.4, 0.3, 0.15, 0.05], abs=1e-6)
    assert target_probs(logits, sampled(1.0, top_k=2))[0].tolist() == pytest.approx([0, 4 / 7, 3 / 7, 0, 0], abs=1e-6)
    # ascending [.05, .1, .15, .3, .4], sums reach 1 - .6 = .4 at .3 -> keep {.3, .4}
    assert target_probs(logits, sampled(1.0, top_p=0.6))[0].tolist() == pytest.approx([0, 4 / 7, 3 / 7, 0, 0], abs=1e-6)
    hot = target_probs(logits, sampled(0.5))[0]
    sq = torch.tensor([0.1, 0.4, 0.3, 0.15, 0.05]) ** 2                            # T = .5: p^2 renormalised
    assert hot.tolist() == pytest.approx((sq / sq.sum()).tolist(), abs=1e-6)
    assert target_probs(logits, sampled(1e-7))[0].tolist() == [0, 1, 0, 0, 0]   # SGLang: top_k 1


def test_renorm_keeps_ties_at_the_pivot():
    p = torch.tensor([[0.3, 0.3, 0.3, 0.1]])
    assert renorm_top_k(p, 1)[0].tolist() == pytest.approx([1 / 3] * 3 + [0], abs=1e-6)
    assert renorm_top_p(p, 0.2)[0].tolist() == pytest.approx([1 / 3] * 3 + [0], abs=1e-6)


@pytest.mark.parametrize("window", [2, 8, 16])
def test_top_p_from_a_window_equals_the_full_sort(window):
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(200, 1024, generator=g) * 3, -1)
    p[0] = 1 / 1024                                                          # all tied: the pivot is deep
    for top_p in (0.3, 0.9, 0.95):
        got, want = renorm_top_p(p, top_p, window=window), renorm_top_p(p, top_p, window=1024)
        # the same pivots (the same ids kept); the kept mass summed from the window, or its 8 x wider
        # one, against the sorted row: the same sums up to the additions' order
        assert torch.equal(got > 0, want > 0)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_sample_inverse_cdf_and_fallbacks():
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.2], [0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    assert sample(probs, torch.tensor([0.6, 0.5, 0.9999999])).tolist() == [3, 3, 1]


def test_coins_depend_on_their_key_only_and_look_uniform():
    keys, rounds = torch.arange(1000), torch.full((1000,), 7)
    u = uniforms(3, keys, rounds, 8)
    assert torch.equal(u[10:20], uniforms(3, keys[10:20], rounds[10:20], 8))
    assert not torch.equal(u, uniforms(4, keys, rounds, 8))
    seeds = torch.tensor([3, 4, 2 ** 40 + 7] * 10 + [3] * (len(keys) - 30))      # a seed per row, one call
    rows = torch.cat([uniforms(int(s), keys[i:i + 1], rounds[i:i + 1], 8) for i, s in enumerate(seeds.tolist())])
    assert torch.equal(uniforms(seeds, keys, rounds, 8), rows)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    hist = torch.histc(u, bins=10, min=0.0, max=1.0)
    assert float(((hist - 800) ** 2 / 800).sum()) < 27.9     # chi-square 9 dof, alpha 0.001


def test_the_walks_worked_example():
    """walk_tree's docstring, thresholds 1: root children p [.5, .3]; coin .6 -> running sums
    [.5, .8], child 1 (the second) taken, nothing excluded; coin .9 -> none taken, both excluded
    from the root's bonus. The walk reads p(token | parent) only (`child_probs`)."""
    from diag.replay.sampling import walk_tree
    tokens = torch.tensor([[7, 1, 2], [7, 1, 2]])
    parents = torch.tensor([[-1, 0, 0], [-1, 0, 0]])
    valid = torch.ones(2, 3, dtype=torch.bool)
    p_child = torch.tensor([[0.0, 0.5, 0.3], [0.0, 0.5, 0.3]])
    coins = torch.tensor([[0.6, 0.0, 0.0], [0.9, 0.0, 0.0]])
    w = walk_tree(tokens, parents, valid, p_child, coins, 1)
    assert w.accepted.tolist() == [1, 0] and w.path.tolist() == [[0, 2], [0, -1]] and w.last.tolist() == [2, 0]
    assert w.excluded.tolist() == [[False, False, False], [False, True, True]]


def test_the_bonus_removes_an_excluded_token_whole_once_or_twice():
    """draw_bonus: a token excluded at two nodes is zeroed once (SGLang writes p into the
    exclusion table; relu(p - p) = 0), a token drafted at an excluded and a kept node too; the
    rest keeps its mass. p [.1, .4, .3, .2], tokens 1 (excluded twice) and 2 (kept): coin .5 of
    the remaining .6 -> the running sums [.1, .1, .4, .6] pass .3 at index 2."""
    from diag.replay.sampling import draw_bonus
    p_last = torch.tensor([[0.1, 0.4, 0.3, 0.2]])
    tokens = torch.tensor([[0, 1, 1, 2]])
    excluded = torch.tensor([[False, True, True, False]])
    assert draw_bonus(p_last, tokens, excluded, torch.tensor([0.5])).tolist() == [2]
    assert draw_bonus(p_last, tokens, excluded, torch.tensor([0.1])).tolist() == [0]


@pytest.mark.parametrize("temperature,top_k", [(1.0, -1), (0.7, -1), (1.0, 40)])
def test_the_pivot_found_among_the_largest_logits_is_the_one_among_the_largest_probabilities(temperature, top_k):
    """top_p_kept's key: the window of the 256 largest p read at the 256 largest logits (the logits'
    top-k in their own dtype on the GPU) gives the same pivot, mass and found on every row, ties
    included: bf16 logits on 5,000 ids repeat values, the temperature and the top-k keep the order."""
    from diag.replay.sampling import _tempered, top_p_kept
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 5000, generator=g) * 3
    logits[:, :32] += 10                                                            # 95% among ~32 ids
    logits[::4] = torch.randn(16, 5000, generator=g) * 0.05                         # flat rows: pivot deeper
    logits = logits.to(torch.bfloat16)
    d = sampled(temperature, 0.95, top_k=top_k)
    p = _tempered(logits, d)
    assert int((logits[0, None] == logits[0, :, None]).sum()) > 5000 * 2           # ties among the logits
    got = top_p_kept(p, 0.95, capacity=8, key=logits)
    want = top_p_kept(p, 0.95, capacity=8)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    if top_k == -1:                                   # 16 flat rows, 8 of them sorted; the peaked ones found
        assert int(got[2].sum()) == 64 - 8 and bool(got[2][1::4].all())
    else:                                             # the top-k leaves 40 ids: every pivot among them
        assert bool(got[2].all())
