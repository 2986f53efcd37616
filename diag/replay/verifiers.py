"""The verification rules by name: what EngineRules.verification names (diag/engines/protocol.py)
-> the torch functions that apply it. An engine says which rule its release runs; the decode
loop looks the name up here, so a new rule is one entry, and no engine is named.

Greedy:  "tree-argmax"       accepted_tree: the deepest path whose tokens equal the target's
                             argmax continuation (verify.py).
Sampled: "tree-target-only"  verify_tree: each node's children walked with one coin, a child
                             accepted with its target probability, the draft distribution never
                             read; expected_at_depth its exact P(a >= d) (sampling.py).
         "chain-rejection"   verify_chain_rejection on a chain: accept depth d iff u_d < p(x_d), else
                             resample from p without x_d; for chains the same law as
                             tree-target-only, so expected_at_depth is its expectation too.
Worked example: rules("sglang-0.5.23").verification(rel).sampled -> "tree-target-only" ->
SAMPLED["tree-target-only"].verify is verify_tree.
This module maps names to functions; it computes nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from diag.errors import DiagError
from diag.replay.sampling import SampledRound, expected_at_depth, verify_chain_rejection, verify_tree
from diag.replay.verify import accepted_tree


@dataclass(frozen=True)
class SampledRule:
    """verify(tokens, parents, valid, probs, coins, final_coin, num_steps, *, threshold_single,
    threshold_acc) -> SampledRound; expected: expected_at_depth's signature -> [B, S]."""

    verify: Callable[..., SampledRound]
    expected: Callable[..., torch.Tensor]


def _chain_rejection(tokens, parents, valid, probs, coins, final_coin, num_steps, *,
                     threshold_single: float = 1.0, threshold_acc: float = 1.0) -> SampledRound:
    """verify_chain_rejection behind verify_tree's signature: node i's parent must be i - 1, and the
    rule has no thresholds."""
    chain = torch.arange(-1, tokens.shape[1] - 1, device=parents.device)
    if not bool((parents == chain).all()) or tokens.shape[1] != num_steps + 1:
        raise DiagError("chain-rejection verifies chains only", field="tree",
                        expected=f"a chain of {num_steps} drafts (topk 1)", found="a tree with branches")
    if threshold_single < 1.0 or threshold_acc < 1.0:
        raise DiagError("chain-rejection has no accept thresholds", field="decoding",
                        expected="threshold_single = threshold_acc = 1.0",
                        found=f"{threshold_single}, {threshold_acc}")
    return verify_chain_rejection(tokens, probs, coins, final_coin)


GREEDY: dict[str, Callable[..., torch.Tensor]] = {"tree-argmax": accepted_tree}
SAMPLED: dict[str, SampledRule] = {
    "tree-target-only": SampledRule(verify_tree, expected_at_depth),
    "chain-rejection": SampledRule(_chain_rejection, expected_at_depth),
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
