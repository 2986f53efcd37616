"""DeepSeek-V3's attention (MLA) on its latent cache, as SGLang and vLLM decode it.

transformers caches MLA's latents, per slot the normed kv_a output c [kv_lora_rank] and the
roped shared key k_rot [qk_rope_head_dim], and at every forward expands every cached slot
through kv_b_proj into per-head keys and values (`expand_kv`). A decode step or a verify then
writes and reads B x L x H x (qk_nope + v + qk_rope) values per layer for a few new tokens: at
Kimi's widths (H 64, nope 128, v 128, rope 64, lora 512) and 96 rows of 250 slots, about 3 GB
a layer in bf16 (kv_b_proj's output, the keys assembled from it, both read by the attention),
against 28 MB of latents. The engines absorb kv_b_proj into the query and the output instead
(DeepSeek-V2 paper, section 2.1.2; SGLang's forward_absorb, vLLM's MLACommonImpl):
    k_nope_h = W_uk_h c  ->  q_nope_h . k_nope_h = (W_uk_h^T q_nope_h) . c
    v_h = W_uv_h c       ->  sum_s p_s v_h,s = W_uv_h (sum_s p_s c_s)
so the scores are q_lat_h . c + q_rot_h . k_rot over the cached latents themselves (one key
head for all H query heads), and the output's latent is mapped by W_uv_h once per query. The same
numbers up to the order of the sums (float32 on the CPU: within 1e-4 of transformers'; the
tests hold it), the scores and softmax in float32 inside torch's attention as in the engines'
MLA kernels.

Where: the decode loop (replay/decode_loop.py), the greedy generation (target/generate.py) and
the step-cost probe (diagnoses/pricing/costs.py), on CUDA, where the expansion was a verify's
largest cost after the experts (reports/bench/NOTES.md, seventeenth stop); on the CPU they keep
transformers' path, so every CPU number is transformers' own (`latent_wanted`; DIAG_MLA_LATENT=0/1
overrides). The teacher-forced passes that capture hidden states always run transformers' path.
`latent_mla(model)` switches a loaded model's MLA layers to this for the duration of a block:
their expand_kv hands the cached latents on unexpanded (as "keys" the roped k_rot, as "values"
c) and the config names `latent_attention`, which transformers' AttentionInterface then calls.
Masks: the 4D additive bias diag's forwards pass (target/tree_forward.py) goes through
untouched; a 2D mask (generate) is built as the eager attention's (an additive bias). A layer
whose kv_b_proj is not a plain float Linear (quantised) keeps transformers' own path, and so
does one whose kv_b_proj an offloading device map left on the meta device (its weights arrive
with its own forward), and a model attending with another implementation than transformers'
own (an engine's, target/engine_numerics.py). This module knows transformers' MLA;
nothing about drafters, trees or reports.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F
from torch import nn

from diag.errors import env_switch

NAME = "diag_mla_latent"
FOLD_MAX_QUERIES = 64               # queries a head up to which latent_attention folds the heads into them
STOCK = ("sdpa", "eager", None)     # transformers' own attentions: another (an engine's, engine_numerics) is kept


def latent_wanted(dev) -> bool:
    """MLA on its latents: DIAG_MLA_LATENT "1" or "0" where set, else on CUDA only."""
    value = env_switch("DIAG_MLA_LATENT")
    return torch.device(dev).type == "cuda" if value is None else value


def _absorbable(m: nn.Module) -> bool:
    proj = getattr(m, "kv_b_proj", None)
    return (callable(getattr(m, "expand_kv", None)) and isinstance(proj, nn.Linear) and proj.weight.is_floating_point()
            and proj.weight.device.type != "meta"          # offloaded by a device map: loaded only by its forward
            and all(hasattr(m, a) for a in ("qk_nope_head_dim", "v_head_dim", "qk_rope_head_dim", "num_heads")))


def _latent_kv(self, kv_nope: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """expand_kv's replacement: "keys" k_rot [B, 1, L, rope], "values" c [B, 1, L, lora], as cached."""
    return k_rot, kv_nope


def _weights(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's weight [H * (nope + v), lora] as W_uk [H, nope, lora] and W_uv [H, v, lora] (views)."""
    w = m.kv_b_proj.weight.view(m.num_heads, m.qk_nope_head_dim + m.v_head_dim, -1)
    return w[:, :m.qk_nope_head_dim], w[:, m.qk_nope_head_dim:]


def latent_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, H, Q, nope + rope]; key k_rot [B, 1, L, rope] and value c [B, 1, L, lora] from
    `_latent_kv`; attention_mask an additive bias or a boolean mask broadcastable to [B, H, Q, L]
    (or None: every slot, causal over the last Q when Q > 1). Returns [B, Q, H, v] as
    transformers' attention functions do. The scores and the softmax are torch's attention's
    (float32 inside on every backend): queries [W_uk_h^T q_nope, q_rot] against the one key head
    [c, k_rot], values c; then W_uv_h per head. The H heads are folded into the query axis (one
    attention head of H x Q queries, `fold_heads`), as the engines' MLA decode kernels do: every
    slot's latent is read once a row, not once a head (a view expanded over the heads is read H
    times by torch's attention kernels: at Kimi's 64 heads, 96 rows of 200 slots, 2.7 GB a layer
    against 42 MB; reports/bench/NOTES.md, twenty-second stop). Only up to FOLD_MAX_QUERIES
    queries a head (decode steps, drafts, verifies): the folded mask is a copy, H x Q x L a row,
    and past a kernel's query tile the unfolded heads read the slots as seldom (a prefill)."""
    B, H, Q, _ = query.shape
    nope, lora = module.qk_nope_head_dim, value.shape[-1]
    w_uk, w_uv = _weights(module)
    q_nope, q_rot = query[..., :nope], query[..., nope:]
    q_lat = torch.matmul(q_nope.transpose(0, 1).reshape(H, B * Q, nope), w_uk.to(query.dtype))      # [H, BQ, lora]
    q = torch.cat([q_lat.view(H, B, Q, lora).transpose(0, 1), q_rot], dim=-1)                     # [B, H, Q, lora+rope]
    L = key.shape[-2]
    k = torch.cat([value, key], dim=-1)                                                  # [B, 1, L, lora+rope]
    mask = attention_mask[..., :L] if attention_mask is not None else None
    if mask is None and Q > 1:
        see = torch.arange(L, device=query.device)[None] <= torch.arange(Q, device=query.device)[:, None] + (L - Q)
        mask = see[None, None]
    scale = scaling if scaling is not None else module.scaling
    if Q <= FOLD_MAX_QUERIES:
        q, mask = fold_heads(q, mask, L)
        if Q == 1:                          # a decode step: two matmuls (`one_query_attention`)
            out_lat = one_query_attention(q, k, value, mask, scale)
        else:
            out_lat = F.scaled_dot_product_attention(q, k, value, attn_mask=mask, scale=scale)
        out_lat = out_lat.view(B, H, Q, lora)
    else:                                   # a prefill: the heads' queries already fill the kernel's tiles
        out_lat = F.scaled_dot_product_attention(q, k.expand(B, H, L, k.shape[-1]), value.expand(B, H, L, lora),
                                                 attn_mask=mask, scale=scale)
    out = torch.matmul(out_lat.transpose(0, 1).reshape(H, B * Q, lora), w_uv.transpose(1, 2).to(value.dtype))
    return out.view(H, B, Q, -1).permute(1, 2, 0, 3).contiguous(), None                              # [B, Q, H, v]


def one_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                        scale: float) -> torch.Tensor:
    """A decode step's folded attention (q [B, 1, H, d]: one query a head, `fold_heads`; k [B, 1, L, d],
    v [B, 1, L, dv]; mask boolean or additive, broadcastable to [B, 1, H, L]) as two matmuls: the
    scores in float32 (the bf16 products are exact in fp32, the sums fp32, as inside the fused
    kernels), the mask, the softmax in float32, then the probabilities in v's dtype times v (as the
    fused kernels' second product). torch's fused attention takes this shape (Kimi: d 576 = lora +
    rope, one key head) to its slow variant for head widths past 128 (cutlass's "gmem" kernel: 63
    us a layer at 8 rows of 575 slots on the H100); the matmuls take 12% off the greedy decode step
    (1.180 -> 1.042 ms a layer-step in one process, reports/bench/NOTES.md, twenty-sixth stop). The scores are
    B x H x L floats (48 rows, 64 heads, 1,024 slots: 12.6 MB), so only for one query a head."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale                  # [B, 1, H, L]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)                     # [B, 1, H, dv]


def fold_heads(q: torch.Tensor, mask: torch.Tensor | None, L: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q [B, H, Q, d] as one head of H x Q queries [B, 1, H * Q, d] (query h * Q + i is head h's
    query i), and the mask (broadcastable to [B, H, Q, L]) laid out the same way [B, 1, H * Q, L].
    Example: H 2, Q 3 -> queries (h0 q0, h0 q1, h0 q2, h1 q0, ...), each head's rows of the mask
    repeated in that order. Attention is per query row, so every row's scores, softmax and output
    are the unfolded attention's."""
    B, H, Q, d = q.shape
    q = q.reshape(B, 1, H * Q, d)
    if mask is not None:
        mask = mask.expand(B, H, Q, L).reshape(B, 1, H * Q, L)
    return q, mask


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, latent_attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface, eager_mask
    except ImportError:                       # no mask registry: only 4D masks (diag's forwards) then
        return
    AttentionMaskInterface.register(NAME, eager_mask)


@contextlib.contextmanager
def latent_mla(model: nn.Module, on: bool = True):
    """Inside the block, the model's MLA layers attend over their latents (module docstring);
    yields how many layers were switched (0: none is MLA, `on` is False, or the model attends
    with an implementation other than transformers' own, which it keeps). Restored after."""
    layers = [m for m in model.modules() if _absorbable(m) and m.config._attn_implementation in STOCK] if on else []
    if not layers:
        yield 0
        return
    _register()
    configs = list({id(m.config): m.config for m in layers}.values())
    before = [c._attn_implementation for c in configs]
    for m in layers:
        m.expand_kv = types.MethodType(_latent_kv, m)
    for c in configs:
        c._attn_implementation = NAME
    try:
        yield len(layers)
    finally:
        for m in layers:
            del m.expand_kv
        for c, impl in zip(configs, before):
            c._attn_implementation = impl
