"""The Llama-style (GQA) attention of LlamaForCausalLMEagle3 and speculators' Eagle3 layer.

Input x = cat[input_layernorm(e), hidden_norm(h)], [..., 2H]; q = q_proj(x) as [nh, hd],
k, v = k_proj(x), v_proj(x) as [nkv, hd], each kv head repeated nh / nkv times; with qk_norm
(speculators' qwen3 layer config, Qwen3Attention) a per-head RMSNorm over hd is applied to q
and k before RoPE. RoPE is transformers' own LlamaRotaryEmbedding, so every rope_scaling a
Llama config can name (llama3, yarn, dynamic, ...) is computed as the engines do; softmax
scale hd^-0.5. Example: nh 4, nkv 2 -> kv heads [0, 0, 1, 1].

This module knows the attention's arithmetic up to scores; the caller masks and mixes.
"""

from __future__ import annotations

import torch
from torch import nn

from diag.drafter.layers import RMSNorm, RopeTable, for_heads, rotate


class Rope(RopeTable):
    """transformers' LlamaRotaryEmbedding, frequencies kept float32 (layers.RopeTable);
    forward(x, positions [B, N]) -> cos, sin [B, N, hd] in x's dtype."""

    def __init__(self, cfg):
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        kwargs = dict(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                      head_dim=cfg.dim_head, max_position_embeddings=cfg.max_position_embeddings,
                      rope_theta=cfg.rope_theta)
        if cfg.rope_scaling:
            kwargs["rope_scaling"] = dict(cfg.rope_scaling)
        super().__init__(LlamaRotaryEmbedding(LlamaConfig(**kwargs)))


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hd, nh, nkv = cfg.dim_head, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(2 * cfg.hidden_size, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.rope = Rope(cfg)
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.scale = hd ** -0.5
        self.fp32_math = False       # Eagle3Drafter.set_numerics

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x [B, Q, (R,) 2H], positions [B, Q] -> q [..., nh, hd], k, v [..., nh, hd]
        (kv heads repeated), RoPE applied."""
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.nh, self.hd)
        k = self.k_proj(x).view(*lead, self.nkv, self.hd)
        v = self.v_proj(x).view(*lead, self.nkv, self.hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rope(x, positions)                            # [B, Q, hd]
        cos, sin = for_heads(cos, q), for_heads(sin, q)
        if self.fp32_math:           # vLLM-CPU: float32 from the bf16 cos/sin cache, one rounding
            q, k = (rotate(t.float(), cos.float(), sin.float()).to(t.dtype) for t in (q, k))
        else:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        rep = self.nh // self.nkv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=-2), v.repeat_interleave(rep, dim=-2)
        return q, k, v
