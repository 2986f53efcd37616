"""diag.int4.routing: the pair order the grouped INT4 GEMMs read, against a reference written
from its definition, and its CUDA-graph replay against the eager computation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.int4 import routing
from diag.int4.routing import replayed_routes, routes


def reference(idx: torch.Tensor, E: int, block_m: int) -> tuple[list[int], list[int]]:
    """Expert by expert, its pairs in their original order, padded with S to a multiple of
    block_m; then padding blocks up to S // block_m + min(E, S) blocks (sorted_ids S, expert -1)."""
    flat = idx.reshape(-1).tolist()
    S = len(flat)
    ids, experts = [], []
    for e in range(E):
        mine = [p for p, x in enumerate(flat) if x == e]
        n = -(-len(mine) // block_m)
        ids += mine + [S] * (n * block_m - len(mine))
        experts += [e] * n
    total = S // block_m + min(E, S)
    return ids + [S] * ((total - len(experts)) * block_m), experts + [-1] * (total - len(experts))


@settings(max_examples=60, deadline=None)
@given(E=st.integers(1, 9), T=st.integers(1, 40), K=st.integers(1, 3), block_m=st.sampled_from([1, 2, 4, 16]),
       seed=st.integers(0, 2 ** 16))
def test_routes_is_the_reference(E, T, K, block_m, seed):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, E, (T, K), generator=gen)            # repeats and empty experts included
    r = routes(idx, E, (block_m,))[block_m]
    ids, experts = reference(idx, E, block_m)
    assert r.sorted_ids.tolist() == ids and r.block_expert.tolist() == experts
    assert r.sorted_ids.dtype == r.block_expert.dtype == torch.int32 and r.num_pairs == T * K


def test_the_routing_kernel_routes_what_the_torch_ops_route():
    """routing_kernel.route_pairs (routes() on CUDA up to KERNEL_PAIRS pairs) under Triton's
    interpreter, in a subprocess (TRITON_INTERPRET is read at Triton's import): the same
    sorted_ids and block_expert as torch_routes on 16 cases, the edges among them (one pair, every
    pair the sentinel, Kimi's 384 experts at 64 tokens, a shard's 48 with the sentinel, 192-row
    blocks)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    script = Path(__file__).with_name("routing_interpreted.py")
    done = subprocess.run([sys.executable, str(script), "16", "3"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got == {"cases": 16, "mismatches": []}


def test_routes_takes_the_kernel_on_cuda_for_few_pairs_only(monkeypatch):
    """routing.in_kernel: CUDA, KERNEL on, 1..KERNEL_PAIRS pairs, fewer than KERNEL_EXPERTS experts."""
    from diag.int4 import fast

    monkeypatch.setattr(fast, "triton_available", lambda: True)
    cuda = lambda n: type("T", (), {"is_cuda": True, "numel": lambda self: n})()   # noqa: E731
    assert routing.in_kernel(cuda(512), 48) and routing.in_kernel(cuda(routing.KERNEL_PAIRS), 384)
    assert not routing.in_kernel(cuda(routing.KERNEL_PAIRS + 1), 384)
    assert not routing.in_kernel(cuda(0), 48) and not routing.in_kernel(cuda(64), routing.KERNEL_EXPERTS)
    assert not routing.in_kernel(torch.zeros(8, 2, dtype=torch.long), 4)          # the CPU: torch ops
    monkeypatch.setattr(routing, "KERNEL", False)
    assert not routing.in_kernel(cuda(512), 48)


def test_a_decode_steps_few_pairs_launch_few_blocks():
    """The module docstring's bound: Kimi's 384 experts, 8 tokens x top-8 (64 pairs), block_m 16
    -> 64 // 16 + min(384, 64) = 68 row blocks, not 388; the worst case (64 distinct experts, one
    pair each) uses 64 of them; 2048 tokens keep S // block_m + E."""
    gen = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(384, generator=gen)[:8] for _ in range(8)])
    r = routes(idx, 384, (16,))[16]
    used = int((r.block_expert >= 0).sum())
    assert r.block_expert.numel() == 68 and used == idx.unique().numel() <= 64
    distinct = torch.arange(64).view(8, 8)                         # every pair its own expert
    assert int((routes(distinct, 384, (16,))[16].block_expert >= 0).sum()) == 64
    many = torch.randint(0, 384, (2048, 8), generator=gen)
    assert routes(many, 384, (64,))[64].block_expert.numel() == 2048 * 8 // 64 + 384


def test_replayed_routes_off_cuda_is_routes():
    idx = torch.tensor([[1], [0], [1]])
    graphs = len(routing._GRAPHS)                # CUDA tests earlier in the session may have some
    for _ in range(3):
        got = replayed_routes(idx, 2, (2,))[2]
        assert got.sorted_ids.tolist()[:4] == [1, 3, 0, 2]
    assert len(routing._GRAPHS) == graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_replayed_routes_capture_once_per_shape_and_equal_routes(monkeypatch):
    monkeypatch.setattr(routing, "KERNEL", False)           # the torch ops' graphs (past KERNEL_PAIRS)
    monkeypatch.setattr(routing, "_GRAPHS", routing.OrderedDict())
    monkeypatch.setattr(routing, "_SEEN", {})
    gen = torch.Generator(device="cuda").manual_seed(0)
    E, T, K = 384, 512, 8
    outs = []
    for call in range(4):                                        # eager, capture + replay, replay, replay
        idx = torch.rand(T, E, device="cuda", generator=gen).topk(K, dim=-1).indices
        got = replayed_routes(idx, E, (64, 192))
        want = routes(idx, E, (64, 192))
        for bm in (64, 192):
            assert torch.equal(got[bm].sorted_ids, want[bm].sorted_ids)
            assert torch.equal(got[bm].block_expert, want[bm].block_expert)
        outs.append(got)
        assert len(routing._GRAPHS) == (0 if call == 0 else 1)
    assert outs[2] is outs[3]                                    # the graph's static outputs
    other = torch.zeros(T + 1, K, dtype=torch.long, device="cuda")
    replayed_routes(other, E, (64, 192))
    assert len(routing._GRAPHS) == 1                             # a new shape is first routed eagerly


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the routing kernel on a CUDA device")
def test_the_routing_kernel_on_cuda_routes_what_the_torch_ops_route():
    """On the GPU, every size up to KERNEL_PAIRS (decode rounds to a 512-token prefill chunk),
    Kimi's 384 experts and a shard's 48 with the sentinel, the block sizes the GEMMs take."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    for E, T, K, sentinel in ((384, 1, 8, False), (384, 64, 8, False), (48, 64, 8, True), (384, 512, 8, False),
                              (48, 512, 8, True), (7, 33, 3, True)):
        idx = torch.randint(0, E + sentinel, (T, K), device="cuda", generator=gen)
        assert routing.in_kernel(idx, E)
        for bm in (16, 32, 64, 192):
            want, got = routing.torch_routes(idx, E, (bm,))[bm], routing.kernel_route(idx, E, bm)
            assert torch.equal(got.sorted_ids, want.sorted_ids), (E, T, K, bm)
            assert torch.equal(got.block_expert, want.block_expert), (E, T, K, bm)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_fused_experts_with_replayed_routing_is_the_eager_routings_bits(monkeypatch):
    """Layer after layer of one shape (the graph's static routing reused, its inputs new each
    time), fused_experts gives the bits it gives with routes() computed afresh, and with the
    routing kernel's."""
    from torch.nn import functional as F

    from diag.int4 import fast
    from diag.int4.packed import PackedExperts

    monkeypatch.setattr(routing, "KERNEL", False)           # the torch ops' graphs (past KERNEL_PAIRS)
    monkeypatch.setattr(routing, "_GRAPHS", routing.OrderedDict())
    monkeypatch.setattr(routing, "_SEEN", {})
    gen = torch.Generator(device="cuda").manual_seed(1)
    E, H, I, T, K = 8, 256, 256, 96, 2
    m = PackedExperts(E, H, I, 32, F.silu, device="cuda")
    for name in ("gate_up_proj", "down_proj"):
        buf = getattr(m, f"{name}_packed")
        buf.copy_(torch.randint(-2 ** 31, 2 ** 31 - 1, buf.shape, device="cuda", dtype=torch.int32, generator=gen))
        sc = getattr(m, f"{name}_scale")
        sc.copy_((torch.rand(sc.shape, device="cuda", generator=gen) * 0.05).to(sc.dtype))
    layers = []
    for _ in range(4):
        x = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
        idx = torch.rand(T, E, device="cuda", generator=gen).topk(K, dim=-1).indices
        w = torch.softmax(torch.randn(T, K, device="cuda", generator=gen), -1)
        layers.append((x, idx, w, fast.fused_experts(m, x, idx, w)))
    assert len(routing._GRAPHS) == 1
    monkeypatch.setattr(fast, "replayed_routes", routes)
    for x, idx, w, got in layers:
        assert torch.equal(got, fast.fused_experts(m, x, idx, w))
    monkeypatch.setattr(routing, "KERNEL", True)            # and routed by the one kernel: the same bits
    for x, idx, w, got in layers:
        assert routing.in_kernel(idx, E) and torch.equal(got, fast.fused_experts(m, x, idx, w))


def test_the_fused_layer_runs_with_its_own_device_current(monkeypatch):
    """Triton launches on the current device: FastPackedExperts makes the layer's device current
    around fused_experts (on N GPUs a layer on cuda:3 may run while cuda:0 is current)."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from torch.nn import functional as F

    from diag.int4 import fast
    from diag.int4.packed import PackedExperts

    m = PackedExperts(2, 64, 64, 32, F.silu)
    m.__class__ = fast.FastPackedExperts
    m.gate_up_proj_scale = m.gate_up_proj_scale.to(torch.bfloat16)
    current, calls = [], []

    @contextmanager
    def device(d):
        current.append(d)
        yield
        current.pop()

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(fast, "triton_available", lambda: True)
    monkeypatch.setattr(fast, "fused_experts", lambda *a: calls.append(list(current)) or "out")
    hidden = SimpleNamespace(is_cuda=True, device="cuda:3")
    assert m.forward(hidden, None, None) == "out" and calls == [["cuda:3"]]


def test_routing_graphs_are_off_inside_routed_eagerly_and_while_the_caller_captures(monkeypatch):
    """graphs_allowed: on CUDA, outside routed_eagerly (nested blocks too, restored after an
    error), not while the caller's stream is being captured; never off CUDA."""
    from diag.int4.routing import graphs_allowed, routed_eagerly

    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    cuda = torch.device("cuda", 0)
    assert graphs_allowed(cuda) and not graphs_allowed(torch.device("cpu"))
    with routed_eagerly():
        assert not graphs_allowed(cuda)
        with routed_eagerly():
            assert not graphs_allowed(cuda)
        assert not graphs_allowed(cuda)
    assert graphs_allowed(cuda)
    with pytest.raises(RuntimeError), routed_eagerly():
        raise RuntimeError("a profiled loop failed")
    assert graphs_allowed(cuda)
    capturing[0] = True
    assert not graphs_allowed(cuda)


# ---- the row block a GEMM is routed for (fast.grouped_block_m) ----------------------------------------

def test_the_row_block_weighs_overflowing_experts_against_wider_blocks():
    """Kimi's 384 experts, block_m 64 split 3 (192 rows), the default block costs (blocks.BLOCK_COSTS):
    a few tokens keep 16 rows; at 768 tokens (16 pairs an expert) 43% of the experts would take a
    second block of 16, so 32 rows cost less; at 1152 (24) 32 still; at 1536 (32) 45% would take
    a second block of 32, so 64; 64 up to 4096; the full block from 8192. An H100's costs with
    64-row blocks at 3 stages (23.8 us) kept 32 at 1536."""
    from diag.int4 import blocks, fast

    block = lambda tokens: fast.grouped_block_m(tokens * 8, 384, "gate_up")   # noqa: E731
    assert fast.block_rows("gate_up") == 192 and fast.GROUPED["block_costs"] == blocks.BLOCK_COSTS
    assert [block(t) for t in (1, 8, 96, 192, 384, 576)] == [16] * 6
    assert [block(t) for t in (768, 1152)] == [32] * 2
    assert [block(t) for t in (1536, 2048, 3072)] == [64] * 3 and block(8192) == 192 and block(32768) == 192
    h100_3_stages = ((16, 10.8), (32, 13.5), (64, 23.8), (128, 33.0))
    assert blocks.cheapest_block(1536 * 8, 384, h100_3_stages) == 32
    assert round(blocks.expected_blocks(768 * 8, 384, 16) / 384, 2) == 1.43           # the worked example
    assert round(blocks.expected_blocks(768 * 8, 384, 32) / 384, 3) == 1.0
    assert blocks.cheapest_block(768 * 8, 384, ((16, 11.1), (32, 12.9))) == 32
    assert blocks.cheapest_block(768 * 8, 384, ((16, 11.1), (32, 16.0))) == 16       # a dearer 32: 16 again
    assert fast.grouped_block_m(1536 * 8, 384, "gate_up") == 64                    # the mean's own size, chosen
    assert fast.grouped_block_m(768 * 8, 384, "gate_up") == 32                     # a wider one than the mean's


def test_without_block_costs_the_row_block_is_the_power_of_two_over_the_mean(monkeypatch):
    from diag.int4 import fast

    monkeypatch.setitem(fast.GROUPED, "block_costs", {})
    assert [fast.grouped_block_m(t * 8, 384, "gate_up") for t in (1, 768, 1536, 2048, 8192)] == [16, 16, 32, 64, 192]


@settings(max_examples=40, deadline=None)
@given(E=st.integers(8, 64), per=st.floats(0.05, 40.0), rows=st.sampled_from([16, 32, 64]), seed=st.integers(0, 999))
def test_expected_blocks_is_what_uniform_routing_launches_on_average(E, per, rows, seed):
    """expected_blocks (each expert's count Poisson) against the blocks that pairs drawn uniformly
    over the experts take, averaged over 400 draws: within 3% and a block, and never fewer than
    the experts reached."""
    from diag.int4.blocks import expected_blocks

    pairs = max(1, round(per * E))
    gen = torch.Generator().manual_seed(seed)
    counts = torch.stack([torch.bincount(torch.randint(0, E, (pairs,), generator=gen), minlength=E)
                          for _ in range(400)])
    drawn = float((-(-counts // rows)).sum(1).float().mean())
    got = expected_blocks(pairs, E, rows)
    assert abs(got - drawn) <= 0.03 * drawn + 1.0
    assert got >= float((counts > 0).sum(1).float().mean()) - 1.0


def test_expected_blocks_holds_a_mean_in_the_thousands():
    """The Poisson pmf in logs: at 5,000 pairs an expert exp(-5000) underflows, the sum does not;
    about 5000 / 128 + 1/2 blocks an expert."""
    from diag.int4.blocks import expected_blocks

    got = expected_blocks(5000 * 8, 8, 128) / 8
    assert abs(got - (5000 / 128 + 0.5)) < 0.1


def test_the_bench_picks_the_routing_kernel_only_where_it_won():
    """bench/routing_ab.kernel_pairs: the most pairs up to which the kernel won at every size and
    expert count (its docstring's example), 0 where it lost at the fewest or routed otherwise."""
    from diag.bench.routing_ab import kernel_pairs

    row = lambda pairs, kernel, torch_, equal=True: {"pairs": pairs, "kernel_us": kernel,   # noqa: E731
                                                     "torch_us": torch_, "equal": equal}
    rows = [row(8, 5, 50), row(8, 6, 40), row(2048, 6, 60), row(4096, 70, 65), row(4096, 6, 65)]
    assert kernel_pairs(rows) == 2048
    assert kernel_pairs([row(8, 60, 50), row(64, 5, 50)]) == 0
    assert kernel_pairs([row(8, 5, 50), row(64, 5, 50, equal=False)]) == 8
    assert kernel_pairs([row(8, 5, 50), row(64, 5, 50)]) == 64


def test_bench_gpu_routing_torch_reaches_the_routing_section(monkeypatch, tmp_path):
    """`diag bench gpu --routing torch` (the A/B's other arm) is passed to the bench, "auto" by
    default; an unknown way is refused before anything is timed."""
    from diag.bench import gpu, routing_ab
    from diag.cli.main import main

    seen = []
    monkeypatch.setattr(gpu, "run", lambda out, work, **kw: seen.append(kw["routing"]))
    for extra, want in (([], "auto"), (["--routing", "torch"], "torch")):
        assert main(["bench", "gpu", "--out", str(tmp_path / "x.json"), *extra]) == 0
        assert seen[-1] == want
    with pytest.raises(ValueError, match="routing way 'fast'"):
        routing_ab.measure("cpu", way="fast")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the routing kernel on a CUDA device")
def test_the_routing_section_times_both_ways_and_uses_the_kernel_only_where_asked(monkeypatch):
    """routing_ab.measure: both ways timed whatever the way; "auto" turns the kernel on up to its
    pick, "torch" leaves it off (the pick still recorded)."""
    from diag.bench import routing_ab

    monkeypatch.setattr(routing, "KERNEL", routing.KERNEL)
    monkeypatch.setattr(routing, "KERNEL_PAIRS", routing.KERNEL_PAIRS)
    monkeypatch.setattr(routing_ab, "TOKENS", (1, 64))
    monkeypatch.setattr(routing_ab, "REPEATS", 5)
    off = routing_ab.measure("cuda", way="torch")
    assert routing.KERNEL is False and off["kernel_used_up_to"] == 0 and off["way"] == "torch"
    assert all(r["torch_us"] > 0 and r["kernel_us"] > 0 and r["equal"] for r in off["rows"])
    auto = routing_ab.measure("cuda")
    assert auto["kernel_used_up_to"] == auto["kernel_pairs"] and routing.KERNEL is (auto["kernel_pairs"] > 0)
