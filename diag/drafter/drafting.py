"""Drafting at every position of a batch: greedy chains and SGLang's top-K beams.

Both run the drafter's steps over all indices at once (the step loop is the only Python
loop) and return target token ids. The beam keeps SGLang's per-row draft attention: row r
at step s sees the prefix plus the keys row r itself wrote at earlier steps, even when the
beam reselection gave row r a different ancestor (DESIGN.md §5); the carried hidden state
follows the true parent row.

This module knows the drafter and the tree-building steps; nothing about targets, files,
layouts or metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from diag.drafter.model import Eagle3Drafter, PrefixCache, at_index
from diag.drafter.tree_build import Beam, expand_step, first_step


@dataclass(frozen=True)
class DraftInputs:
    """One padded batch. aux [B, T, W]; tokens [B, T] = x_{j+1} at index j (right padded);
    valid [B, T]; index [B, Q]: the indices each row drafts at (the others only fill the
    drafter's prefix cache). Example: prompts of 5 and 9 ids, 2 rounds each ->
    index [[4, 5], [8, 9]]; P = B * Q positions, position p = b * Q + q."""
    aux: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor
    index: torch.Tensor


@dataclass(frozen=True)
class DraftHead:
    """How tokens enter and draft logits leave. `embed`: the table every step embeds with
    (the caller picks the target's or the drafter's own, as the server does). `head` None:
    the drafter's lm_head over the draft vocabulary, mapped with d2t (EAGLE-3). Otherwise a
    target-vocabulary head (the target's lm_head, possibly limited to its first ids), ids as
    they are."""
    embed: Callable[[torch.Tensor], torch.Tensor]
    head: nn.Module | None = None


@dataclass(frozen=True)
class Prefix:
    """Step 1 of one batch: the drafter over every index (its prefix cache) and its output
    at the drafted indices. Every chain and beam drafted from the batch starts from it."""
    embed: Callable[[torch.Tensor], torch.Tensor]
    r: torch.Tensor                 # [B, Q, 1, H] step-1 output at x.index
    cache: PrefixCache


def prefix(drafter: Eagle3Drafter, dh: DraftHead, x: DraftInputs) -> Prefix:
    embed = dh.embed                        # the caller's choice (diag.engines.sglang.draft_tables)
    r, cache = drafter.prefix_step(embed(x.tokens), drafter.project(x.aux), x.valid)
    return Prefix(embed, at_index(r, x.index)[:, :, None], cache)


def draft_chain(drafter: Eagle3Drafter, dh: DraftHead, x: DraftInputs, num_steps: int,
                pre: Prefix | None = None) -> torch.Tensor:
    """Greedy chain of depth num_steps at every drafted index -> target ids [B, Q, S].
    pre: step 1 of this batch when already computed (prefix(drafter, dh, x))."""
    pre = pre or prefix(drafter, dh, x)
    logits = drafter.chain(pre.embed, pre.r, pre.cache, x.index, num_steps, head=dh.head)
    return torch.stack([drafter.ids(step, dh.head) for step in logits], dim=-1)


def _token_map(drafter: Eagle3Drafter, dh: DraftHead) -> torch.Tensor | None:
    if dh.head is not None:
        return None
    return drafter.to_target_ids(torch.arange(drafter.cfg.draft_vocab_size, device=drafter.d2t.device))


def draft_beam(drafter: Eagle3Drafter, dh: DraftHead, x: DraftInputs, num_steps: int,
               topk: int, pre: Prefix | None = None) -> list[Beam]:
    """SGLang's beam over num_steps draft steps -> the per-step Beam history, flattened over
    positions (P = B * Q, row p = b * Q + q). tree_build.finalize turns it into trees.
    pre: step 1 of this batch when already computed (prefix(drafter, dh, x))."""
    B, Q = x.index.shape
    tmap = _token_map(drafter, dh)
    pre = pre or prefix(drafter, dh, x)
    embed, r, cache = pre.embed, pre.r, pre.cache                           # r [B, Q, 1, H]
    logp = torch.log_softmax(drafter.head_logits(r[:, :, 0], dh.head).float(), -1)
    beam = first_step(logp.reshape(B * Q, -1), topk, token_map=tmap)
    history, kv_rows = [beam], []
    hidden = drafter.carry(r).expand(B, Q, topk, r.shape[-1])              # [B, Q, K, H]
    for s in range(2, num_steps + 1):
        src = beam.source_row.view(B, Q, topk, 1).expand_as(hidden)
        h = hidden.gather(2, src)                                           # hidden of each row's parent
        e = embed(beam.tokens.view(B, Q, topk))                             # [B, Q, K, H]
        r, kv = drafter.deep_step(e, h, s, cache, kv_rows, x.index)        # r [B, Q, K, H]
        kv_rows.append(kv)                                                  # per row, never reordered
        logp = torch.log_softmax(drafter.head_logits(r, dh.head).float(), -1)
        beam = expand_step(beam, logp.reshape(B * Q, topk, -1), token_map=tmap)
        history.append(beam)
        hidden = drafter.carry(r)
    return history
