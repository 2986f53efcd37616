"""The decode loop's accept step (DESIGN.md §11): one round's trees accepted under the engine's
sampled rule (replay/verifiers.py) from the target's logits at the tree's nodes, with the
probabilities computed only where the walk and the bonus read them. Two shapes of the same step:
`accept_round` takes the head only at the nodes read (the CPU's growing widths); `accept_dense`
takes every node, so no shape depends on the trees (a CUDA graph captures it). The same walk,
draws and expectation either way. This module knows probabilities, trees and coins; nothing about
caches, models or files.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diag.engines.decoding import Decoding
from diag.replay.sampling import DEEPER_ROWS, Kept, SampledRound, draw_bonus, target_kept
from diag.replay.verifiers import SampledRule


def probabilities(logits: torch.Tensor, decoding: Decoding) -> torch.Tensor:
    """Greedy: one-hot argmax (the walk then accepts iff the token is the argmax and the bonus is
    the argmax: SGLang's verify_tree_greedy). Sampled: SGLang's target probabilities."""
    return kept_probabilities(logits, decoding)[0].whole()


def kept_probabilities(logits: torch.Tensor, decoding: Decoding, *, unsynced: bool = False,
                       deeper: float = DEEPER_ROWS) -> tuple[Kept, torch.Tensor]:
    """`probabilities` as a sampling.Kept (renormalised where read), and ok: with `unsynced`
    asking the host nothing, ok False where a top-p pivot lay deeper than the searches a graph
    holds (the share `deeper` of the rows sorted whole: replay/sampling.target_kept); else True."""
    if decoding.greedy:
        hot = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        return Kept.every(hot), torch.ones((), dtype=torch.bool, device=logits.device)
    return target_kept(logits, decoding, unsynced=unsynced, deeper=deeper)


@dataclass(frozen=True)
class _Dense:
    """Logits given at every node, [B, D, V], read as target/tree_forward.NodeLogits is."""
    logits: torch.Tensor

    @property
    def shape(self):
        return self.logits.shape

    @property
    def device(self):
        return self.logits.device

    def rows(self, flat: torch.Tensor, *, native: bool = False) -> torch.Tensor:
        return self.logits.reshape(-1, self.logits.shape[-1])[flat]


def accept_round(rule: SampledRule, t: dict, logits, decoding: Decoding, coins: torch.Tensor,
                 num_steps: int) -> tuple[SampledRound, torch.Tensor]:
    """The rule's walk and exact P(a >= d) for one round: t the tree (tokens, parents, valid,
    depths [B, D]), logits [B, D, V] (a tensor, or NodeLogits: the head then runs only at the
    nodes read, on coins' device), coins [B, D + 1] (the last one the bonus's). Probabilities
    are computed only where they are read: at every node with a child (the walk and the
    expectation read p(token | parent) there, `child_probs`), then at the node each walk ended
    on when it is a leaf (its bonus, drawn with nothing excluded: a leaf has no rejected
    children). One walk, one draw: the same result as the rule on every node's probabilities.
    Example, chain-3 (D 4): nodes 0..2 are computed; a row that accepts 3 ends on leaf 3, whose
    distribution is computed for its bonus alone."""
    logits = _Dense(logits) if isinstance(logits, torch.Tensor) else logits
    B, D, V = logits.shape
    dev = coins.device
    ts, ta = (1.0, 1.0) if decoding.greedy else (decoding.threshold_single, decoding.threshold_acc)
    tokens, parents, valid = t["tokens"], t["parents"], t["valid"]
    node = valid & (parents >= 0)
    ids = torch.arange(D, device=dev)
    has_child = ((parents[:, None, :] == ids[None, :, None]) & node[:, None, :]).any(-1)   # [B, D]
    rows = torch.nonzero(has_child.reshape(-1))[:, 0]                    # b * D + node, in order
    kept = kept_probabilities(logits.rows(rows).to(dev), decoding)[0] if rows.numel() else None
    slot = torch.full((B * D,), -1, dtype=torch.long, device=dev)       # node -> its row of kept
    slot[rows] = torch.arange(len(rows), device=dev)
    slot = slot.view(B, D)
    at_parent = slot.gather(1, parents.clamp(min=0)).clamp(min=0)
    p_child = (kept.at(at_parent, tokens.clamp(min=0)) * node if kept is not None
               else torch.zeros(B, D, device=dev))                      # p(token_i | parent_i) [B, D]
    walk = rule.walk(tokens, parents, valid, p_child, coins[:, :D], num_steps, threshold_single=ts,
                     threshold_acc=ta)
    last = slot.gather(1, walk.last[:, None])[:, 0]                      # -1: the walk ended on a leaf
    p_last = kept.whole(last.clamp(min=0)) if kept is not None else torch.zeros(B, V, device=dev)
    leaf = torch.nonzero(last < 0)[:, 0]
    if leaf.numel():
        p_last[leaf] = probabilities(logits.rows(leaf * D + walk.last[leaf]).to(dev), decoding)
    bonus = draw_bonus(p_last, tokens, walk.excluded, coins[:, D])
    exp = rule.expected_from(p_child, parents, valid, t["depths"], num_steps, threshold_single=ts,
                             threshold_acc=ta)
    return SampledRound(walk.accepted, walk.path, bonus), exp


def accept_dense(rule: SampledRule, t: dict, logits, decoding: Decoding, coins: torch.Tensor, num_steps: int,
                 *, unsynced: bool = False, deeper: float = DEEPER_ROWS
                 ) -> tuple[SampledRound, torch.Tensor, torch.Tensor | None]:
    """accept_round with every node's distribution computed at once (the head over all B x D
    nodes), so no shape depends on the trees drafted: with `unsynced` it asks the host nothing
    and a CUDA graph captures it (ok, the third result, is then False when some row's top-p
    pivot lay past the window searched, and the caller runs it again without `unsynced`; else
    None). The same walk, draws and expectation as accept_round; only which nodes go through
    the head differs, and the logits stay in the head's dtype (the probabilities, float32, are
    the same: `_tempered` widens them exactly; the top-p window's top-k reads half the bytes:
    on the H200 at 1,536 nodes of 163,840 ids, 6.4 ms against 7.0 for the step, and the 1 GB
    float32 copy of the logits is not written). Example, chain-3 on B rows: 4B nodes through the head, where accept_round
    takes the 3B with a child, then the leaves of the rows that accepted all 3."""
    logits = _Dense(logits) if isinstance(logits, torch.Tensor) else logits
    B, D, V = logits.shape
    dev = coins.device
    ts, ta = (1.0, 1.0) if decoding.greedy else (decoding.threshold_single, decoding.threshold_acc)
    tokens, parents, valid = t["tokens"], t["parents"], t["valid"]
    flat = logits.rows(torch.arange(B * D, device=logits.device), native=True).to(dev)     # bf16 on a bf16 head
    kept, ok = kept_probabilities(flat, decoding, unsynced=unsynced, deeper=deeper)
    base = torch.arange(B, device=dev)[:, None] * D
    p_child = kept.at(base + parents.clamp(min=0), tokens.clamp(min=0)) * (valid & (parents >= 0))
    walk = rule.walk(tokens, parents, valid, p_child, coins[:, :D], num_steps, threshold_single=ts,
                     threshold_acc=ta)
    bonus = draw_bonus(kept.whole(base[:, 0] + walk.last), tokens, walk.excluded, coins[:, D])
    exp = rule.expected_from(p_child, parents, valid, t["depths"], num_steps, threshold_single=ts,
                             threshold_acc=ta)
    return SampledRound(walk.accepted, walk.path, bonus), exp, ok if unsynced else None
