"""Tree shapes and the parent-array representation of a draft tree (DESIGN.md §5).

Vocabulary (one name per idea):
  num_steps S         draft forward passes per round = tree depth
  topk K              beam width / branching factor
  num_draft_tokens D  nodes verified per round, INCLUDING the root (bonus) token
  depth               root = 0, drafted nodes 1..S
A tree is one `parents` tensor [..., D]: index 0 is the root, parents[0] = -1,
parents[i] < i for a node in the tree. A node detached from the tree (an orphan
whose parent was not kept, or padding) also holds -1 and counts as depth 0;
masks, depths and positions derive from `parents` by the functions below.

How SGLang resolves and rewrites the three launch flags is an engine rule
(diag.engines.sglang.tree_rules). This module knows nothing about models, logits or metrics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from diag.errors import DiagError


@dataclass(frozen=True)
class TreeShape:
    num_steps: int
    topk: int
    num_draft_tokens: int

    def __post_init__(self):
        if self.num_steps < 1 or self.topk < 1 or self.num_draft_tokens < 2:
            raise DiagError("tree shape out of range", field="tree shape",
                            expected="num_steps >= 1, topk >= 1, num_draft_tokens >= 2",
                            found=(self.num_steps, self.topk, self.num_draft_tokens))

    @property
    def name(self) -> str:
        """"chain-3" for a topk=1 chain with D = S+1, else "s3-k4-d5"."""
        if self.topk == 1 and self.num_draft_tokens == self.num_steps + 1:
            return f"chain-{self.num_steps}"
        return f"s{self.num_steps}-k{self.topk}-d{self.num_draft_tokens}"

    @property
    def num_candidates(self) -> int:
        """K + (S-1)·K²: step 0 proposes K nodes, each later step K×K expansions.
        Example: S=3, K=4 -> 4 + 2·16 = 36."""
        return self.topk + (self.num_steps - 1) * self.topk ** 2

    @property
    def wasted_steps(self) -> int:
        """Draft steps per round that can never be verified: a node at depth j needs its j - 1
        ancestors in the verify tree too, so D - 1 verified tokens reach depth D - 1 at most.
        Example: s5-k2-d3 drafts 5 steps, verifies 2 tokens -> depth <= 2, 3 steps wasted.
        (topk = 1 is rewritten by SGLang to D = S + 1 and wastes none.)"""
        return max(0, self.num_steps - (self.num_draft_tokens - 1)) if self.topk > 1 else 0

    def __str__(self) -> str:
        return self.name


def _preset(s: int, k: int, d: int) -> TreeShape:
    return TreeShape(s, k, d)


PAD = -1  # token id of padding nodes and of windows past a sequence end; equals no real token

PRESETS: dict[str, TreeShape] = {
    **{f"chain-{s}": _preset(s, 1, s + 1) for s in range(1, 9)},
    "s3-k4-d5": _preset(3, 4, 5),
    "s3-k4-d8": _preset(3, 4, 8),
    "s5-k4-d8": _preset(5, 4, 8),        # SGLang auto default, Llama family
    "s3-k1-d4": _preset(3, 1, 4),        # SGLang auto default, DeepSeek family (= chain-3)
    "s2-k2-d4": _preset(2, 2, 4),
    "s4-k2-d8": _preset(4, 2, 8),
    "s3-k8-d16": _preset(3, 8, 16),
    "sglang-llama-default": _preset(5, 4, 8),
    "sglang-deepseek-default": _preset(3, 1, 4),
}

_CHAIN = re.compile(r"^chain-([1-9][0-9]*)$")
_SKD = re.compile(r"^s([1-9][0-9]*)-k([1-9][0-9]*)-d([1-9][0-9]*)$")


def tree_shape(text: str | TreeShape, *, field: str = "tree") -> TreeShape:
    """Parse "chain-3", "s3-k4-d5" or a preset name."""
    if isinstance(text, TreeShape):
        return text
    t = text.strip().lower()
    if t in PRESETS:
        return PRESETS[t]
    if m := _CHAIN.match(t):
        return TreeShape(int(m[1]), 1, int(m[1]) + 1)
    if m := _SKD.match(t):
        return TreeShape(int(m[1]), int(m[2]), int(m[3]))
    raise DiagError("not a tree shape", field=field,
                    expected="chain-S, sS-kK-dD (e.g. s3-k4-d5) or one of " + ", ".join(PRESETS),
                    found=repr(text))


# --- derivations from a parents tensor ---------------------------------------

def reach(parents: torch.Tensor) -> torch.Tensor:
    """bool [..., D, D]: reach[i, j] iff j is i or is reached from i by following parents (the
    nodes p^k(i), k >= 0, up to a node with none). Found by squaring the one-step relation
    ceil(log2(D - 1)) times (a handful of batched matmuls, not D rounds of gathers: inside a CUDA
    graph each round is a few kernels), since every node reachable from i is reached within
    D - 1 steps. Example: parents [-1, 0, 0, 1] -> row 3 = [T, T, F, T]."""
    D = parents.shape[-1]
    ids = torch.arange(D, device=parents.device)
    one = ((parents[..., None] == ids) & (parents >= 0)[..., None]) | (ids[:, None] == ids)   # self or parent
    m = one.float()
    for _ in range(max(D - 2, 0).bit_length()):     # 2^k >= D - 1 steps
        m = (m @ m).clamp(max=1.0)
    return m > 0


def depths(parents: torch.Tensor, reached: torch.Tensor | None = None) -> torch.Tensor:
    """Depth of every node [..., D] (root and detached nodes: 0): how many parents lead from it
    to a node without one; D where they never do (a cycle, in junk parents). From `reach`: the
    nodes reached, less itself, when one of them has no parent. reached: `reach(parents)` where
    the caller has it already.
    Example: parents [-1, 0, 0, 1] -> depths [0, 1, 1, 2]."""
    r = reach(parents) if reached is None else reached
    ends = (r & (parents < 0)[..., None, :]).any(-1)
    return torch.where(ends, r.sum(-1) - 1, torch.full_like(parents, parents.shape[-1]))


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """bool [..., D, D]: mask[i, j] iff j is i or an ancestor of i (what node i
    attends to among the tree nodes in the verify pass): `reach`.
    Example: parents [-1, 0, 0, 1] -> row 3 = [T, T, F, T]."""
    return reach(parents)


def positions(parents: torch.Tensor, root_position, reached: torch.Tensor | None = None) -> torch.Tensor:
    """Absolute positions of the nodes: root_position + depth.
    root_position is an int or a tensor broadcastable to parents[..., 0]; reached as in `depths`.
    Example: parents [-1, 0, 0, 1] (depths [0, 1, 1, 2]) with the root at 7
      -> positions [7, 8, 8, 9]."""
    root = torch.as_tensor(root_position, dtype=parents.dtype, device=parents.device)
    d = depths(parents, reached)
    return d + root[..., None] if root.dim() else d + root
