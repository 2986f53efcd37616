"""Verification under sampling, ported to torch from SGLang 0.5.23 (DESIGN.md §11).

Target probabilities (srt/speculative/eagle_utils.py, eagle_sample): p = softmax(logits / T),
then top-k renormalisation, then top-p renormalisation, both with FlashInfer's pivot rule
(kernels/ops/sampling/renorm_triton.py): top-k keeps every p >= the k-th largest; top-p sorts
ascending, finds the first index whose running sum reaches 1 - top_p, and keeps every p >= the
value there (ties at the pivot stay). T < 1e-6 means top_k = 1 at T = 1 (SamplingParams).

The tree walk (kernels/jit/include/sgl_kernel/speculative/sampling.cuh,
TreeSpeculativeSamplingTargetOnly), per request: coin = u[root]; at each depth the children of
the last accepted node are walked in node-index order (build_tree_efficient links siblings in
ascending index) with prob_acc += p(child) under the last accepted node's distribution; a child
is accepted when p > 0 and (coin < prob_acc / threshold_acc or p >= threshold_single); on accept
coin = u[child] and prob_acc = 0; a rejected child's p is written into the exclusion table of
that node. The bonus token is drawn with its own coin from relu(p(last) - excluded(last)),
renormalised: the first index whose running sum exceeds coin * total, else the last id with
mass, else V - 1. The draft distribution is never read ("target only").

Worked example, thresholds 1: root children a (p .5), b (p .3); coin .6 -> a rejected
(.6 >= .5), b accepted (.6 < .8); coin .9 -> both rejected, bonus from {other tokens: .2}.
So P(accept a) = .5, P(accept b) = .3: each child is accepted with its own target probability,
and E[accepted] = sum over nodes of the product of p along the path (`expected_accepted`).

vLLM's chain rule (`verify_chain_rejection`): accept depth d iff u_d < p(x_d), else emit a token from
p with x_d removed; the same law as SGLang's for chains, other coins.

Coins (`uniforms`) come from a counter-based hash of (seed, row key, round, column), so a
row's coins do not depend on how rows are batched. This module knows probabilities, token ids
and parent arrays; nothing about models or files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from diag.engines.decoding import SAMPLING_EPS, Decoding

WINDOW = 256                     # the top-p pivot looked for among a row's 256 largest first
DEEPER_ROWS, DEEPER_MIN = 1 / 16, 8   # target_kept(unsynced) sorts this share of its rows whole (at least 8)
RUN_CHUNK = 1024                 # running sums over rows longer than this are taken in chunks (`running_sum`)
MAX_COIN = 1.0 - 2 ** -24        # SGLang clamps coins below 1.0 (a 1.0 coin walks past the CDF)
_M32 = 0xFFFFFFFF


# ---- target probabilities -------------------------------------------------------------

@dataclass(frozen=True)
class Kept:
    """Target probabilities as SGLang's renormalisation leaves them, the division left to the
    reader: p [..., V] after temperature and top-k, each row's top-p pivot [..., 1] (the ids with
    p >= pivot are kept; -inf: all) and the mass they keep [..., 1]. Row r's probability of id v
    is p[r, v] / mass[r] where p[r, v] >= pivot[r], else 0. A round reads its B x D rows at one id
    each (`at`) and renormalises only the rows its bonuses are drawn from (`whole`): on Kimi's
    163,840 ids, B x D rows written whole again cost 3.4 ms a round at 1,536 nodes (H100).
    Example: p [.4, .3, .2, .1], pivot .3, mass .7 -> at id 1: .3 / .7 = .429; id 2: 0."""

    p: torch.Tensor
    pivot: torch.Tensor
    mass: torch.Tensor

    @classmethod
    def every(cls, p: torch.Tensor) -> "Kept":
        """p as it is, every id kept (no top-p; a greedy one-hot): pivot -inf, mass 1."""
        shape = (*p.shape[:-1], 1)
        return cls(p, torch.full(shape, float("-inf"), device=p.device), torch.ones(shape, device=p.device))

    def at(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """p(ids[i] | row rows[i]) for index tensors of one shape (rows index the flat rows)."""
        flat = self.p.reshape(-1, self.p.shape[-1])
        v = flat[rows, ids]
        piv, mass = self.pivot.reshape(-1)[rows], self.mass.reshape(-1)[rows]
        return torch.where(v >= piv, v / mass, torch.zeros_like(v))

    def whole(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The renormalised rows `rows` of the flat rows [R, V] (None: every row, in p's shape)."""
        if rows is None:
            p, piv, mass = self.p, self.pivot, self.mass
        else:
            p = self.p.reshape(-1, self.p.shape[-1])[rows]
            piv, mass = self.pivot.reshape(-1, 1)[rows], self.mass.reshape(-1, 1)[rows]
        return torch.where(p >= piv, p / mass, torch.zeros_like(p))


def _keep_from_pivot(p: torch.Tensor, pivot: torch.Tensor) -> torch.Tensor:
    kept = torch.where(p >= pivot, p, torch.zeros_like(p))
    return kept / kept.sum(-1, keepdim=True)


def renorm_top_k(p: torch.Tensor, k: int) -> torch.Tensor:
    """Keep every p >= the k-th largest, renormalise. [.4, .3, .2, .1], k 2 -> [.571, .429, 0, 0]."""
    if k < 1 or k >= p.shape[-1]:
        return p
    pivot = torch.topk(p, k, dim=-1).values[..., -1:]
    return _keep_from_pivot(p, pivot)


def _ascending(p: torch.Tensor) -> torch.Tensor:
    """p's values sorted ascending along the last dim. On the CPU numpy's SIMD sort: the same
    values (a sort's values do not depend on its algorithm), 6x faster than torch.sort on
    [800, 2048] float32 rows (14 ms against 94 ms, 1 thread)."""
    if p.device.type == "cpu" and p.dtype in (torch.float32, torch.float64) and not p.requires_grad:
        return torch.from_numpy(np.sort(p.contiguous().numpy(), axis=-1))
    return torch.sort(p, dim=-1).values


def running_sum(x: torch.Tensor) -> torch.Tensor:
    """cumsum along the last dim, over chunks of RUN_CHUNK where the rows are longer: each chunk's
    own running sum plus the sum of the chunks before it. One long row per thread block is what
    torch's scan does: 0.27 ms for 96 rows of 163,840 ids on the H100, against 0.14 in chunks.
    The same sums up to the additions' order; still non-decreasing where x >= 0 (a chunk's last
    sum is the next chunk's offset). Example, chunks of 2: [1, 2, 3, 4] -> [1, 3] + 0, [3, 7] + 3."""
    V = x.shape[-1]
    if V <= RUN_CHUNK:
        return torch.cumsum(x, dim=-1)
    pad = -V % RUN_CHUNK
    xs = torch.nn.functional.pad(x, (0, pad)) if pad else x
    run = torch.cumsum(xs.reshape(*x.shape[:-1], -1, RUN_CHUNK), dim=-1)      # [..., C, K]
    ends = run[..., -1]
    before = torch.cumsum(ends, dim=-1) - ends
    return (run + before[..., None]).reshape(*x.shape[:-1], -1)[..., :V]


def _pivot_sorted(p: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's pivot from the sorted row, and the mass it keeps: ([N, 1], [N, 1])."""
    asc = _ascending(p)
    cdf = running_sum(asc)
    need = torch.full((*p.shape[:-1], 1), 1.0 - top_p, dtype=cdf.dtype, device=p.device)
    cut = torch.searchsorted(cdf.contiguous(), need, right=False).clamp(max=p.shape[-1] - 1)
    pivot = asc.gather(-1, cut)
    return pivot, (asc * (asc >= pivot)).sum(-1, keepdim=True)


def _pivot_window(p: torch.Tensor, top_p: float, k0: int, total: torch.Tensor, key: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same pivot from the k0 largest only: the ascending running sum reaches 1 - top_p at
    the element whose larger ones sum to at most total - 1 + top_p, i.e. the (k*+1)-th largest
    with k* the most of them whose sum stays within that budget. total [N, 1]: each row's sum.
    -> (pivot, mass, found) [N, 1]; found is False when the pivot may lie deeper: all k0 fit,
    or the smallest of them ties the pivot (its equals may lie past the window, and the mass
    would miss them). key [N, V]: what ranks the ids as p does (the logits p was computed from,
    in their own dtype: bf16's top-k reads half the bytes, 1.9 ms against 3.1 at 1,536 rows of
    163,840 ids on the H100); the k0 largest p are read at its k0 largest."""
    top = (torch.topk(p, k0, dim=-1).values if key is None                   # descending
           else p.gather(-1, torch.topk(key, k0, dim=-1).indices))
    before = torch.cumsum(top, dim=-1) - top                                 # sum of the m largest, m < k0
    count = (before <= top_p - 1.0 + total).sum(-1, keepdim=True)
    pivot = top.gather(-1, (count - 1).clamp(min=0))
    found = (count < k0) & (top[..., -1:] < pivot)
    return pivot, (top * (top >= pivot)).sum(-1, keepdim=True), found


def top_p_kept(p: torch.Tensor, top_p: float, *, window: int = WINDOW, capacity: int | None = None,
               key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's top-p pivot of each row of p [N, V] and the mass it keeps: (pivot, mass,
    found) [N, 1]. On a large vocabulary (> 16 x window) it is looked for among each row's
    `window` largest first, then the rows where it lies deeper are sorted whole: every such row
    (capacity None, asking the host which), or `capacity` rows (a fixed number, the rows not found
    first, asking the host nothing: a CUDA graph captures it; found is then False on the rows
    left over). Else every row is sorted. A row's pivot and mass are the same either way: the
    window's where the window finds them, else the sorted row's. Example: 1,536 rows, 3 of them
    flat, capacity 96 -> the 3 sorted (and 93 rows found already, which keep the window's).
    key: ranks the ids as p does (`_pivot_window`)."""
    if 16 * window >= p.shape[-1]:
        pivot, mass = _pivot_sorted(p, top_p)
        return pivot, mass, torch.ones_like(pivot, dtype=torch.bool)
    pivot, mass, found = _pivot_window(p, top_p, window, p.sum(-1, keepdim=True), key)
    if capacity is None:
        rows = torch.nonzero(~found[:, 0])[:, 0]
        if not rows.numel():
            return pivot, mass, found
    else:
        rows = torch.argsort(found[:, 0].to(torch.uint8), stable=True)[:min(capacity, len(found))]
    piv, mas = _pivot_sorted(p[rows], top_p)
    had = found[rows]
    return (pivot.index_put((rows,), torch.where(had, pivot[rows], piv)),
            mass.index_put((rows,), torch.where(had, mass[rows], mas)),
            found.index_put((rows,), torch.ones_like(had)))


def renorm_top_p(p: torch.Tensor, top_p: float, *, window: int = WINDOW) -> torch.Tensor:
    """FlashInfer's pivot: sorted ascending [.1, .2, .3, .4], top_p .6 -> running sums
    [.1, .3, .6, 1.0] reach 1 - .6 = .4 first at index 2 -> pivot .3 -> keep {.3, .4} -> [0, 0, .43, .57].
    On a large vocabulary the pivot is looked for among the `window` largest first (no sort of
    the vocabulary; `top_p_kept`)."""
    if top_p >= 1.0:
        return p
    flat = p.reshape(-1, p.shape[-1])
    pivot, mass, _ = top_p_kept(flat, top_p, window=window)
    return Kept(flat, pivot, mass).whole().view_as(p)


def _tempered(logits: torch.Tensor, d: Decoding) -> torch.Tensor:
    """softmax(logits / T) in float32, top-k renormalised: target_probs before its top-p. At
    T = 1 the softmax reads the logits in their own dtype (one pass fewer)."""
    t, k = d.temperature, d.top_k
    if t < SAMPLING_EPS:
        t, k = 1.0, 1
    p = (torch.softmax(logits, dim=-1, dtype=torch.float32) if t == 1.0
         else torch.softmax(logits.float() / t, dim=-1))
    return renorm_top_k(p, k) if k != -1 else p


def target_kept(logits: torch.Tensor, d: Decoding, *, unsynced: bool = False,
                deeper: float = DEEPER_ROWS) -> tuple[Kept, torch.Tensor]:
    """logits [..., V] -> SGLang's sampled-verification probabilities as a `Kept`, and ok (a
    0-dim bool). unsynced: asking the host nothing (a CUDA graph captures it), a fixed number of
    rows (the share `deeper` of them, at least DEEPER_MIN) sorted whole where their pivot lies
    past the WINDOW largest (`top_p_kept`'s capacity); ok False when more rows needed it, and the
    caller computes again without `unsynced`. Where ok is True, the same as without; at deeper 1
    every row may be sorted, and ok is always True."""
    p = _tempered(logits, d)
    if d.top_p >= 1.0:
        return Kept.every(p), torch.ones((), dtype=torch.bool, device=p.device)
    shape = (*p.shape[:-1], 1)
    flat = p.reshape(-1, p.shape[-1])
    rows = len(flat)
    capacity = max(DEEPER_MIN, int(rows * deeper)) if unsynced else None
    # the logits rank the ids as p does: softmax and a positive temperature keep their order, and the
    # top-k's dropped ids (p 0) rank below the kept ones either way
    key = logits.reshape(-1, logits.shape[-1])
    pivot, mass, found = top_p_kept(flat, d.top_p, capacity=capacity, key=key)
    return Kept(p, pivot.view(shape), mass.view(shape)), found.all()


def target_probs(logits: torch.Tensor, d: Decoding) -> torch.Tensor:
    """logits [..., V] -> float32 probabilities as SGLang's sampled verification sees them."""
    return target_kept(logits, d)[0].whole()


def sample(probs: torch.Tensor, coin: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row, as FlashInfer's DeviceSamplingFromProb: the first index whose
    running sum exceeds coin * total; past the end, the last index with mass; none: V - 1.
    probs [B, V] (need not sum to 1), coin [B] -> [B] int64.
    Example: probs [0, .2, 0, .2], coin .6 -> u .24 -> sums [0, .2, .2, .4] -> index 3."""
    V = probs.shape[-1]
    cdf = running_sum(probs).contiguous()                                  # [B, V]
    total = cdf[:, -1:]
    idx = torch.searchsorted(cdf, (coin.to(cdf.dtype)[:, None] * total).contiguous(), right=True)[:, 0]
    last = torch.searchsorted(cdf, total.contiguous(), right=False)[:, 0]     # where the sums reach the total
    fallback = torch.where(total[:, 0] > 0, last, V - 1)
    return torch.where(idx < V, idx, fallback)


# ---- coins ---------------------------------------------------------------------------

def _fmix(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors (products wrap mod 2^64; low 32 bits kept)."""
    h = h & _M32
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def uniforms(seed: "int | torch.Tensor", keys: torch.Tensor, counter: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] float32 in [0, 1): coin column c of row b at round counter[b], from
    (seed, keys[b], counter[b], c) alone. keys, counter [B] int64; seed one int, or [B] int64,
    row b's own (the same coins as uniforms(seed[b], ...) row by row, in one call)."""
    return coins_at(coin_rows(seed, keys), counter, width)


def coin_rows(seed: "int | torch.Tensor", keys: torch.Tensor) -> torch.Tensor:
    """The part of `uniforms`' hash that a row keeps from round to round: (seed, key) -> [B] int64.
    A decode loop computes it once per row and `coins_at` each round."""
    if isinstance(seed, torch.Tensor):
        h = _fmix((seed.to(keys.device, torch.int64) & _M32) * 0x9E3779B1 + 0x7F4A7C15)
    else:
        h = _fmix(torch.full_like(keys, (int(seed) * 0x9E3779B1 + 0x7F4A7C15) & _M32))
    return _fmix(h ^ _fmix(keys * 0x27D4EB2F + 0x165667B1))


def coins_at(rows: torch.Tensor, counter: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] coins of rows [B] (`coin_rows`) at round counter [B]: `uniforms`' last mix."""
    cols = torch.arange(width, device=rows.device, dtype=torch.int64)
    h = _fmix(rows[:, None] ^ _fmix(counter[:, None] * 0x61C88647 + cols[None, :] * 0x2545F491 + 0x1B873593))
    return ((h >> 8).to(torch.float32) / float(1 << 24)).clamp(max=MAX_COIN)


# ---- the tree walk -------------------------------------------------------------------

@dataclass(frozen=True)
class SampledRound:
    """One verify round per row. accepted [B] int64 (drafts, bonus excluded); path [B, S+1]
    node indices (path[:, 0] = 0, -1 past the accepted depth); bonus [B] int64 token id."""

    accepted: torch.Tensor
    path: torch.Tensor
    bonus: torch.Tensor


@dataclass(frozen=True)
class Walk:
    """A rule's walk before its bonus: accepted [B], path [B, S+1] as in SampledRound, last [B]
    the node the walk ended on, excluded [B, D] the nodes whose tokens the bonus may not be
    (their target probability is zeroed in last's distribution before the draw)."""

    accepted: torch.Tensor
    path: torch.Tensor
    last: torch.Tensor
    excluded: torch.Tensor


def child_probs(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor,
                probs: torch.Tensor) -> torch.Tensor:
    """p(token_i | parent_i) at every node [B, D]: what a walk and the expectation read of the
    target's distributions; 0 at the root and at invalid nodes. probs [B, D, V]."""
    B, D = tokens.shape
    V = probs.shape[-1]
    flat = parents.clamp(min=0) * V + tokens.clamp(min=0)                     # row of the parent, col of the token
    return probs.reshape(B, D * V).gather(-1, flat) * (valid & (parents >= 0))


def draw_bonus(p_last: torch.Tensor, tokens: torch.Tensor, excluded: torch.Tensor,
               final_coin: torch.Tensor) -> torch.Tensor:
    """The bonus [B]: p_last [B, V] (the last node's distribution) with every excluded node's
    token zeroed (SGLang's relu(p - excluded): a rejected token's mass is removed whole, once or
    repeated; vLLM's residual of a rejected chain draft), drawn with the final coin."""
    drop = torch.zeros_like(p_last).scatter_add_(-1, tokens.clamp(min=0), excluded.to(p_last.dtype))
    return sample(torch.where(drop > 0, torch.zeros_like(p_last), p_last), final_coin)


def walked_round(w: Walk, tokens: torch.Tensor, probs: torch.Tensor, final_coin: torch.Tensor) -> SampledRound:
    """A walk's round: its path and accepted count, and its bonus drawn from the last node's
    distribution (probs [B, D, V]) without the excluded tokens (`draw_bonus`)."""
    p_last = probs[torch.arange(len(w.last), device=probs.device), w.last]
    return SampledRound(w.accepted, w.path, draw_bonus(p_last, tokens, w.excluded, final_coin))


def walk_tree(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, p_child: torch.Tensor,
              coins: torch.Tensor, num_steps: int, *, threshold_single: float = 1.0,
              threshold_acc: float = 1.0) -> Walk:
    """SGLang's target-only walk (module docstring) on p_child [B, D] (`child_probs`): coins
    [B, D]. Which child a node would accept depends only on its own children and coin (prob_acc
    restarts at 0 on every accept), so it is found for every node at once: child j of node i is
    taken iff p_j > 0 and (coin_i < run_j / t_acc or p_j >= t_single), run_j the running sum of
    p over i's children up to j in index order; the first such j is i's next node. The walk then
    follows next from the root, num_steps times. The bonus excludes the children of the node it
    ended on that were walked and rejected: all of them when none was taken, none at a leaf or
    at the last depth. Worked example (thresholds 1): root children p [.5, .3], coin .6 -> run
    [.5, .8], child 1 taken; coin .9 -> none, both excluded."""
    B, D = tokens.shape
    dev = tokens.device
    idx = torch.arange(D, device=dev)
    node = valid & (parents >= 0)
    of = torch.where(node, parents, D)                                     # a non-node belongs to no one
    mine = of[:, None, :] == idx[None, :, None]                            # [B, i, j]: j is a child of i
    run = torch.cumsum(p_child[:, None, :] * mine, dim=-1)                 # prob_acc over i's children, in order
    run = run.gather(1, of.clamp(max=D - 1)[:, None, :])[:, 0]             # [B, D]: at each child, its parent's sum
    coin = coins.gather(-1, parents.clamp(min=0))                          # the parent's coin
    ok = node & (p_child > 0) & ((coin < run / threshold_acc) | (p_child >= threshold_single))
    nxt = torch.full((B, D + 1), D, dtype=torch.int64, device=dev)
    nxt = nxt.scatter_reduce(1, of, torch.where(ok, idx, D).expand(B, D), "amin")[:, :D]   # [B, D]; D: none
    cur = torch.zeros(B, dtype=torch.int64, device=dev)
    path = torch.full((B, num_steps + 1), -1, dtype=torch.int64, device=dev)
    path[:, 0] = 0
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    for d in range(1, num_steps + 1):
        step = nxt.gather(1, cur[:, None])[:, 0]
        alive = alive & (step < D)
        cur = torch.where(alive, step, cur)
        path[:, d] = torch.where(alive, step, -1)
    accepted = (path[:, 1:] >= 0).sum(-1)
    stop = nxt.gather(1, cur[:, None])                                     # the child the last node would take
    excluded = (of == cur[:, None]) & (idx[None] < stop) & (accepted < num_steps)[:, None]
    return Walk(accepted, path, cur, excluded)


def verify_tree(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, probs: torch.Tensor,
                coins: torch.Tensor, final_coin: torch.Tensor, num_steps: int, *,
                threshold_single: float = 1.0, threshold_acc: float = 1.0) -> SampledRound:
    """SGLang's target-only tree sampling (module docstring). tokens, parents, valid [B, D]
    (node 0 the root); probs [B, D, V] target probabilities after node i; coins [B, D];
    final_coin [B]."""
    w = walk_tree(tokens, parents, valid, child_probs(tokens, parents, valid, probs), coins, num_steps,
                  threshold_single=threshold_single, threshold_acc=threshold_acc)
    return walked_round(w, tokens, probs, final_coin)


def walk_chain_rejection(tokens: torch.Tensor, p_child: torch.Tensor, coins: torch.Tensor) -> Walk:
    """vLLM's chain rule before its bonus: tokens [B, S+1] (column 0 the root), p_child [B, S+1]
    (`child_probs`: p(x_d) under node d-1 in column d); accept depth d iff coins[:, d-1] < p(x_d);
    the first rejected draft's token is excluded from the bonus."""
    B, D = tokens.shape
    S = D - 1
    ok = (coins[:, :S] < p_child[:, 1:]).to(torch.int64).cumprod(-1)
    accepted = ok.sum(-1)
    ids = torch.arange(S + 1, device=tokens.device)[None]
    path = torch.where(ids <= accepted[:, None], ids, -1)
    excluded = (ids == accepted[:, None] + 1) & (accepted < S)[:, None]
    return Walk(accepted, path, accepted, excluded)


def verify_chain_rejection(tokens: torch.Tensor, probs: torch.Tensor, coins: torch.Tensor,
                           final_coin: torch.Tensor) -> SampledRound:
    """vLLM's rule for a chain of greedy drafts: tokens [B, S+1] (column 0 the root), probs
    [B, S+1, V]; accept depth d iff coins[:, d-1] < p(x_d) under node d-1; on the first
    rejection emit from p(d-1) with x_d removed; all accepted: the bonus from p(S)."""
    B, D = tokens.shape
    chain = torch.arange(-1, D - 1, device=tokens.device).expand(B, D)
    valid = torch.ones(B, D, dtype=torch.bool, device=tokens.device)
    w = walk_chain_rejection(tokens, child_probs(tokens, chain, valid, probs), coins)
    return walked_round(w, tokens, probs, final_coin)


# ---- the exact expectation -----------------------------------------------------------

def accept_probs(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, probs: torch.Tensor, *,
                 threshold_single: float = 1.0, threshold_acc: float = 1.0) -> torch.Tensor:
    """P(node i is accepted | its parent was) under the walk above, for every node [B, D]
    (root 1), from every node's distribution probs [B, D, V]: `take_probs` of `child_probs`."""
    return take_probs(child_probs(tokens, parents, valid, probs), parents, valid,
                      threshold_single=threshold_single, threshold_acc=threshold_acc)


def take_probs(p_child: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, *,
               threshold_single: float = 1.0, threshold_acc: float = 1.0) -> torch.Tensor:
    """P(node i is accepted | its parent was) from p_child [B, D] (`child_probs`). Among
    siblings in index order with running sums S_i (S_0 = 0), the first child whose p >=
    threshold_single is taken whenever it is reached; before it child i is taken iff the coin
    falls in [min(1, S_{i-1}/t_acc), min(1, S_i/t_acc)).
    Thresholds 1: P = p(child). Example (t_acc .5): siblings p [.2, .3] -> [.4, .6]."""
    B, D = parents.shape
    node = valid & (parents >= 0)
    p = p_child * node
    i = torch.arange(D, device=parents.device)
    sib = (parents[:, :, None] == parents[:, None, :]) & node[:, None, :] & node[:, :, None]
    upto = sib & (i[None, None, :] <= i[None, :, None])                         # j <= i, same parent
    run = (upto * p[:, None, :]).sum(-1)                                        # S_i
    prev = run - p                                                              # S_{i-1}
    fires = node & (p > 0) & (p >= threshold_single)
    fired_before = (sib & (i[None, None, :] < i[None, :, None]) & fires[:, None, :]).any(-1)
    lo, hi = (prev / threshold_acc).clamp(max=1.0), (run / threshold_acc).clamp(max=1.0)
    take = torch.where(fires, 1.0 - lo, torch.where(p > 0, (hi - lo).clamp(min=0.0), torch.zeros_like(p)))
    take = torch.where(fired_before | ~node, torch.zeros_like(take), take)
    take[:, 0] = 1.0
    return take


def reach_probs(parents: torch.Tensor, take: torch.Tensor, num_steps: int) -> torch.Tensor:
    """P(node i is on the accepted path) = product of `take` along its path; root 1. [B, D]."""
    reach = torch.zeros_like(take)
    reach[:, 0] = 1.0
    par = parents.clamp(min=0)
    for _ in range(num_steps):
        reach = torch.where(parents >= 0, reach.gather(-1, par) * take, reach)
        reach[:, 0] = 1.0
    return reach


def expected_at_depth(tokens, parents, valid, probs, depths: torch.Tensor, num_steps: int, *,
                      threshold_single: float = 1.0, threshold_acc: float = 1.0) -> torch.Tensor:
    """[B, S]: column d-1 = P(a >= d) = sum of reach over the nodes at depth d. Summed over d it
    is E[accepted drafts] of the round (thresholds 1: sum over nodes of the product of p)."""
    return expected_from_child(child_probs(tokens, parents, valid, probs), parents, valid, depths, num_steps,
                               threshold_single=threshold_single, threshold_acc=threshold_acc)


def expected_from_child(p_child: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, depths: torch.Tensor,
                        num_steps: int, *, threshold_single: float = 1.0, threshold_acc: float = 1.0) -> torch.Tensor:
    """`expected_at_depth` from p_child [B, D] (`child_probs`), the only numbers it reads."""
    take = take_probs(p_child, parents, valid, threshold_single=threshold_single, threshold_acc=threshold_acc)
    reach = reach_probs(parents, take, num_steps) * (valid & (parents >= 0))
    at = torch.arange(1, num_steps + 1, device=depths.device)
    return (reach[:, None, :] * (depths[:, None, :] == at[None, :, None])).sum(-1)
