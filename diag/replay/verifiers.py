"""The verification rules by name: what EngineRules.verification names (diag/engines/protocol.py)
-> the torch functions that apply it. An engine says which rule its release runs; the decode
loop looks the name up here, so a new rule is one entry, and no engine is named.

Greedy:  "tree-argmax"       accepted_tree: the deepest path whose tokens equal the target's
                             argmax continuation (verify.py).
Sampled: "tree-target-only"  walk_tree: each node's children walked with one coin, a child
                             accepted with its target probability, the draft distribution never
                             read; expected_from_child its exact P(a >= d) (sampling.py).
         "chain-rejection"   walk_chain_rejection on a chain: accept depth d iff u_d < p(x_d), else
                             resample from p without x_d; for chains the same law as
                             tree-target-only, so expected_from_child is its expectation too.
A sampled rule is its walk (on p(token | parent) at every node, `child_probs`) and its
expectation; the bonus is common to both (`draw_bonus`: the last node's distribution without
the excluded tokens). Worked example: rules("sglang-0.5.23").verification(rel).sampled ->
"tree-target-only" -> SAMPLED["tree-target-only"].verify(...) is verify_tree(...).
This module maps names to functions and composes them; it computes nothing of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from diag.errors import DiagError
from diag.replay.sampling import (SampledRound, Walk, child_probs, expected_from_child, walk_chain_rejection,
                                  walk_tree, walked_round)
from diag.replay.verify import accepted_tree


@dataclass(frozen=True)
class SampledRule:
    """walk(tokens, parents, valid, p_child, coins, num_steps, *, threshold_single, threshold_acc)
    -> Walk; expected_from(p_child, parents, valid, depths, num_steps, *, thresholds) -> [B, S].
    verify / expected: the same on every node's distributions probs [B, D, V]."""

    walk: Callable[..., Walk]
    expected_from: Callable[..., torch.Tensor]

    def verify(self, tokens, parents, valid, probs, coins, final_coin, num_steps, *,
               threshold_single: float = 1.0, threshold_acc: float = 1.0) -> SampledRound:
        w = self.walk(tokens, parents, valid, child_probs(tokens, parents, valid, probs), coins, num_steps,
                      threshold_single=threshold_single, threshold_acc=threshold_acc)
        return walked_round(w, tokens, probs, final_coin)

    def expected(self, tokens, parents, valid, probs, depths, num_steps, *,
                 threshold_single: float = 1.0, threshold_acc: float = 1.0) -> torch.Tensor:
        return self.expected_from(child_probs(tokens, parents, valid, probs), parents, valid, depths, num_steps,
                                  threshold_single=threshold_single, threshold_acc=threshold_acc)


def _chain_rejection(tokens, parents, valid, p_child, coins, num_steps, *,
                     threshold_single: float = 1.0, threshold_acc: float = 1.0) -> Walk:
    """walk_chain_rejection behind walk_tree's signature: node i's parent must be i - 1, and the
    rule has no thresholds."""
    chain = torch.arange(-1, tokens.shape[1] - 1, device=parents.device)
    checked = not _capturing()       # a CUDA graph's capture may not ask the device (its warm-up ran the check)
    if tokens.shape[1] != num_steps + 1 or (checked and not bool((parents == chain).all())):
        raise DiagError("chain-rejection verifies chains only", field="tree",
                        expected=f"a chain of {num_steps} drafts (topk 1)", found="a tree with branches")
    if threshold_single < 1.0 or threshold_acc < 1.0:
        raise DiagError("chain-rejection has no accept thresholds", field="decoding",
                        expected="threshold_single = threshold_acc = 1.0",
                        found=f"{threshold_single}, {threshold_acc}")
    return walk_chain_rejection(tokens, p_child, coins)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


GREEDY: dict[str, Callable[..., torch.Tensor]] = {"tree-argmax": accepted_tree}
SAMPLED: dict[str, SampledRule] = {
    "tree-target-only": SampledRule(walk_tree, expected_from_child),
    "chain-rejection": SampledRule(_chain_rejection, expected_from_child),
}


def sampled_rule(name: str) -> SampledRule:
    """The sampled rule an engine names, or a DiagError listing the known ones."""
    if name not in SAMPLED:
        raise DiagError("unknown sampled verification rule", field="verification", expected=", ".join(SAMPLED),
                        found=repr(name))
    return SAMPLED[name]


def greedy_rule(name: str) -> Callable[..., torch.Tensor]:
    """The greedy rule an engine names, or a DiagError listing the known ones."""
    if name not in GREEDY:
        raise DiagError("unknown greedy verification rule", field="verification", expected=", ".join(GREEDY),
                        found=repr(name))
    return GREEDY[name]
