"""Greedy verification of drafts against the target's continuation (DESIGN.md §4).

Index convention, used everywhere in diag. The sequence is t_0 .. t_{T-1}.
A round is rooted at sequence index j: the target's hidden state at j has
already produced t_{j+1} (the root, which is also the bonus token the server
emits every round). Draft depth d (1..S) guesses t_{j+1+d}, so
    target_next[p, i] = t_{j+2+i}     for i = 0..S-1 (depth i+1).
Example: T = 10, j = 3, S = 3 -> root = t_4, target_next = [t_5, t_6, t_7].

A round accepts a draft tokens (0..S) and emits a+1 tokens; the next round
is rooted at j + a + 1 (see `trajectory`).

This module knows token ids and parent arrays; it knows nothing about how
drafts are produced, nor about metrics beyond the per-round count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from diag.trees import PAD

if TYPE_CHECKING:
    from diag.drafter.tree_build import DraftTree



def target_next_windows(target_argmax: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Rows of what each round must match, from the target's per-position argmax.

    target_argmax[..., j] = t_{j+1} (the target's greedy token after position j).
    Row j of the result = target_argmax[..., j+1 : j+1+S] = [t_{j+2}, ..., t_{j+1+S}],
    padded with PAD past the end.
    Example: argmax [a1, a2, a3, a4] (T = 4), S = 2 ->
      [[a2, a3], [a3, a4], [a4, PAD], [PAD, PAD]].
    """
    shifted = target_argmax[..., 1:]  # [..., T-1]
    pad = torch.full((*target_argmax.shape[:-1], num_steps), PAD, dtype=target_argmax.dtype,
                     device=target_argmax.device)
    padded = torch.cat([shifted, pad], dim=-1)  # [..., T-1+S]
    return padded.unfold(-1, num_steps, 1)  # [..., T, S]


def accepted_chain(draft_tokens: torch.Tensor, target_next: torch.Tensor) -> torch.Tensor:
    """Longest prefix where draft_tokens[p, i] == target_next[p, i] -> [P] int64.

    draft_tokens [P, S] (depth i+1 in column i), target_next [P, S].
    Example: draft [[5, 6, 9], [4, 6, 7], [5, 6, 7]], target [[5, 6, 7]] * 3
      -> [2, 0, 3].
    """
    match = (draft_tokens == target_next).to(torch.int64)  # [P, S]
    return match.cumprod(dim=-1).sum(dim=-1)  # [P]


def _node_matches(tree: "DraftTree", target_next: torch.Tensor) -> torch.Tensor:
    """ok[p, i]: node i is valid and its token equals the target at its depth.
    The root (depth 0) is always ok. -> bool [P, D]."""
    col = (tree.depths - 1).clamp(min=0)  # [P, D]
    want = target_next.gather(-1, col.clamp(max=target_next.shape[-1] - 1))  # [P, D]
    ok = tree.valid & (tree.tokens == want) & (tree.depths <= target_next.shape[-1])
    ok[..., 0] = True
    return ok


def accepted_path(tree: "DraftTree", target_next: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy walk from the root, as SGLang's VerifyTreeGreedy does.

    At each depth, among the children of the current node, take the FIRST (lowest
    node index) valid child whose token equals target_next[:, depth-1]; stop when
    none does. Returns (accepted [P] int64, path [P, S+1] int64) where path[p, 0] = 0,
    path[p, 1..a] are the accepted node indices and the rest is -1.
    Example: parents [-1, 0, 0, 1, 2], tokens [r, 5, 8, 6, 6], target [8, 6]
      -> node 2 (token 8, depth 1), then node 4 (child of 2, token 6)
      -> accepted 2, path [0, 2, 4].
    """
    P, D = tree.parents.shape
    S = target_next.shape[-1]
    ok = _node_matches(tree, target_next)  # [P, D]
    node_idx = torch.arange(D, device=ok.device).expand(P, D)  # [P, D]
    cur = torch.zeros(P, dtype=torch.int64, device=ok.device)  # [P]
    alive = torch.ones(P, dtype=torch.bool, device=ok.device)  # [P]
    path = torch.full((P, S + 1), -1, dtype=torch.int64, device=ok.device)
    path[:, 0] = 0
    for d in range(1, S + 1):
        cand = ok & (tree.parents == cur[:, None]) & (tree.depths == d)  # [P, D]
        first = torch.where(cand, node_idx, D).min(dim=-1).values  # [P], D = none
        alive = alive & (first < D)
        cur = torch.where(alive, first, cur)
        path[:, d] = torch.where(alive, first, -1)
    accepted = (path[:, 1:] >= 0).sum(dim=-1)  # [P]
    return accepted, path


def accepted_tree(tree: "DraftTree", target_next: torch.Tensor) -> torch.Tensor:
    """Accepted draft tokens per round [P] int64: the length of the greedy root
    path whose tokens equal the target's continuation (see accepted_path)."""
    return accepted_path(tree, target_next)[0]


def trajectory(accepted, start: int = 0) -> torch.Tensor:
    """Rounds a real decode visits: start at `start`, next = i + a_i + 1, stop past
    the end. `accepted` [P] is indexed by consecutive root positions j0..j0+P-1.
    Example: accepted [2, 0, 1, 0, 3, 1] -> visits [0, 3, 4]
      (0: a=2 -> 3; 3: a=0 -> 4; 4: a=3 -> 8, past the end).
    Returns int64 indices into `accepted`."""
    a = torch.as_tensor(accepted, dtype=torch.int64).reshape(-1).tolist()
    visited, i = [], start
    while i < len(a):
        visited.append(i)
        i += a[i] + 1
    return torch.tensor(visited, dtype=torch.int64)
