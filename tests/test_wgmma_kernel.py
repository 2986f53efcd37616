"""diag.int4.wgmma_kernel, the explicit Hopper pipeline of the grouped INT4 GEMM: on an H200
(sm_90 with Gluon) its outputs are the Triton kernel's bit for bit, for one to three
sub-blocks, both queue disciplines and shallow K; at A = identity out^T is
format.dequantize's bits. Elsewhere a "wgmma" tile runs the Triton kernel of the same tile."""

import pytest
import torch

from diag.int4 import fast
from diag.int4.fast import grouped_int4_gemm, route, to_kernel_layout, wgmma_runs
from tests.test_bench import _experts, grouped_tiles  # noqa: F401  (the fixture)

on_hopper = torch.cuda.is_available() and wgmma_runs(torch.device("cuda"))


def _gemms(m, x, idx, w, E, rows):
    r = route(idx, E, rows)
    h = grouped_int4_gemm(x, m.gate_up_proj_packed, m.gate_up_proj_scale, r, 32, "gate_up", a_div=idx.shape[1],
                          piece=m.kernel_layout)
    y = grouped_int4_gemm(h[:, : h.shape[1] // 2].contiguous(), m.down_proj_packed, m.down_proj_scale, r, 32,
                          "down", a_div=1, piece=m.kernel_layout, route_w=w)
    return h, y


@pytest.mark.skipif(not on_hopper, reason="wgmma_kernel needs an sm_90 GPU and Triton with Gluon")
@pytest.mark.parametrize("split,stages,drain", [(1, 2, True), (1, 3, True), (1, 3, False), (1, 4, False),
                                                (2, 2, True), (3, 2, True)])
@pytest.mark.parametrize("H", [256, 1024])
def test_wgmma_kernel_is_the_triton_kernels_bits(split, stages, drain, H, grouped_tiles):  # noqa: F811
    """Both GEMMs (gate_up with a_div 2, down with routing weights) through a Triton tile and
    the same tile on wgmma (Triton's at 2 stages: stages change no bits): equal bits. H 256 is one K step of 8 * 32 columns (fewer steps
    than the pipeline's distance), 1024 four; 70 tokens x 2 of 4 experts leave padded,
    partly filled and empty row blocks."""
    dev = torch.device("cuda")
    E = 4
    m = _experts(7, E=E, H=H, I=H).to(dev)
    to_kernel_layout(m, 32)
    x = torch.randn(70, H, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E)[:2] for _ in range(70)]).to(dev)
    w = torch.rand(140, device=dev)
    outs = []
    for wgmma in (False, True):
        for which in ("gate_up", "down"):
            grouped_tiles[which].clear()
            grouped_tiles[which].update(block_m=64, block_n=128, num_warps=8, num_stages=stages if wgmma else 2,
                                        split=split, wgmma=wgmma, drain=drain)
        outs.append(_gemms(m, x, idx, w, E, 64 * split))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.skipif(not on_hopper, reason="wgmma_kernel needs an sm_90 GPU and Triton with Gluon")
@pytest.mark.parametrize("block_m,split", [(16, 1), (32, 1), (16, 3), (32, 3)])
def test_wgmma_kernel_small_token_tiles(block_m, split, grouped_tiles):  # noqa: F811
    """The token tiles few tokens get (grouped_block_m: 16 at a decode step): the same bits."""
    dev = torch.device("cuda")
    m = _experts(5, E=4, H=1024, I=1024).to(dev)
    to_kernel_layout(m, 32)
    x = torch.randn(70, 1024, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(70)]).to(dev)
    w = torch.rand(140, device=dev)
    outs = []
    for wgmma in (False, True):
        for which in ("gate_up", "down"):
            grouped_tiles[which].clear()
            grouped_tiles[which].update(block_m=block_m, block_n=128, num_warps=8, num_stages=2, split=split,
                                        wgmma=wgmma)
        outs.append(_gemms(m, x, idx, w, 4, block_m * split))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.skipif(not on_hopper, reason="wgmma_kernel needs an sm_90 GPU and Triton with Gluon")
@pytest.mark.parametrize("tokens", [1, 48, 700])
def test_fused_experts_on_wgmma_is_fused_experts_on_triton(tokens):
    """The whole layer at the shipped tiles (wgmma, both GEMMs in 3 x 64-row sub-blocks)
    against the same tiles on the Triton kernels: the routing picks each token count's
    block (top 2 of 8 experts: 16 rows at 1 and 48 tokens, 192 at 700), and every block runs
    either kernel to the same bits."""
    dev = torch.device("cuda")
    assert fast.block_rows("gate_up") == fast.block_rows("down") == 192
    m = _experts(3, E=8, H=1024, I=512).to(dev)
    x = torch.randn(tokens, 1024, device=dev).to(torch.bfloat16)
    idx = torch.rand(tokens, 8, device=dev).topk(2, dim=-1).indices
    w = torch.softmax(torch.randn(tokens, 2, device=dev), -1)
    assert fast.GROUPED["gate_up"].get("wgmma") and fast.GROUPED["down"].get("wgmma")
    want = fast.fused_experts(m, x, idx, w)
    saved = {k: dict(fast.GROUPED[k]) for k in ("gate_up", "down")}
    try:
        for k in saved:
            fast.GROUPED[k]["wgmma"] = False
        got = fast.fused_experts(m, x, idx, w)
    finally:
        fast.GROUPED.update(saved)
    assert torch.equal(want, got)


@pytest.mark.skipif(not on_hopper, reason="wgmma_kernel needs an sm_90 GPU and Triton with Gluon")
@pytest.mark.parametrize("split", [1, 3])
def test_wgmma_kernel_dequantizes_bit_for_bit(split, grouped_tiles):  # noqa: F811
    """A = identity rows routed to expert 1: out^T is expert 1's down weights, exactly."""
    dev = torch.device("cuda")
    m = _experts(11, E=4, H=256, I=256).to(dev)
    to_kernel_layout(m, 32)
    grouped_tiles["down"].clear()
    grouped_tiles["down"].update(block_m=64, block_n=128, num_warps=8, num_stages=2, split=split, wgmma=True)
    eye = torch.eye(256, device=dev).to(torch.bfloat16)
    r = route(torch.full((256, 1), 1, device=dev), 4, 64 * split)
    got = grouped_int4_gemm(eye, m.down_proj_packed, m.down_proj_scale, r, 32, "down", a_div=1,
                            piece=m.kernel_layout).T
    assert torch.equal(got, m.expert_weight("down_proj", 1, torch.bfloat16))


def test_wgmma_tiles_fall_back_where_wgmma_cannot_run(monkeypatch):
    """No wgmma on the CPU, under the interpreter, off sm_90, with scales not group major or
    with more than 3 sub-blocks: such a tile runs the Triton kernel (the same bits)."""
    assert not wgmma_runs(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not wgmma_runs(torch.device("cuda"))
    monkeypatch.delenv("TRITON_INTERPRET")
    if on_hopper:
        dev = torch.device("cuda")
        assert not wgmma_runs(dev, torch.empty(2, 3, 4, device=dev).transpose(1, 2).contiguous().transpose(1, 2)
                              .contiguous(), 1)
        assert not wgmma_runs(dev, None, 4)
        tile = {"block_n": 128, "num_warps": 8}
        assert wgmma_runs(dev, None, 3, tile) and not wgmma_runs(dev, None, 1, {**tile, "block_n": 64})
        assert not wgmma_runs(dev, None, 1, {**tile, "num_warps": 2})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fast._wgmma_device.cache_clear()                 # the device is asked once; ask this one anew
    try:
        assert not fast.wgmma_runs(torch.device("cuda"))
    finally:
        fast._wgmma_device.cache_clear()
