"""INT4 pack-quantized numerics: golden examples and bit-for-bit agreement
with compressed-tensors' own functions."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.errors import DiagError
from diag.int4.format import (check_group, dequantize, fake_quantize, group_scales, pack_int4,
                              quantize_rtn, unpack_int4)

ct_helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
from compressed_tensors.quantization import QuantizationArgs  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import (  # noqa: E402
    dequantize as ct_dequantize, fake_quantize as ct_fake_quantize, quantize as ct_quantize)
from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp  # noqa: E402


def test_pack_golden_word():
    # u = q + 8 = [0, 1, 8, 15, 9, 10, 11, 7] -> 0x7BA9F810, least significant nibble first
    q = torch.tensor([[-8, -7, 0, 7, 1, 2, 3, -1]], dtype=torch.int8)
    assert pack_int4(q).tolist() == [[0x7BA9F810]]
    assert pack_int4(torch.full((1, 8), 7, dtype=torch.int8)).tolist() == [[-1]]  # 0xFFFFFFFF
    assert pack_int4(torch.full((1, 8), -8, dtype=torch.int8)).tolist() == [[0]]
    assert pack_int4(torch.zeros(1, 8, dtype=torch.int8)).tolist() == [[0x88888888 - 2**32]]


def test_unpack_golden_word():
    words = torch.tensor([[0x7BA9F810, -1]], dtype=torch.int32)
    assert unpack_int4(words, 16).tolist() == [[-8, -7, 0, 7, 1, 2, 3, -1] + [7] * 8]


def test_quantize_golden_group():
    # absmax 7.5 -> scale 1.0; 7.5 clamps to 7, -7.5 rounds half-to-even to -8,
    # 2.5 -> 2, 0.5 -> 0, 1.5 -> 2
    w = torch.tensor([[7.5, -7.5, 2.5, 0.5, -0.5, 1.5, 3.0, 0.0]])
    q, scale = quantize_rtn(w, 8)
    assert scale.tolist() == [[1.0]]
    assert q.tolist() == [[7, -8, 2, 0, 0, 2, 3, 0]]
    assert fake_quantize(w, 8).tolist() == [[7.0, -8.0, 2.0, 0.0, 0.0, 2.0, 3.0, 0.0]]


def test_scale_is_absmax_over_7_5_and_zero_group_gets_eps():
    w = torch.tensor([[0.3, -1.5, 0.75, 0, 0, 0, 0, 0] + [0.0] * 8], dtype=torch.bfloat16)
    scale = group_scales(w, 8)
    assert scale.dtype == torch.bfloat16
    assert scale[0, 0] == torch.tensor(1.5, dtype=torch.bfloat16) / torch.tensor(7.5, dtype=torch.bfloat16)
    assert scale[0, 1].item() == torch.finfo(torch.bfloat16).eps


def test_group_must_divide_width():
    with pytest.raises(DiagError, match="group size"):
        check_group(96, 64, field="x.weight")
    with pytest.raises(DiagError):
        quantize_rtn(torch.zeros(2, 48), 32)
    assert check_group(7168, 32) == 224


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-8, 7), min_size=8, max_size=64).filter(lambda v: len(v) % 8 == 0))
def test_pack_unpack_roundtrip(values):
    q = torch.tensor([values], dtype=torch.int8)
    assert torch.equal(unpack_int4(pack_int4(q), len(values)), q)


def _args(group_size):
    return QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                            group_size=group_size)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("group_size", [32, 128])
def test_matches_compressed_tensors(dtype, group_size):
    torch.manual_seed(group_size)
    w = (torch.randn(48, 256) * torch.rand(48, 1) * 0.1).to(dtype)
    w[3, :group_size] = 0  # an all-zero group
    args = _args(group_size)
    ct_scale, ct_zp = compute_dynamic_scales_and_zp(w, args, module=torch.nn.Module())
    q, scale = quantize_rtn(w, group_size)
    assert scale.dtype == ct_scale.dtype and torch.equal(scale, ct_scale)
    ct_q = ct_quantize(w, ct_scale, ct_zp, args, dtype=torch.int8)
    assert torch.equal(q, ct_q)
    packed = pack_int4(q)
    assert torch.equal(packed, ct_helpers.pack_to_int32(ct_q, 4))
    assert torch.equal(unpack_int4(packed, 256), ct_helpers.unpack_from_int32(packed, 4, w.shape))
    assert torch.equal(dequantize(packed, scale, w.shape, group_size),
                       ct_dequantize(ct_q, ct_scale, args=args))
    assert torch.equal(fake_quantize(w, group_size), ct_fake_quantize(w, ct_scale, ct_zp, args))


def test_stacked_experts_match_per_expert():
    torch.manual_seed(1)
    w = torch.randn(4, 16, 64, dtype=torch.bfloat16)  # [E, out, in]
    q, scale = quantize_rtn(w, 32)
    packed = pack_int4(q)  # [E, out, in/8]
    assert packed.shape == (4, 16, 8) and scale.shape == (4, 16, 2)
    assert torch.equal(packed, ct_helpers.pack_to_int32(q, 4))
    for e in range(4):
        qe, se = quantize_rtn(w[e], 32)
        assert torch.equal(q[e], qe) and torch.equal(scale[e], se)
    assert torch.equal(dequantize(packed, scale, w.shape, 32, torch.bfloat16), fake_quantize(w, 32))


def test_dequantize_dtype_and_error_bound():
    torch.manual_seed(2)
    w = torch.randn(8, 64)
    q, scale = quantize_rtn(w, 32)
    packed = pack_int4(q)
    assert dequantize(packed, scale, w.shape, 32, torch.bfloat16).dtype == torch.bfloat16
    back = dequantize(packed, scale, w.shape, 32)  # in scale's dtype (fp32)
    # RTN error is at most half a step (the clamped +7.5 * scale edge is exactly half)
    step = scale.repeat_interleave(32, dim=1)
    assert ((back - w).abs() <= step * 0.5 * (1 + 1e-5)).all()
