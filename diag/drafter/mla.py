"""Multi-latent attention (DeepSeek-V2/V3 MLA) of the Eagle3DeepseekV2ForCausalLM drafter
(SGLang 0.5.23 srt/models/kimi_k25_eagle3.py, Eagle3MLADecoderLayer over deepseek_v2.py's
DeepseekV2AttentionMLA), in its plain (non-absorbed) form.

Input x = cat[input_layernorm(e), hidden_norm(h)], [..., 2H] (the drafter doubles the width of
MLA's down projections; SGLang fuses q_a_proj and kv_a_proj_with_mqa into one
fused_qkv_a_proj_with_mqa [q_lora + kv_lora + rope, 2H]; checkpoints store the two halves):
  q        = q_b_proj(q_a_layernorm(q_a_proj(x)))         [..., nh, nope + rope]
  c, k_pe  = split(kv_a_proj_with_mqa(x), [kv_lora, rope])  k_pe shared by every head
  k_nope,v = split(kv_b_proj(kv_a_layernorm(c)), [nope, v]) [..., nh, nope], [..., nh, v]
  q = [q_nope, rope(q_pe)], k = [k_nope, rope(k_pe)]
  scale    = (nope + rope)^-0.5 * m^2, m = 0.1 * mscale_all_dim * ln(factor) + 1 under a
             scaled RoPE with factor > 1 (compute_mla_mscale_scaling), else 1.
  Example: Kimi (nope 128, rope 64, yarn factor 64, mscale_all_dim 1): m = 1.4159,
  scale = 192^-0.5 * 2.0048 = 0.1447.
The low-rank norms use the config's rms_norm_eps (SGLang; transformers' DeepseekV3Attention
uses its default 1e-6 there). RoPE covers the rope dims only and is interleaved (GPT-J
pairs, SGLang's is_neox_style = not rope_interleave, default True); it is computed as
transformers does, de-interleaving to rotate-half: [a0, b0, a1, b1] -> [a0, a1, b0, b1].

This module knows MLA's arithmetic up to scores; the caller masks and mixes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from diag.drafter.layers import RMSNorm, RopeTable, for_heads, rotate


@dataclass(frozen=True)
class MlaShape:
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def mla_scale(shape: MlaShape, rope_scaling: dict | None) -> float:
    """Softmax scale: qk_head_dim^-0.5, times m^2 under a scaled RoPE (module docstring)."""
    base = shape.qk_head_dim ** -0.5
    kind = (rope_scaling or {}).get("rope_type") or (rope_scaling or {}).get("type")
    if not rope_scaling or kind == "default":
        return base
    factor = float(rope_scaling.get("factor", 1.0))
    m = 1.0 if factor <= 1 else 0.1 * float(rope_scaling.get("mscale_all_dim", 0) or 0) * math.log(factor) + 1
    return base * m * m


class MlaRope(RopeTable):
    """transformers' DeepseekV3RotaryEmbedding over the rope dims (yarn included), frequencies
    kept float32 (layers.RopeTable); forward(x, positions) -> cos, sin [B, N, rope] each."""

    def __init__(self, cfg):
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

        kwargs = dict(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                      qk_rope_head_dim=cfg.mla.qk_rope_head_dim, head_dim=cfg.mla.qk_rope_head_dim,
                      max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta)
        if cfg.rope_scaling:
            kwargs["rope_scaling"] = dict(cfg.rope_scaling)
        super().__init__(DeepseekV3RotaryEmbedding(DeepseekV3Config(**kwargs)))


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[..., d] pairs (x0, x1), (x2, x3), ... -> [x0, x2, ..., x1, x3, ...]."""
    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)


class MlaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        m, nh, width = cfg.mla, cfg.num_attention_heads, 2 * cfg.hidden_size
        self.q_a_proj = nn.Linear(width, m.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(m.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(m.q_lora_rank, nh * m.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(width, m.kv_lora_rank + m.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, nh * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = nn.Linear(nh * m.v_head_dim, cfg.hidden_size, bias=False)
        self.rope = MlaRope(cfg)
        self.shape, self.nh = m, nh
        self.scale = mla_scale(m, cfg.rope_scaling)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return rotate(deinterleave(x) if self.shape.rope_interleave else x, cos, sin)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x [B, Q, (R,) 2H], positions [B, Q] -> q, k [..., nh, nope + rope], v [..., nh, v]."""
        m, lead = self.shape, x.shape[:-1]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(*lead, self.nh, m.qk_head_dim)
        q_nope, q_pe = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(*lead, self.nh, m.qk_nope_head_dim + m.v_head_dim)
        k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
        cos, sin = self.rope(x, positions)                                   # [B, Q, rope]
        cos, sin = for_heads(cos, q), for_heads(sin, q)
        q_pe, k_pe = self._rope(q_pe, cos, sin), self._rope(k_pe.unsqueeze(-2), cos, sin)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(*k_nope.shape[:-1], m.qk_rope_head_dim)], dim=-1)
        return q, k, v
