"""diag.target.fused_norm: transformers' RMSNorm in one Triton kernel on CUDA, switched for a
block and restored; elsewhere transformers' own forward, bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

from diag.target.fused_norm import MAX_WIDTH, _norms, fused_norms, fused_wanted


def _model(widths=(64, 16)) -> torch.nn.Module:
    m = torch.nn.Module()
    m.norms = torch.nn.ModuleList(DeepseekV3RMSNorm(w, eps=1e-6) for w in widths)
    m.other = torch.nn.LayerNorm(8)                       # not transformers' RMSNorm form: left alone
    for n in m.norms:
        n.weight.data.uniform_(0.5, 1.5)
    return m


def test_the_switch_finds_transformers_rmsnorms_and_restores_them():
    m = _model()
    assert _norms(m) == list(m.norms)
    with fused_norms(m) as n:
        assert n == 2 and all("forward" in vars(x) for x in m.norms)
        with fused_norms(m) as inner:                     # a block inside another switches none again
            assert inner == 0
        assert all("forward" in vars(x) for x in m.norms)
    assert not any("forward" in vars(x) for x in m.norms)
    with fused_norms(m, on=False) as n:
        assert n == 0


def test_on_the_cpu_it_is_transformers_forward_bit_for_bit(monkeypatch):
    monkeypatch.delenv("DIAG_FUSED_NORM", raising=False)
    assert fused_wanted("cpu") is False
    monkeypatch.setenv("DIAG_FUSED_NORM", "1")
    assert fused_wanted("cpu") is True                    # the switch says so; the CPU input still falls back
    m = _model()
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    m.norms[0].to(torch.bfloat16)
    want = m.norms[0](x)
    with fused_norms(m):
        got = m.norms[0](x)
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel runs on CUDA")
@pytest.mark.parametrize("width", [512, 1536, 7168])
def test_the_kernel_is_transformers_rmsnorm_to_a_bf16_step_on_cuda(width):
    """Kimi's three widths (kv_a's latent, q_a's, the hidden), bf16 rows and weight: at least
    99.9% of the outputs bit for bit, the rest one bf16 step apart (a variance's last fp32 bit:
    the sum of squares in another order); the module docstring's worked example exactly."""
    torch.manual_seed(0)
    norm = DeepseekV3RMSNorm(width, eps=1e-6).cuda().to(torch.bfloat16)
    norm.weight.data.uniform_(0.5, 1.5)
    x = (torch.randn(37, width, device="cuda") * 3).to(torch.bfloat16)
    want = norm(x)
    holder = torch.nn.Module()
    holder.norm = norm
    with fused_norms(holder) as n:
        got = norm(x)
    assert n == 1 and got.dtype == want.dtype and got.shape == want.shape
    same = (got == want).float().mean().item()
    step = (want.float().abs() * 2 ** -7).clamp(min=1e-30)              # one bf16 step at the value
    assert same >= 0.999 and bool(((got.float() - want.float()).abs() <= step).all())
    from diag.target.fused_norm import rms_norm
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    ex = rms_norm(torch.tensor([[3.0, 4.0]], **bf16), torch.tensor([1.0, 2.0], **bf16), 0.0)
    assert ex.tolist() == [[0.84765625, 2.265625]] and MAX_WIDTH >= 7168
