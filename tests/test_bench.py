"""diag.bench and the fused INT4 path: routing layout, CPU fallback, the Triton kernel when
it can run (CUDA, or Triton's interpreter), the naive loop's cache handling, rendering."""

import copy
import json
import os
from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional as F

from diag.bench.render import goal_lines, render
from diag.bench.target import expert_flops, synthetic_sequences
from diag.int4 import fast
from diag.int4.fast import (FastPackedExperts, accelerate, fused_experts, grouped_fits, grouped_int4_gemm,
                            route, to_kernel_layout, triton_available)
from diag.int4.format import pack_int4, unpack_int4
from diag.int4.kernel_layout import fits, to_checkpoint, to_kernel
from diag.int4.packed import PackedExperts


def _experts(seed=0, E=8, H=128, I=64):
    torch.manual_seed(seed)
    m = PackedExperts(E, H, I, 32, F.silu)
    for name in ("gate_up_proj", "down_proj"):
        packed = getattr(m, f"{name}_packed")
        packed.copy_(torch.randint(-2 ** 31, 2 ** 31, packed.shape, dtype=torch.int64).to(torch.int32))
        getattr(m, f"{name}_scale").copy_(torch.rand(getattr(m, f"{name}_scale").shape) * 0.05)
    return m


def test_route_worked_example():
    r = route(torch.tensor([[1], [0], [1]]), 2, 2)          # the module docstring's example
    S = 3
    assert r.sorted_ids.tolist()[:4] == [1, S, 0, 2]
    assert r.block_expert.tolist()[:2] == [0, 1] and set(r.block_expert.tolist()[2:]) <= {-1}


@pytest.mark.parametrize("seed", range(4))
def test_route_places_every_pair_once_in_its_experts_block(seed):
    gen = torch.Generator().manual_seed(seed)
    E, T, K, B = 7, 37, 3, 4
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    r = route(idx, E, B)
    ids, experts = r.sorted_ids.view(-1, B), r.block_expert
    seen = []
    for block, e in zip(ids.tolist(), experts.tolist()):
        real = [p for p in block if p < T * K]
        assert e >= 0 or not real
        assert all(int(idx.view(-1)[p]) == e for p in real)
        seen += real
    assert sorted(seen) == list(range(T * K))


def test_routes_sorts_once_and_pads_for_each_block_m():
    """routes() for block_m 2 and 4 is route() for each (the module docstring's experts)."""
    idx = torch.tensor([[1], [0], [1], [1], [0]])
    both = fast.routes(idx, 2, (2, 4, 2))
    assert list(both) == [2, 4]
    for bm, r in both.items():
        want = route(idx, 2, bm)
        assert r.block_m == bm and torch.equal(r.sorted_ids, want.sorted_ids)
        assert torch.equal(r.block_expert, want.block_expert)
    S = 5
    assert both[4].sorted_ids.tolist()[:8] == [1, 4, S, S, 0, 2, 3, S]


def test_accelerate_swaps_class_and_falls_back_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    m = _experts()
    model = torch.nn.Sequential(m)
    x = torch.randn(20, 128).to(torch.bfloat16)
    idx, w = torch.randint(0, 8, (20, 2)), torch.rand(20, 2)
    before = m(x, idx, w)
    assert accelerate(model) == 1 and type(m) is FastPackedExperts
    assert torch.equal(m(x, idx, w), before)                 # CPU: the eager loop, bit for bit
    assert accelerate(model) == 0


kernel_runs = triton_available() and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")


def test_kernel_layout_worked_example_and_round_trip():
    q = torch.randint(-8, 8, (3, 5, 512), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    words = pack_int4(q)
    k = unpack_int4(to_kernel(words, 32), 512)       # position 8 * word + nibble
    assert torch.equal(k[..., 8 * 1 + 1], q[..., 33]) and torch.equal(k[..., 8 * 44 + 1], q[..., 300])
    for c in range(512):                             # column c = block b, group i, offset j
        b, r = divmod(c, 256)
        i, j = divmod(r, 32)
        assert torch.equal(k[..., 8 * (32 * b + j) + i], q[..., c])
    assert torch.equal(to_checkpoint(to_kernel(words, 32), 32), words)
    assert fits(7168, 32) and fits(2048, 32, 32) and not fits(64, 32) and not fits(256, 8)
    assert not fits(7168, 32, 64) and not fits(384, 32, 32)


def test_kernel_layout_keeps_every_weight_and_the_eager_loop():
    m = _experts(3, E=4, H=256, I=256)
    m.__class__ = FastPackedExperts
    before = {p: [m.expert_weight(p, e, torch.float32) for e in range(4)] for p in ("gate_up_proj", "down_proj")}
    x, idx, w = torch.randn(9, 256), torch.randint(0, 4, (9, 2)), torch.rand(9, 2)
    out = PackedExperts.forward(m, x, idx, w)
    assert grouped_fits(m)
    to_kernel_layout(m, 16)
    assert m.kernel_layout == 16 and m.down_proj_scale.stride()[1:] == (1, 256)
    for p, ws in before.items():
        assert all(torch.equal(m.expert_weight(p, e, torch.float32), ws[e]) for e in range(4))
    assert torch.equal(PackedExperts.forward(m, x, idx, w), out)
    to_kernel_layout(m)                                  # re-laid in GROUPED's piece (32)
    assert m.kernel_layout == fast.GROUPED["piece"] == 32 and torch.equal(PackedExperts.forward(m, x, idx, w), out)


def _kernel_dequantized(m, expert: int, dev) -> torch.Tensor:
    """The down GEMM at A = identity rows routed to `expert`: out^T is the weight [H, I] as
    the grouped kernel dequantizes it (m in its kernel layout, H = I = 256, 4 experts)."""
    eye = torch.eye(256, device=dev).to(torch.bfloat16)
    r = route(torch.full((256, 1), expert, device=dev), 4, 16)
    return grouped_int4_gemm(eye, m.down_proj_packed, m.down_proj_scale, r, 32, "down", a_div=1,
                             piece=m.kernel_layout).T


def _fused_vs_eager(m, dev) -> float:
    """Relative error of the fused layer against the eager loop on 40 tokens, top-2 of 4."""
    x = torch.randn(40, 256, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(40)]).to(dev)
    w = torch.rand(40, 2, device=dev)
    ref = PackedExperts.forward(m, x, idx, w).float()
    got = fused_experts(m, x, idx, w).float()
    return float((got - ref).norm() / ref.norm())


@pytest.fixture
def grouped_tiles():
    saved = {k: (dict(v) if isinstance(v, dict) else v) for k, v in fast.GROUPED.items()}
    # the Triton kernels' small tiles (tests/test_wgmma_kernel.py has wgmma_kernel's)
    fast.GROUPED["gate_up"].update(block_m=16, block_n=32, split=1, wgmma=False, by_rows={})
    fast.GROUPED["down"].update(block_m=32, block_n=64, split=3, wgmma=False, by_rows={})
    yield fast.GROUPED
    fast.GROUPED.clear()
    fast.GROUPED.update(saved)


@pytest.mark.skipif(not kernel_runs, reason="needs Triton with CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dequant,piece", [(0, 16), (1, 32), (2, 16)])
def test_grouped_kernel_dequantizes_bit_for_bit_and_matches_eager(dequant, piece, grouped_tiles):
    """A = identity rows: out^T is the dequantized weight itself, which must equal
    format.dequantize's bf16 bits; then the whole layer against the eager loop."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = _experts(5, E=4, H=256, I=256).to(dev)
    m.__class__ = FastPackedExperts
    grouped_tiles.update(dequant=dequant, piece=piece)
    assert _fused_vs_eager(m, dev) < 1e-2
    assert m.kernel_layout == piece
    assert torch.equal(_kernel_dequantized(m, 2, dev), m.expert_weight("down_proj", 2, torch.bfloat16))


bf16x2_runs = (triton_available() and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
               and torch.cuda.get_device_capability() >= (8, 0))


@pytest.mark.skipif(not bf16x2_runs, reason="DEQUANT 3 is inline PTX: needs CUDA sm_80+ without the interpreter")
@pytest.mark.parametrize("piece", [16, 32])
def test_bf16x2_dequant_is_bit_exact_and_matches_eager(piece, grouped_tiles):
    """DEQUANT 3 (pieces i and i + 4 as one bf16x2 word, fma.rn.bf16x2): the kernel runs it
    here (no fallback), out^T at A = identity is format.dequantize's bits, and the layer
    matches the eager loop. Piece 16: pieces i and i + 4 are in different groups (G 32)."""
    dev = torch.device("cuda")
    m = _experts(9, E=4, H=256, I=256).to(dev)
    m.__class__ = FastPackedExperts
    grouped_tiles.update(dequant=3, piece=piece)
    assert fast.dequant_variant(dev) == 3
    to_kernel_layout(m, piece)
    assert torch.equal(_kernel_dequantized(m, 3, dev), m.expert_weight("down_proj", 3, torch.bfloat16))
    assert _fused_vs_eager(m, dev) < 1e-2


def test_bf16x2_dequant_falls_back_to_variant_2_where_it_cannot_run(grouped_tiles, monkeypatch):
    grouped_tiles.update(dequant=3)
    assert fast.dequant_variant(torch.device("cpu")) == 2
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fast.dequant_variant(torch.device("cuda")) == 2
    grouped_tiles.update(dequant=1)
    assert fast.dequant_variant(torch.device("cpu")) == 1


@pytest.mark.skipif(not kernel_runs, reason="needs Triton with CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("piece", [16, 32])
def test_wide_grouped_kernel_is_bit_exact_too(piece, grouped_tiles):
    """WIDE (one dot of depth 8P per K step): the same dequantized bits at A = identity,
    with piece 16 two pieces share a group's scale (G 32), with 32 each piece has its own."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = _experts(7, E=4, H=256, I=256).to(dev)
    m.__class__ = FastPackedExperts
    grouped_tiles.update(dequant=2, piece=piece)
    grouped_tiles["down"]["wide"] = True
    to_kernel_layout(m, piece)
    assert torch.equal(_kernel_dequantized(m, 1, dev), m.expert_weight("down_proj", 1, torch.bfloat16))


def test_each_gemm_gets_its_own_token_tile(grouped_tiles):
    """grouped_block_m's worked example: Kimi's 384 experts, gate_up block_m 64, down 128."""
    grouped_tiles["gate_up"].update(block_m=64, split=1)
    grouped_tiles["down"].update(block_m=128, split=1)
    per_gemm = lambda pairs: [fast.grouped_block_m(pairs, 384, w) for w in ("gate_up", "down")]  # noqa: E731
    assert per_gemm(8) == [16, 16]                 # 1 token: 8 pairs, 1 per expert
    assert per_gemm(2048 * 8) == [64, 64]          # 43 per expert
    assert per_gemm(8192 * 8) == [64, 128]         # 171 per expert: each GEMM's cap


def test_fused_experts_routes_each_gemm_for_its_block_m(grouped_tiles, monkeypatch):
    """40 tokens top-2 of 4 experts (20 pairs each): gate_up capped at 16, down at 32; each GEMM
    gets the routing of its own block_m, and the layer is the gathered sum either way."""
    grouped_tiles["gate_up"].update(block_m=16, split=1, glu=True)
    grouped_tiles["down"].update(block_m=32, split=1)
    seen = {}

    def fake_gemm(a, packed, scale, r, group, which, *, a_div, piece, route_w=None, glu=False):
        seen[which] = r.block_m
        assert r.sorted_ids.numel() == r.block_expert.numel() * r.block_m
        assert glu == (which == "gate_up")                 # F.silu: the activation in the epilogue
        return torch.ones(r.num_pairs, packed.shape[1] // (2 if glu else 1), dtype=torch.bfloat16)

    monkeypatch.setattr(fast, "grouped_int4_gemm", fake_gemm)
    m = _experts(5, E=4, H=256, I=256)
    x = torch.randn(40, 256)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(40)])
    out = fused_experts(m, x, idx, torch.full((40, 2), 0.5))
    assert seen == {"gate_up": 16, "down": 32}
    assert out.shape == (40, 256) and torch.equal(out, torch.full((40, 256), 2.0))   # 2 slots x 1


def test_gate_up_tile_without_glu_keeps_the_activation_outside(grouped_tiles, monkeypatch):
    grouped_tiles["gate_up"]["glu"] = False
    seen = {}

    def fake_gemm(a, packed, scale, r, group, which, *, a_div, piece, route_w=None, glu=False):
        seen[which] = glu
        return torch.ones(r.num_pairs, packed.shape[1], dtype=torch.bfloat16)

    monkeypatch.setattr(fast, "grouped_int4_gemm", fake_gemm)
    m = _experts(5, E=4, H=256, I=256)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(8)])
    out = fused_experts(m, torch.randn(8, 256), idx, torch.full((8, 2), 0.5))
    assert seen == {"gate_up": False, "down": False}
    assert torch.allclose(out.float(), torch.full((8, 256), 2.0))       # the fake down's ones, 2 slots


def test_tuner_times_gate_up_both_ways_where_the_activation_fuses():
    from diag.bench.tiles import _gemm_tiles, _tile
    c = (64, 128, 8, 2, False, 1, "")
    assert _gemm_tiles(c, True) == [("gate_up", c + (True,)), ("gate_up", c + (False,)), ("down", c)]
    assert _gemm_tiles(c, False) == [("gate_up", c), ("down", c)]
    assert _tile(c + (False,))["glu"] is False and "glu" not in _tile(c) and "split" not in _tile(c)
    assert _tile((64, 128, 8, 2, False, 3, ""))["split"] == 3 and "wgmma" not in _tile(c)
    w = (64, 128, 8, 2, False, 3, "wgmma")                  # wgmma_kernel: no GLU epilogue to time
    assert _gemm_tiles(w, True) == [("gate_up", w + (False,)), ("down", w)]
    assert _tile(w)["wgmma"] is True and _tile(w)["drain"] is True
    assert _tile((64, 128, 8, 3, False, 3, "wgmma-lag"))["drain"] is False


def test_split_row_blocks_worked_example(grouped_tiles):
    """block_m 64 split 3: Kimi's 8k tokens (171 pairs per expert) are routed in blocks of
    192 rows, 3 sub-blocks each; 2k tokens (43 per expert) in plain blocks of 64."""
    grouped_tiles["down"].update(block_m=64, split=3)
    assert fast.block_rows("down") == 192
    assert fast.grouped_block_m(8192 * 8, 384, "down") == 192 and fast.split_of("down", 192) == 3
    assert fast.grouped_block_m(2048 * 8, 384, "down") == 64 and fast.split_of("down", 64) == 1
    with pytest.raises(ValueError, match="neither 192"):
        fast.split_of("down", 96)
    grouped_tiles["down"]["wide"] = True
    with pytest.raises(ValueError, match="wide tile takes split 1"):
        fast.split_of("down", 192)


@pytest.mark.skipif(not kernel_runs, reason="needs Triton with CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("split,block_m", [(2, 16), (3, 16), (4, 16)])
def test_split_row_blocks_give_the_same_rows(split, block_m, grouped_tiles):
    """A row block of `split` sub-blocks decodes each weight tile once for all of them; every
    row's sum runs over the same K steps in the same order, so the output is the split-1
    kernel's bit for bit, gate_up with its GLU epilogue and down with its routing weights,
    and at A = identity out^T is still format.dequantize's bits."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = _experts(11, E=4, H=256, I=256).to(dev)
    to_kernel_layout(m)
    x = torch.randn(70, 256, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(70)]).to(dev)    # 35 pairs per expert
    w = torch.rand(140, device=dev)
    outs = {}
    for sp in (1, split):
        grouped_tiles["gate_up"].update(block_m=block_m, split=sp)
        grouped_tiles["down"].update(block_m=block_m, split=sp)
        rows = block_m * sp
        r = route(idx, 4, rows)
        assert r.block_m == rows and fast.split_of("down", rows) == sp
        h = grouped_int4_gemm(x, m.gate_up_proj_packed, m.gate_up_proj_scale, r, 32, "gate_up", a_div=2,
                              piece=m.kernel_layout, glu=True)
        y = grouped_int4_gemm(h, m.down_proj_packed, m.down_proj_scale, r, 32, "down", a_div=1,
                              piece=m.kernel_layout, route_w=w)
        outs[sp] = (h, y)
    assert torch.equal(outs[1][0], outs[split][0]) and torch.equal(outs[1][1], outs[split][1])
    eye = torch.eye(256, device=dev).to(torch.bfloat16)
    r = route(torch.full((256, 1), 1, device=dev), 4, block_m * split)        # 256 rows: 2..6 blocks
    got = grouped_int4_gemm(eye, m.down_proj_packed, m.down_proj_scale, r, 32, "down", a_div=1,
                            piece=m.kernel_layout).T
    assert torch.equal(got, m.expert_weight("down_proj", 1, torch.bfloat16))


def test_only_silu_is_fused_into_the_kernel():
    from transformers.activations import ACT2FN
    m = _experts(5, E=4, H=256, I=256)
    assert fast.fuses_activation(m)                                        # F.silu
    for fn, fused in ((ACT2FN["silu"], True), (torch.nn.SiLU(), True), (ACT2FN["gelu"], False),
                      (F.relu, False)):
        assert fast.fuses_activation(SimpleNamespace(act_fn=fn)) == fused, fn


@pytest.mark.skipif(not kernel_runs, reason="needs Triton with CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("block_n", [32, 64])
def test_glu_epilogue_is_the_unfused_activation(block_n, grouped_tiles):
    """silu(gate) * up in gate_up's epilogue against the [S, 2I] product activated by torch
    (bf16 in and out): equal but for the exp's last bit, at most one bf16 step apart."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = _experts(7, E=4, H=256, I=256).to(dev)
    to_kernel_layout(m)
    grouped_tiles["gate_up"]["block_n"] = block_n
    x = (torch.randn(24, 256, device=dev) * 4).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(24)]).to(dev)
    r = route(idx, 4, 16)
    args = (x, m.gate_up_proj_packed, m.gate_up_proj_scale, r, 32, "gate_up")
    gu = grouped_int4_gemm(*args, a_div=2, piece=m.kernel_layout)                    # [S, 512]
    gate, up = gu.chunk(2, dim=-1)
    want = (F.silu(gate) * up).float()
    got = grouped_int4_gemm(*args, a_div=2, piece=m.kernel_layout, glu=True).float()   # [S, 256]
    assert got.shape == (48, 256)
    step = torch.finfo(torch.bfloat16).eps * want.abs().clamp_min(1e-3)
    assert float(((got - want).abs() / step).max()) <= 2.0
    assert float((got == want).float().mean()) > 0.9


@pytest.mark.skipif(not kernel_runs, reason="needs Triton with CUDA or TRITON_INTERPRET=1")
def test_one_pass_activation_is_torchs_silu_and_mul():
    """fast.glu (one Triton pass over gate_up's [S, 2I] product) against torch's silu(gate) *
    up on bf16: at most one bf16 step apart (the exp's last bit), nearly all equal; activate
    takes it for SiLU where the kernels run, torch's path for any other activation."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gu = (torch.randn(37, 600, device=dev) * 4).to(torch.bfloat16)          # I 300: ragged tiles
    gate, up = gu.chunk(2, dim=-1)
    want = (F.silu(gate) * up).float()
    got = fast.glu(gu).float()
    assert got.shape == (37, 300)
    step = torch.finfo(torch.bfloat16).eps * want.abs().clamp_min(1e-3)
    assert float(((got - want).abs() / step).max()) <= 2.0
    assert float((got == want).float().mean()) > 0.9
    assert torch.equal(fast.activate(SimpleNamespace(act_fn=F.silu), gu), fast.glu(gu))
    relu = fast.activate(SimpleNamespace(act_fn=F.relu), gu)
    assert torch.equal(relu, (F.relu(gate) * up).contiguous())


def test_tuner_chooses_each_gemms_fastest_tile_at_the_best_shared_layout(grouped_tiles):
    """The timings of an H200 run (bf16x2 call): DEQUANT 3 wins on the sum of each GEMM's best,
    and down keeps its block_m 128 while gate_up keeps 64."""
    from diag.bench.tiles import _choose
    best = {(32, 3, "gate_up"): (0.01197, (64, 128, 8, 2, False, 1, "", True)),
            (32, 3, "down"): (0.00832, (128, 128, 8, 3, False, 1, "")),
            (32, 2, "gate_up"): (0.0130, (64, 128, 8, 3, False, 1, "")),
            (32, 2, "down"): (0.0089, (128, 128, 8, 3, False, 1, "")),
            (16, 2, "gate_up"): (0.0150, (128, 128, 8, 3, False, 1, ""))}           # no down: not a pair
    m = _experts(5, E=4, H=256, I=256)
    grouped_tiles["gate_up"]["by_rows"] = {64: {"block_n": 256}}
    got = _choose(best, m, 8192)
    assert got["by_piece_and_dequant"] == {"piece32_dequant3": pytest.approx(0.02029),
                                           "piece32_dequant2": pytest.approx(0.0219)}
    assert got["gemm_seconds"] == pytest.approx(0.02029)
    assert fast.GROUPED["dequant"] == 3 and fast.GROUPED["piece"] == 32 and m.kernel_layout == 32
    assert fast.GROUPED["gate_up"] == {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2,
                                       "wide": False, "glu": True, "by_rows": {64: {"block_n": 256}}}   # kept
    assert "glu" not in fast.GROUPED["down"]
    assert fast.GROUPED["down"]["block_m"] == 128 and got["chosen"]["down"]["num_stages"] == 3


@pytest.mark.skipif(not kernel_runs, reason="needs Triton with CUDA or TRITON_INTERPRET=1")
def test_fused_kernel_matches_eager_loop():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = _experts(1).to(dev)
    x = torch.randn(50, 128, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(8)[:3] for _ in range(50)]).to(dev)
    w = torch.rand(50, 3, device=dev)
    ref, got = PackedExperts.forward(m, x, idx, w).float(), fused_experts(m, x, idx, w).float()
    assert float((got - ref).norm() / ref.norm()) < 3e-2


def test_flops_worked_example_and_sequences():
    assert expert_flops(8192, 8, 2048, 7168) == 6 * 8192 * 8 * 2048 * 7168
    seqs = synthetic_sequences(3, 20, 5, 100)
    assert [len(s.ids) for s in seqs] == [20, 20, 20] and all(s.prompt_len == 5 for s in seqs)
    assert int(max(s.ids.max() for s in seqs)) < 100


def _result(**sections):
    return {"kind": "gpu", "git": None, "machine": {"torch": "x", "gpu": "G"}, "sections": sections}


def test_goal_lines_read_the_json(tmp_path):
    res = _result(naive={"speedup_over_naive": 45.0}, checkpoint_load={"resident_over_checkpoint": 1.3},
                  experts={"rows": [{"tokens": 8192, "int4_fraction_of_peak": 0.2}], "weight_memory_ratio": 0.28},
                  drafter={"error": "boom"})
    lines = "\n".join(goal_lines(res))
    assert "| speedup over the naive loop (competent version) | 45 | >= 30 | met |" in lines
    assert "| resident / checkpoint bytes | 1.3 | <= 1.15 | NOT met |" in lines
    assert "| MoE layer fraction of bf16 peak (8k tokens, dequant included) | 0.2 | >= 0.4 | NOT met |" in lines
    assert "| drafter replay fraction of peak | not measured |" in lines
    # a value that rounds onto its limit gets the digits that put it on its side: 1.1504 > 1.15 reads
    # 1.1504, not 1.15 beside NOT met; 0.39996 < 0.4 reads 0.39996; 1.1496 <= 1.15 keeps 3 digits
    near = lambda ratio, frac: "\n".join(goal_lines(_result(  # noqa: E731
        checkpoint_load={"resident_over_checkpoint": ratio}, experts={"rows": [{"tokens": 8192,
        "int4_fraction_of_peak": frac}], "weight_memory_ratio": 0.28})))
    assert "| resident / checkpoint bytes | 1.1504 | <= 1.15 | NOT met |" in near(1.1504, 0.39996)
    assert "| 0.39996 | >= 0.4 | NOT met |" in near(1.1504, 0.39996)
    assert "| resident / checkpoint bytes | 1.15 | <= 1.15 | met |" in near(1.1496, 0.5)
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(res))
    assert "speedup_over_naive=45" in render([path])


def test_zoo_goals_are_the_cpus_and_the_kernel_goals_the_gpus():
    cpu = {"kind": "cpu", "sections": {"zoo": {"demo_seconds": 150.0, "whole_seconds": 320.0},
                                       "drafter": {"fraction_of_peak": 0.01}}}
    lines = "\n".join(goal_lines(cpu))
    assert "| zoo: the demo's checkpoints from an empty cache (s, 2 cores) | 150 | <= 180 | met |" in lines
    assert "| zoo: the whole zoo from an empty cache (s, 2 cores) | 320 | <= 300 | NOT met |" in lines
    assert "drafter replay" not in lines                                  # a GPU goal
    assert "zoo" not in "\n".join(goal_lines(_result(zoo={"whole_seconds": 1.0})))


def test_zoo_bench_builds_into_its_own_empty_cache(tmp_path, monkeypatch):
    """The demo's entries first, then the rest, into workdir/cache (never the user's cache),
    which is left as it was; a cache that holds a zoo already is refused."""
    from diag.bench import zoo as bench_zoo
    from diag.zoo import build

    monkeypatch.setenv("DIAG_CACHE_DIR", "/the/users/cache")
    calls = []
    monkeypatch.setattr(build, "ensure", lambda names: calls.append((os.environ["DIAG_CACHE_DIR"], list(names))))
    monkeypatch.setattr(build, "read_meta", lambda n: {"seconds": 1.5})
    out = bench_zoo.zoo_build_bench(tmp_path)
    assert [c[0] for c in calls] == [str(tmp_path / "cache")] * 2
    assert calls[0][1] == list(bench_zoo.demo_entries()) and "deepseek-tiny-eagle3-mla" in calls[1][1]
    assert out["demo_entries"] == ["stdlib-corpus", "llama-tiny", "llama-tiny-eagle3-embed",
                                   "llama-tiny-eagle3-embed-vllm-ids"]
    assert set(out["entry_seconds"].values()) == {1.5} and out["whole_seconds"] >= out["demo_seconds"]
    assert os.environ["DIAG_CACHE_DIR"] == "/the/users/cache"
    (tmp_path / "cache" / "zoo").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="empty cache"):
        bench_zoo.zoo_build_bench(tmp_path)


def test_extrapolation_worked_example():
    from diag.bench.extrapolate import extrapolate, kimi_bytes

    assert kimi_bytes([8, 99, 3, 47]) == 8 + 60 * 99 + 47
    e2e = {"layers": 4, "max_new_tokens": 512, "cached_seconds_per_variant": 0.2,
           "first": {"sequences": 48, "tokens": 30000, "target_s": 100.0, "target_load_s": 30.0,
                     "target_generate_s": 40.0, "target_capture_s": 10.0, "checks_s": 2.0,
                     "drafter_s": 20.0, "summary_s": 1.0, "report_s": 3.0}}
    grown = {"generate_seconds_per_layer_step": 1e-3, "capture_seconds_per_layer_token": 1e-5}
    x = extrapolate(e2e, grown, {"diag_cold_bytes_per_s": 1e9}, [1e9, 1e10, 1e10, 1e10, 5e9])
    assert x["kimi_bytes"] == 1e9 + 60e10 + 5e9 and x["load_s"] == x["kimi_bytes"] / 1e9
    assert x["decode_steps"] == 3 * 512                              # 48 prompts, batches of 16
    assert abs(x["generate_s"] - (40 + 57 * 1e-3 * 1536)) < 1e-9
    sequential = 10 + 57 * 1e-5 * 30000                               # the capture layer after layer
    assert x["pipeline"]["microbatches"] == 2 and "estimated" in x["pipeline"]["microbatches_from"]
    assert abs(x["capture_s"] - sequential * (2 + 7) / (8 * 2)) < 1e-9  # GPipe over 8 GPUs, 2 microbatches
    assert abs(x["step_costs_s"] - 20 * 61 / 4) < 1e-9                # target_s minus its phases
    assert x["first_verdict_after_load_s"] == x["generate_s"] + x["capture_s"] + x["step_costs_s"] + 26


def test_extrapolation_pipelines_the_capture_pass_over_the_runs_microbatches():
    """The run counted 5 token-budget batches: the capture pass over 8 stages takes
    (5 + 7) / (8 * 5) of its layer-after-layer time, bubble 7 / 12; the first-run total uses it."""
    from diag.bench.extrapolate import extrapolate

    e2e = {"layers": 4, "max_new_tokens": 512, "cached_seconds_per_variant": 0.2, "token_budget": 16384,
           "first": {"sequences": 48, "tokens": 41693, "target_s": 100.0, "target_load_s": 30.0,
                     "target_generate_s": 40.0, "target_capture_s": 10.0, "target_capture_microbatches": 5,
                     "checks_s": 2.0, "drafter_s": 20.0, "summary_s": 1.0, "report_s": 3.0}}
    grown = {"generate_seconds_per_layer_step": 1e-3, "capture_seconds_per_layer_token": 1e-5}
    x = extrapolate(e2e, grown, {"diag_cold_bytes_per_s": 1e9}, [1e9, 1e10, 1e10, 1e10, 5e9])
    pipe = x["pipeline"]
    sequential = 10 + 57 * 1e-5 * 41693
    assert (pipe["stages"], pipe["microbatches"]) == (8, 5) and pipe["microbatches_from"].startswith("the e2e run")
    assert pipe["bubble_fraction"] == 7 / 12 and pipe["capture_sequential_s"] == sequential
    assert abs(x["capture_s"] - sequential * 12 / 40) < 1e-9 and x["capture_s"] == pipe["capture_pipelined_s"]
    assert "GPipe over 8 stages, 5 microbatches, bubble 0.583" in x["formulas"]["capture_s"]
    assert x["first_run_total_s"] == x["load_s"] + x["generate_s"] + x["capture_s"] + x["step_costs_s"] + \
        x["drafter_and_report_s"]


def test_extrapolation_with_timed_costs_and_a_larger_batch():
    """A run that timed its step costs (2 s at 4 layers, 0.5 s per grown layer) and generated
    48 prompts in one batch: 512 decode steps at the batch-48 slope; the untimed rest of
    target_s (100 - 30 - 40 - 10 - 2 = 18 s) is kept as measured, not grown."""
    from diag.bench.extrapolate import extrapolate

    e2e = {"layers": 4, "max_new_tokens": 512, "cached_seconds_per_variant": 0.2,
           "first": {"sequences": 48, "tokens": 30000, "target_s": 100.0, "target_load_s": 30.0,
                     "target_generate_s": 40.0, "target_capture_s": 10.0, "target_costs_s": 2.0,
                     "target_generate_batch": 48, "checks_s": 2.0, "drafter_s": 20.0, "summary_s": 1.0,
                     "report_s": 3.0}}
    grown = {"generate_seconds_per_layer_step": 1e-3, "capture_seconds_per_layer_token": 1e-5,
             "generate_seconds_per_layer_step_by_batch": {"16": 1e-3, "48": 2e-3}, "costs_seconds_per_layer": 0.5}
    x = extrapolate(e2e, grown, {"diag_cold_bytes_per_s": 1e9}, [1e9, 1e10, 1e10, 1e10, 5e9])
    assert x["decode_steps"] == 512 and x["generation_batch"] == 48
    assert abs(x["generate_s"] - (40 + 57 * 2e-3 * 512)) < 1e-9
    assert abs(x["step_costs_s"] - (2 + 57 * 0.5)) < 1e-9
    assert abs(x["drafter_and_report_s"] - (26 + 18)) < 1e-9
    assert abs(x["first_verdict_without_step_costs_s"] - (x["first_verdict_after_load_s"] - x["step_costs_s"])) < 1e-9


def test_kimi_batch_on_8_gpus_is_computed_beside_the_measured_one():
    """The docstring example: 48 prompts of at most 1,365 tokens + 512, Kimi's 594 GB on 8 GPUs
    of 150 GB -> one batch of 48; on 80 GiB GPUs the caches leave room for 8 rows only, and the
    extrapolation says that the measured batch is not Kimi's."""
    from diag.bench.extrapolate import extrapolate, kimi_generation_batch

    first = {"target_generate_longest_prompt": 1365, "sequences": 48}
    assert kimi_generation_batch(first, 512, 594232160240, 150109880320, 32768) == 48
    assert kimi_generation_batch(first, 512, 594232160240, 80 * 2 ** 30, 32768) == 8
    assert kimi_generation_batch({"sequences": 48}, 512, 594232160240, 150109880320, 32768) is None
    e2e = {"layers": 4, "max_new_tokens": 512, "cached_seconds_per_variant": 0.2, "token_budget": 32768,
           "first": {"sequences": 48, "tokens": 30000, "target_s": 100.0, "target_load_s": 30.0,
                     "target_generate_s": 40.0, "target_capture_s": 10.0, "target_generate_batch": 48,
                     "target_generate_longest_prompt": 1365, "checks_s": 2.0, "drafter_s": 20.0,
                     "summary_s": 1.0, "report_s": 3.0}}
    grown = {"generate_seconds_per_layer_step": 1e-3, "capture_seconds_per_layer_token": 1e-5}
    shards = [1e9, 1e10, 1e10, 1e10, 5e9]
    x = extrapolate(e2e, grown, {"diag_cold_bytes_per_s": 1e9}, shards, gpu_memory=150109880320)
    assert x["kimi_8gpu_generation_batch"] == 48 and "at the measured batch" in x["batch_note"]
    x = extrapolate(e2e, grown, {"diag_cold_bytes_per_s": 1e9}, shards, gpu_memory=80 * 2 ** 30)
    assert x["kimi_8gpu_generation_batch"] == 8 and "not the measured 48" in x["batch_note"]


def test_raw_read_and_cache_drop(tmp_path):
    from diag.bench.disk import drop_page_cache, raw_read

    files = []
    for i in range(3):
        f = tmp_path / f"s{i}"
        f.write_bytes(os.urandom(1000 + i))
        files.append(f)
    assert drop_page_cache(files, whole_machine=False) in ("fadvise_dontneed", "none")
    assert raw_read(files)["bytes"] == raw_read(files, threads=3)["bytes"] == 3003


@pytest.mark.parametrize("layers,want", [
    (2, ["embed+L1+L2", "L1+L2+final", "embed+L1+final"]),
    (4, ["embed+L2+L4", "L1+L2+L4", "embed+L1+L4"])])
def test_e2e_layouts_exist_at_k_layers(layers, want):
    from diag.bench.e2e import e2e_layouts
    from diag.layouts import layout
    from diag.zoo.kimi_shaped import drafter_layout

    got = e2e_layouts(drafter_layout(layers)[0], layers)
    assert got == want
    for text in got:                                  # a DiagError if a point does not exist
        layout(text, field="t").check_against(layers, field="t")


@pytest.mark.parametrize("layers", range(2, 62))
def test_every_section_has_valid_layouts_at_any_depth(layers):
    """Issue 36: with room for 6 layers the sampled section stopped on 'L2+L3+L3'."""
    from diag.bench.e2e import e2e_layouts
    from diag.bench.gpu import sampled_layouts
    from diag.layouts import layout
    from diag.zoo.kimi_shaped import drafter_layout

    claimed = drafter_layout(layers)[0]
    for lays in (sampled_layouts(claimed), e2e_layouts(claimed, layers)):
        assert len(set(lays)) == len(lays), lays
        for text in lays:
            layout(text, field="t").check_against(layers, field="t")


def test_first_run_load_goals_show_on_both_machines_and_the_extrapolation_loads_as_a_first_run():
    """The load section's two goals (first-run load <= 1.1 x plain cold load <= 1.25 x raw read)
    are rendered for a CPU and a GPU run; the extrapolation's load uses the first-run rate and
    lists every term of first_run_total_s."""
    from diag.bench.extrapolate import extrapolate

    load = {"plain_over_raw": 1.2, "first_run_over_plain": 1.3, "ratio_cold": 0.9}
    for kind in ("cpu", "gpu"):
        lines = "\n".join(goal_lines({"kind": kind, "sections": {"load": load}}))
        assert "| plain cold load / raw cold read (s / s) | 1.2 | <= 1.25 | met |" in lines
        assert "| first-run load (content digest in the read) / plain cold load (s / s) | 1.3 | <= 1.1 | NOT met |" in lines
    e2e = {"layers": 4, "max_new_tokens": 512, "cached_seconds_per_variant": 0.2,
           "first": {"sequences": 48, "tokens": 30000, "target_s": 100.0, "target_load_s": 30.0,
                     "target_generate_s": 40.0, "target_capture_s": 10.0, "checks_s": 2.0,
                     "drafter_s": 20.0, "summary_s": 1.0, "report_s": 3.0}}
    grown = {"generate_seconds_per_layer_step": 1e-3, "capture_seconds_per_layer_token": 1e-5}
    shards = [1e9, 1e10, 1e10, 1e10, 5e9]
    x = extrapolate(e2e, grown, {"diag_cold_bytes_per_s": 2e9, "first_run_bytes_per_s": 1e9}, shards)
    assert x["load_s"] == x["kimi_bytes"] / 1e9 and "first-run" in x["load_rate"]
    total = x["load_s"] + x["generate_s"] + x["capture_s"] + x["step_costs_s"] + x["drafter_and_report_s"]
    assert abs(x["first_run_total_s"] - total) < 1e-9
    assert x["first_run_total_terms"].endswith(f"= {total:.1f} s") and x["first_run_total_terms"].count("+") == 4
    old = {"diag_cold_bytes_per_s": 2e9, "checkpoint_bytes": 15.5e9, "diag_cold_with_digest": {"seconds": 16.5}}
    assert extrapolate(e2e, grown, old, shards)["load_s"] == x["kimi_bytes"] / (15.5e9 / 16.5)


@pytest.mark.parametrize("layers,want", [(2, "embed+L2+final"), (4, "embed+L1+L2")])
def test_one_more_layout_is_new_and_over_the_points_already_captured(layers, want):
    from diag.bench.e2e import e2e_layouts, one_more_layout
    from diag.layouts import layout
    from diag.zoo.kimi_shaped import drafter_layout

    lays = e2e_layouts(drafter_layout(layers)[0], layers)
    more = one_more_layout(lays)
    assert more == want and more not in lays
    assert set(more.split("+")) <= {p for x in lays for p in x.split("+")}
    layout(more, field="t").check_against(layers, field="t")


def test_repeat_goals_are_recorded_and_rendered_on_both_machines():
    from diag.bench.e2e import goals

    e2e = {"cached": {"checks_s": 0.4}, "one_more_layout": {"wall_s": 7.5}}
    got = goals(e2e)
    assert got["cached.checks_s"] == {"value": 0.4, "limit": 2.0, "met": True}
    assert got["one_more_layout.wall_s"] == {"value": 7.5, "limit": 5.0, "met": False}
    for kind in ("cpu", "gpu"):
        lines = "\n".join(goal_lines({"kind": kind, "sections": {"e2e": e2e}}))
        assert "| repeat run: checks on the cached run (s) | 0.4 | <= 2.0 | met |" in lines
        assert "| repeat run: one more layout on a cached case, in all (s) | 7.5 | <= 5.0 | NOT met |" in lines


def test_end_to_end_records_the_cached_run_and_one_more_layout(tmp_path):
    """bench/e2e.py, which both benches run (gpu.py's _e2e on the GPU, cpu.py's on the CPU), on
    the demo pair: the cached run replays nothing, one more layout replays only its trees."""
    from diag.bench.e2e import end_to_end
    from diag.run.shipped import DEFAULT_PROMPTS, shipped
    from diag.zoo import zoo_path

    target, drafter = zoo_path("llama-tiny", progress=False), zoo_path("llama-tiny-eagle3-embed", progress=False)
    trees = ("chain-1", "chain-3")
    lines, saved = [], []
    e2e = end_to_end(target, drafter, "embed+L2+L4", 5, tmp_path, prompts=shipped(DEFAULT_PROMPTS), limit=2,
                     max_new_tokens=8, gpus=0, dtype="float32", trees=trees, log=lines.append, whole_machine=False,
                     partial=saved.append)
    assert e2e["cache_drop"] != "drop_caches"
    # what a device call stopped at its limit keeps: the first run, then the cached one, each marked incomplete
    assert [sorted(k for k in ("first", "cached", "one_more_layout") if k in d) for d in saved] == [
        ["first"], ["cached", "first"]]
    assert all("incomplete" in d for d in saved) and "incomplete" not in e2e
    assert saved[-1]["first"] == e2e["first"] and saved[-1]["layouts"] == e2e["layouts"]
    assert e2e["first"]["evaluations_replayed"] == e2e["first"]["evaluations"] > 0
    assert e2e["cached"]["evaluations_replayed"] == 0 and e2e["cached"]["cached"]
    more = e2e["one_more_layout"]
    assert more["layout"] == "embed+L1+L2" and more["layout"] not in e2e["layouts"]
    assert more["evaluations_replayed"] == len(trees) and more["cached"]
    assert set(e2e["repeat_goals"]) == {"cached.checks_s", "one_more_layout.wall_s"}
    assert any("e2e.one_more_layout" in line for line in lines) and any("checks_s" in line for line in lines)


def test_a_section_that_fails_keeps_what_it_saved_as_it_went():
    """bench/common.section: a section that saved partial results (marked "incomplete") and then
    failed keeps them beside its error; one that saved nothing records the error alone."""
    from diag.bench.common import section

    res = {"sections": {}}

    def runs() -> dict:
        res["sections"]["e2e"] = {"first": {"wall_s": 1.0}, "incomplete": "the cached run did not finish"}
        raise RuntimeError("out of memory")
    assert section(res, "e2e", runs, log=lambda *_: None) is None
    got = res["sections"]["e2e"]
    assert "out of memory" in got["error"] and got["partial"]["first"] == {"wall_s": 1.0}
    section(res, "load", lambda: 1 / 0, log=lambda *_: None)
    assert "partial" not in res["sections"]["load"] and "ZeroDivisionError" in res["sections"]["load"]["error"]


@pytest.mark.skipif(not kernel_runs, reason="needs Triton with CUDA or TRITON_INTERPRET=1")
def test_split_experts_on_the_fused_kernels_sum_what_the_whole_layer_sums(grouped_tiles):
    """ShardedExperts over FastPackedExperts shards (4 experts -> 2, 1, 1): each shard's
    sentinel pairs routed nowhere and zeroed, its sum over the slots in fp32; the shards' sum
    equals the whole layer's fused output to fp32 reassociation under bf16 rounding."""
    from diag.int4.sharded import ShardedExperts

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = _experts(7, E=4, H=256, I=256).to(dev)
    m.__class__ = FastPackedExperts
    split = ShardedExperts.of(copy.deepcopy(m), [dev] * 3)      # words of its own: each shard lays out its slice
    shards = list(split.shards)
    assert [s.num_experts for s in shards] == [2, 1, 1] and all(type(s) is FastPackedExperts for s in shards)
    x = torch.randn(40, 256, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(40)]).to(dev)
    w = torch.rand(40, 2, device=dev)
    whole = fused_experts(m, x, idx, w).float()
    got = split(x, idx, w).float()
    assert all(s.kernel_layout for s in shards)                   # the fused path ran, not the eager loop
    assert float((got - whole).norm() / whole.norm()) < 4e-3
    ref = PackedExperts.forward(m, x, idx, w).float()
    assert float((got - ref).norm() / ref.norm()) < 1e-2


def test_a_few_tokens_row_blocks_take_the_small_stages(grouped_tiles):
    """fast.stages_of: blocks of at most SMALL_BLOCK_ROWS rows that are not the full block take
    small_stages (a decode step's 16 rows: 3), every other num_stages (64: 2, where 3 stages cost
    the H200 a third more; 192 = 64 x 3: 2; 128: 2)."""
    grouped_tiles["gate_up"].update(block_m=64, split=3, num_stages=2, small_stages=3)
    assert [fast.stages_of("gate_up", r) for r in (16, 32, 64, 128, 192)] == [3, 3, 2, 2, 2]
    grouped_tiles["gate_up"].pop("small_stages")
    assert fast.stages_of("gate_up", 16) == 2 and fast.SMALL_BLOCK_ROWS == 32


def test_the_shipped_tiles_widen_64_and_128_row_blocks_only():
    """GROUPED's defaults: 64- and 128-row blocks at block_n 256 and 16 warps (BY_ROWS, faster on
    the H100 and the H200 measured), 16 and 32 rows and the full block (192) on the GEMMs' own."""
    want = {16: (128, 8), 32: (128, 8), 64: (256, 16), 128: (256, 16), 192: (128, 8)}
    for w in ("gate_up", "down"):
        assert {r: (fast.tile_of(w, r)["block_n"], fast.tile_of(w, r)["num_warps"]) for r in want} == want
    wide = fast.tile_of("down", 64)
    assert not wide["block_n"] % (16 * wide["num_warps"])        # whole 64-row slabs a warpgroup: wgmma_runs' rule
    assert "only" not in wide                                     # a marker, not a tile key
    for r in (64, 128):                                           # measured on wgmma_kernel alone: the Triton
        assert fast.tile_of("gate_up", r, wgmma=False)["block_n"] == 128      # kernel keeps its own tile


def test_a_tuned_row_tile_serves_the_triton_kernel_too(grouped_tiles):
    """A by_rows entry without "only" (what bench/tiles.block_costs sets: timed on the kernel that ran)
    applies on either kernel; one marked "only": "wgmma" on wgmma_kernel's alone."""
    grouped_tiles["down"].update(block_m=64, split=3, block_n=128, num_warps=8,
                                 by_rows={64: {"block_n": 256}, 32: {"block_n": 64, "only": "wgmma"}})
    assert fast.tile_of("down", 64, wgmma=False)["block_n"] == 256
    assert fast.tile_of("down", 32, wgmma=False)["block_n"] == 128 and fast.tile_of("down", 32)["block_n"] == 64


def test_a_row_size_runs_its_own_tile_below_the_full_block(grouped_tiles):
    """fast.tile_of: a row block below the full one takes what its GEMM's by_rows holds for that
    size (block_n, num_warps), on top of the GEMM's tile and its stages; the full block and the
    sizes by_rows does not name take the GEMM's own; other keys are not taken. The docstring's
    example: block_n 128 / 8 warps, by_rows {64: {block_n 256}, 128: {block_n 256, 16 warps}}."""
    grouped_tiles["gate_up"].update(block_m=64, block_n=128, num_warps=8, split=3, num_stages=2, small_stages=3,
                                    by_rows={64: {"block_n": 256}, 128: {"block_n": 256, "num_warps": 16},
                                             16: {"split": 2, "block_m": 8}, 192: {"block_n": 256}})
    got = {r: fast.tile_of("gate_up", r) for r in (16, 32, 64, 128, 192)}
    assert {r: (t["block_n"], t["num_warps"], t["num_stages"]) for r, t in got.items()} == \
        {16: (128, 8, 3), 32: (128, 8, 3), 64: (256, 8, 2), 128: (256, 16, 2), 192: (128, 8, 2)}
    assert got[16]["split"] == 3 and got[16]["block_m"] == 64           # by_rows sets block_n and warps only
    assert fast.tile_of("down", 64)["block_n"] == grouped_tiles["down"]["block_n"]


@pytest.mark.skipif(not kernel_runs, reason="needs Triton with CUDA or TRITON_INTERPRET=1")
def test_a_row_sizes_own_tile_gives_the_same_bits(grouped_tiles):
    """A 16-row block run with a by_rows tile twice as wide (and with 4 warps more) computes the
    same bf16 bits as with its GEMM's own tile: each output element is one dot over K either way."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = _experts(11, E=4, H=256, I=256).to(dev)
    m.__class__ = FastPackedExperts
    grouped_tiles.update(dequant=2, piece=32)
    to_kernel_layout(m, 32)
    x = torch.randn(24, 256, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(24)]).to(dev)
    w = torch.rand(24, 2, device=dev)
    for which in ("gate_up", "down"):           # full blocks of 32 rows: 16 lies below, where by_rows applies
        grouped_tiles[which].update(block_m=32, block_n=64, num_warps=4, split=1, wgmma=False, wide=False)
    own = fused_experts(m, x, idx, w, rows=16)
    for which in ("gate_up", "down"):
        grouped_tiles[which]["by_rows"] = {16: {"block_n": 128, "num_warps": 8}}
    assert fast.tile_of("down", 16)["block_n"] == 128
    assert torch.equal(fused_experts(m, x, idx, w, rows=16), own)


def test_block_costs_keep_each_sizes_fastest_tile(grouped_tiles, monkeypatch):
    """bench/tiles.block_costs times each row size under every variant and keeps the fastest in
    both GEMMs' by_rows (none where the GEMM's own tile wins; a by_rows left from before is
    dropped), its cost from that time; a variant that raises is recorded with its error and never
    chosen. Fake clocks: 16 rows, own tile 2 ms, block_n 256 3 ms; 32 rows, own 4 ms, 256 1 ms;
    the 16-warp variant raises."""
    from diag.bench import tiles

    for which in ("gate_up", "down"):
        grouped_tiles[which].update(block_m=64, split=1, block_n=128, num_warps=8)
    grouped_tiles["gate_up"]["by_rows"] = {16: {"block_n": 512}}
    clock = {(16, 128): 2e-3, (16, 256): 3e-3, (32, 128): 4e-3, (32, 256): 1e-3}
    now = {}

    def fake_timed(fn, repeat, warmup):
        fn()
        t, d = fast.tile_of("gate_up", now["rows"]), fast.tile_of("down", now["rows"])
        assert (t["block_n"], t["num_warps"]) == (d["block_n"], d["num_warps"])
        if t["num_warps"] == 16:
            raise RuntimeError("out of shared memory")
        return clock[(now["rows"], t["block_n"])]

    monkeypatch.setattr(fast, "fused_experts", lambda *a, rows=None, **kw: now.update(rows=rows))
    monkeypatch.setattr(tiles, "timed", fake_timed)
    got = tiles.block_costs(_experts(5, E=8, H=256, I=256), top_k=2)
    assert [r["rows"] for r in got["rows"]] == [16, 32]
    assert [r["variant"] for r in got["rows"]] == [{}, {"block_n": 256}]
    assert got["by_rows"] == {32: {"block_n": 256}}
    assert fast.GROUPED["gate_up"]["by_rows"] == fast.GROUPED["down"]["by_rows"] == {32: {"block_n": 256}}
    tried = got["rows"][1]["tried"]
    assert [t["seconds"] for t in tried[:2]] == [4e-3, 1e-3] and "shared memory" in tried[2]["error"]
    assert got["costs_us"] == {16: pytest.approx(2e-3 / got["rows"][0]["blocks"] * 1e6),
                               32: pytest.approx(1e-3 / got["rows"][1]["blocks"] * 1e6)}
    assert fast.GROUPED["block_costs"] == got["costs_us"]


def test_block_costs_time_each_small_row_block_at_half_a_block_an_expert(grouped_tiles, monkeypatch):
    """bench/tiles.block_costs: for each row block below the full one, both GEMMs routed for it
    (fused_experts' rows) at r * E / (2 k) tokens, the time over the blocks launched, set into
    GROUPED["block_costs"], which grouped_block_m then weighs. 8 experts top-2, full block 64 ->
    16 rows at 32 tokens, 32 at 64; no 64 or 128."""
    from diag.bench import tiles

    grouped_tiles["gate_up"].update(block_m=64, split=1)
    grouped_tiles["down"].update(block_m=64, split=1)
    seen = []

    def fake_gemm(a, packed, scale, r, group, which, *, a_div, piece, route_w=None, glu=False):
        seen.append((which, r.block_m, r.num_pairs))
        return torch.ones(r.num_pairs, packed.shape[1] // (2 if glu else 1), dtype=torch.bfloat16)

    monkeypatch.setattr(fast, "grouped_int4_gemm", fake_gemm)
    monkeypatch.setattr(tiles, "timed", lambda fn, repeat, warmup: (fn(), 2e-3)[1])
    m = _experts(5, E=8, H=256, I=256)
    got = tiles.block_costs(m, top_k=2)
    assert [(r["rows"], r["tokens"]) for r in got["rows"]] == [(16, 32), (32, 64)]
    assert {(w, b) for w, b, _ in seen} == {("gate_up", 16), ("down", 16), ("gate_up", 32), ("down", 32)}
    for r in got["rows"]:
        assert 8 <= r["blocks"] <= 2 * r["tokens"] // r["rows"] + 8        # each expert's ceil(pairs / rows)
        assert r["us_per_block"] == pytest.approx(2e-3 / r["blocks"] * 1e6)
    assert fast.GROUPED["block_costs"] == got["costs_us"] and set(got["costs_us"]) == {16, 32}
