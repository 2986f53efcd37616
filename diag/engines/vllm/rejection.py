"""vLLM's rejection sampler for one request's chain, ported from vllm/v1/sample/rejection_sampler.py
(0.8.5–0.33.0; table.py "rejection_sampler") as diag's own pure functions over tensors.

A round verifies k drafts d[0..k-1] against the target's k + 1 positions:
  greedy  (rejection_greedy_sample_kernel): emit argmax[i] for i = 0, 1, ... while d[i] == argmax[i];
          the first mismatch still emits argmax[i] and stops; all k matching -> emit the bonus token.
          Example k = 3, d = [5, 7, 2], argmax = [5, 7, 9, 4] -> tokens [5, 7, 9], accepted 2.
  sampled (rejection_random_sample_kernel): accept d[i] if q(d) > 0 and p_i(d) / q(d) >= u[i], with
          q = 1 when the drafter gives no probabilities (EAGLE gives none); at the first rejection
          emit the recovered token (sample_recovered_tokens_kernel)
              argmax_v p'(v) * inv_q[v],  inv_q = 1 / E, E ~ Exp(1) drawn once per request,
          p' = p_i with the draft token zeroed (no draft probabilities), else max(p_i - q_i, 0):
          an exponential race, i.e. a sample of p' / sum p'.
          Example k = 2, d = [3, 1], p_0(3) = 0.6, u = [0.5, 0.9], p_1(1) = 0.8 -> accept 3
          (0.6 >= 0.5), reject 1 (0.8 < 0.9) -> tokens [3, recovered], accepted 1.
u (float64) and inv_q are arguments, so a test feeds vLLM's kernels and this port the same draws.
This module knows tensors; nothing about servers or files.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verified:
    tokens: tuple[int, ...]        # emitted this round: accepted drafts, then a correction or the bonus
    accepted: int                  # drafts accepted, 0..k (the counter num_accepted_tokens adds)


def greedy(draft: torch.Tensor, target_argmax: torch.Tensor, bonus: int) -> Verified:
    """draft [k], target_argmax [k] (positions 0..k-1), bonus = the argmax after all k drafts."""
    out = []
    for i in range(draft.shape[0]):
        out.append(int(target_argmax[i]))
        if int(draft[i]) != int(target_argmax[i]):
            return Verified(tuple(out), i)
    return Verified(tuple(out) + (int(bonus),), draft.shape[0])


def recovered(target_probs: torch.Tensor, draft_id: int, inv_q: torch.Tensor,
              draft_probs: torch.Tensor | None = None) -> int:
    """The token emitted at a rejection: target_probs [V] float32, inv_q [V] (1 / Exp(1) draws)."""
    if draft_probs is None:
        prob = target_probs.clone()
        prob[draft_id] = 0.0
    else:
        prob = torch.clamp(target_probs - draft_probs, min=0.0)
    return int(torch.argmax(prob * inv_q))


def sampled(draft: torch.Tensor, target_probs: torch.Tensor, bonus: int, uniform: torch.Tensor,
            inv_q: torch.Tensor, draft_probs: torch.Tensor | None = None) -> Verified:
    """draft [k], target_probs [k, V] float32 (after temperature / top-k / top-p), uniform [k] float64."""
    out = []
    for i in range(draft.shape[0]):
        d = int(draft[i])
        if d >= 0:
            q = torch.ones((), dtype=torch.float32) if draft_probs is None else draft_probs[i, d].float()
            ratio = target_probs[i, d].float() / q          # float32, as the kernel divides
        if d >= 0 and float(q) > 0 and bool(ratio.double() >= uniform[i]):
            out.append(d)
            continue
        dp = None if draft_probs is None else draft_probs[i]
        out.append(recovered(target_probs[i], d, inv_q, dp))
        return Verified(tuple(out), i)
    return Verified(tuple(out) + (int(bonus),), draft.shape[0])


def expected_accept_length(draft: torch.Tensor, target_probs: torch.Tensor) -> float:
    """The exact expected accept length of one chain round under the sampled rule with q one-hot:
    1 + sum_j prod_{i<=j} p_i(d_i) (bonus included). Example p = [0.6, 0.8] -> 1 + 0.6 + 0.48 = 2.08."""
    run, total = 1.0, 1.0
    for i in range(draft.shape[0]):
        run *= float(target_probs[i, int(draft[i])])
        total += run
    return total
