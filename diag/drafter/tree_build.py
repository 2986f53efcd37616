"""Draft-tree construction, step by step, exactly as SGLang 0.5.x builds it.

The caller (replay) interleaves these steps with the drafter's forwards:
    beam = first_step(logprobs0, K)                 # logprobs0 [P, V]
    for step in 1..S-1:
        logprobs = drafter(beam.tokens, hidden[beam.source_row])   # [P, K, V]
        beam = expand_step(beam, logprobs)
    tree = finalize(history, D)
This module knows scores, token ids and indices; it knows nothing about models.

Mirrored rules (SGLang select_top_k_tokens / organize_draft_results /
build_tree_kernel_efficient):
- Scores are PROBABILITIES and cumulative scores are PRODUCTS (not log sums):
  probs = softmax(draft logits); topk_p, topk_index = top-K of probs per row.
- Step 0: the K tokens are candidates 0..K-1 with score topk_p; parent = root.
- Step s >= 1: expand_scores[r, c] = beam_score[r] · topk_p[r, c]  ([P, K, K]);
  ALL K² expansions become candidates K + K²(s-1) + r·K + c; the best K
  (flattened order r·K + c) become the next beam, in score order.
- Candidates total K + (S-1)K² (flat order: step, then beam row, then column).
- Tree = the D-1 best candidates by score, then SORTED BY CANDIDATE INDEX, so node i
  (1..D-1) is the i-th selected candidate in flat order; node 0 is the root.
- Parent of candidate c: SGLang's parent_list[c // K] (the candidate index of the
  beam row that was expanded). A node whose parent candidate was not selected is
  an orphan: SGLang prints "invalid eagle tree" and links it nowhere, so greedy
  verification can never reach it. Here: valid = False, parents = -1.
- Ties: SGLang uses torch.topk (torch.max when K = 1) on CUDA, whose order among
  equal scores is unspecified. diag breaks ties toward the LOWER candidate index
  (a stable sort's order, found by one topk over value-then-index keys, `_top`),
  deterministic on every device. NaN ranks above every number, as
  in torch.topk; NaN draft logits are how SGLang's orphans arise in practice.
- D-1 > K + (S-1)K²: SGLang fails (torch.topk k out of range); diag keeps every
  candidate and pads the tree with valid = False nodes (token PAD, depth 0).

Worked example (P=1, K=2, S=2, D=4). Step 0 probs top-2: tokens [a, b] scores
[0.6, 0.3] -> candidates 0:a(0.6) 1:b(0.3). Step 1, row 0 (a) top-2 [c .5, d .4],
row 1 (b) top-2 [e .9, f .1] -> expand_scores [[.30, .24], [.27, .03]] ->
candidates 2:c(.30) 3:d(.24) 4:e(.27) 5:f(.03); beam = [c (row 0), e (row 1)].
Best 3 of [.6, .3, .30, .24, .27, .03] = candidates {0, 2, 1}
(tie .30 = .30 -> lower index 1 before 2) -> sorted [0, 1, 2] ->
tokens [root, a, b, c], parents [-1, 0, 0, 1], depths [0, 1, 1, 2].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diag.trees import PAD



@dataclass(frozen=True)
class Beam:
    """State after one draft step, plus every candidate that step proposed.

    step          0 for first_step, s for the s-th expand_step
    tokens        [P, K] beam tokens (target ids): the next draft forward's inputs
    scores        [P, K] cumulative probabilities of the beam rows
    source_row    [P, K] which row of the previous beam each row expands
                  (first step: 0..K-1, every row descends from the root)
    node          [P, K] flat candidate index of each beam row
    cand_tokens   [P, C] tokens of this step's candidates (C = K, then K²)
    cand_scores   [P, C] their cumulative probabilities
    cand_parent   [P, C] flat candidate index of each one's parent (-1 = root)
    """

    step: int
    tokens: torch.Tensor
    scores: torch.Tensor
    source_row: torch.Tensor
    node: torch.Tensor
    cand_tokens: torch.Tensor
    cand_scores: torch.Tensor
    cand_parent: torch.Tensor

    @property
    def topk(self) -> int:
        return self.tokens.shape[-1]


@dataclass(frozen=True)
class DraftTree:
    """One verify tree per position. Node 0 is the root (bonus) token.

    tokens   [P, D] int64 (root filled by the caller or finalize(root_tokens=...);
             PAD until then)
    parents  [P, D] int64, parents[:, 0] = -1; -1 also for orphans and padding
    depths   [P, D] int64, the draft depth of each node (root 0, padding 0;
             orphans keep their true depth)
    valid    [P, D] bool, False for padding and orphans (unreachable)
    scores   [P, D] float32 cumulative probability (root 1.0, padding 0.0)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    valid: torch.Tensor
    scores: torch.Tensor


def _top(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim, ties to the lower index, NaN first (torch.topk order), in one
    torch.topk over a key that orders by value, then by index: the value's float32 bits made
    monotone (`_sortable`) in the high half of an int64, the reversed index in the low half. No
    host sync, whatever the ties. Example: [.2, .5, .1, .3], k = 2 -> values [.5, .3], indices
    [1, 3]; [.2, .5, .2, .2], k = 2 -> [.5, .2] at [1, 0] (of the three .2, the lowest index)."""
    width = values.shape[-1]
    rev = torch.arange(width - 1, -1, -1, device=values.device, dtype=torch.int64)
    key = _sortable(values) * (1 << 32) + rev
    idx = torch.topk(key, k, dim=-1).indices
    return values.gather(-1, idx), idx


def _sortable(x: torch.Tensor) -> torch.Tensor:
    """int64 keys in the order of x's float32 values: NaN as +inf (above every number, tied with
    it), -0.0 as 0.0, a negative value's bits flipped so that larger values have larger keys.
    Example: [-2.0, -1.0, -0.0, 0.0, 1.0, nan] -> keys increasing, the -0.0 and 0.0 equal."""
    x = torch.where(torch.isnan(x), torch.full_like(x, float("inf")), x).float() + 0.0
    bits = x.view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _map(tokens: torch.Tensor, token_map: torch.Tensor | None) -> torch.Tensor:
    """Draft-vocab ids -> target ids (SGLang: hot_token_id[topk_index])."""
    return tokens if token_map is None else token_map[tokens]


def first_step(logprobs: torch.Tensor, topk: int, *, token_map: torch.Tensor | None = None) -> Beam:
    """Top-K of the first draft distribution. logprobs [P, V] (log-softmax of the
    draft logits); token_map [V] optional draft->target id table (t = d + d2t[d])."""
    probs = logprobs.float().exp()  # [P, V]
    p, idx = _top(probs, topk)  # [P, K]
    P = probs.shape[0]
    rows = torch.arange(topk, device=probs.device).expand(P, topk)  # [P, K]
    tokens = _map(idx, token_map)
    return Beam(0, tokens, p, rows, rows, tokens, p,
                torch.full((P, topk), -1, dtype=torch.int64, device=probs.device))


def expand_step(beam: Beam, logprobs: torch.Tensor, *,
                token_map: torch.Tensor | None = None) -> Beam:
    """K×K expansions scored by cumulative probability; keep the best K.
    logprobs [P, K, V]: row r is the draft distribution after beam row r.
    Flat expansion index e = r·K + c (row r, its c-th top token).
    Example (K=2): beam scores [.6, .3], row tops [[.5, .4], [.9, .1]] ->
      expand [.30, .24, .27, .03] -> keep e = [0, 2] -> source_row [0, 1]."""
    K, s = beam.topk, beam.step + 1
    P = logprobs.shape[0]
    p, idx = _top(logprobs.float().exp(), K)  # [P, K, K]
    expand = beam.scores[:, :, None] * p  # [P, K, K]
    flat_scores = expand.reshape(P, K * K)  # [P, K²]
    flat_tokens = _map(idx, token_map).reshape(P, K * K)  # [P, K²]
    kept_scores, kept = _top(flat_scores, K)  # [P, K] indices into K²
    offset = K + K * K * (s - 1)  # first candidate index of this step
    cand_parent = beam.node.repeat_interleave(K, dim=-1)  # [P, K²]: e -> node of row e // K
    return Beam(s, flat_tokens.gather(-1, kept), kept_scores, kept // K, kept + offset,
                flat_tokens, flat_scores, cand_parent)


def _gather_nodes(history: list[Beam], sel: torch.Tensor):
    """Tokens, scores, parent candidates and depths of the selected candidates."""
    tokens = torch.cat([b.cand_tokens for b in history], dim=-1)  # [P, N]
    scores = torch.cat([b.cand_scores for b in history], dim=-1)  # [P, N]
    parent = torch.cat([b.cand_parent for b in history], dim=-1)  # [P, N]
    depth = torch.cat([torch.full_like(b.cand_parent, b.step + 1) for b in history], dim=-1)
    return (tokens.gather(-1, sel), scores.gather(-1, sel), parent.gather(-1, sel),
            depth.gather(-1, sel))


def _parent_nodes(sel: torch.Tensor, parent_cand: torch.Tensor) -> torch.Tensor:
    """Node index of each selected candidate's parent: 0 for the root, j+1 if the
    parent is sel[j], -1 if the parent was not selected (orphan). [P, M]."""
    hit = sel[:, None, :] == parent_cand[:, :, None]  # [P, M, M]: child i, selected j
    found = hit.any(dim=-1)
    j = hit.to(torch.int64).argmax(dim=-1) + 1
    root = parent_cand < 0
    return torch.where(root, 0, torch.where(found, j, -1))


def finalize(history: list[Beam], num_draft_tokens: int,
             root_tokens: torch.Tensor | None = None) -> DraftTree:
    """The D-1 best candidates as a tree (see the module docstring for the rule).
    history: [first_step beam, expand_step beams...] (S beams for depth S)."""
    scores_all = torch.cat([b.cand_scores for b in history], dim=-1)  # [P, N]
    P, N = scores_all.shape
    M = min(num_draft_tokens - 1, N)
    sel = torch.sort(_top(scores_all, M)[1], dim=-1).values  # [P, M] ascending
    tok, sc, pc, dep = _gather_nodes(history, sel)
    par = _parent_nodes(sel, pc)  # [P, M]
    valid = par >= 0
    for _ in range(len(history)):  # orphan-ness passes down: a child of an orphan is unreachable
        valid = valid & torch.where(par > 0, valid.gather(-1, (par - 1).clamp(min=0)), True)
    return _assemble(tok, sc, torch.where(valid, par, -1), dep, valid, num_draft_tokens, root_tokens)


def _assemble(tok, sc, par, dep, valid, D: int, root_tokens) -> DraftTree:
    """Prepend the root, append padding up to D nodes."""
    P, M = tok.shape
    dev = tok.device
    pad = D - 1 - M

    def col(v, dtype, root_val, pad_val):
        root = torch.full((P, 1), root_val, dtype=dtype, device=dev)
        tail = torch.full((P, pad), pad_val, dtype=dtype, device=dev)
        return torch.cat([root, v.to(dtype), tail], dim=-1)

    tokens = col(tok, torch.int64, PAD, PAD)
    if root_tokens is not None:
        tokens[:, 0] = root_tokens
    return DraftTree(tokens, col(par, torch.int64, -1, -1), col(dep, torch.int64, 0, 0),
                     col(valid, torch.bool, True, False), col(sc, torch.float32, 1.0, 0.0))
