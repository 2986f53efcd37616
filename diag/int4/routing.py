"""Routing of (token, slot) pairs to the grouped INT4 GEMMs' row blocks, and its replay as a
CUDA graph.

  pairs   p = t * K + k for token t, slot k (S = T * K)          top_k_index [T, K]
  route   pairs sorted by expert (stable), each expert's run padded to block_m rows

Worked example, block_m 2, experts [1, 0, 1] (T 3, K 1): the sorted experts [0, 1, 1] start
at bounds [0, 1, 3] -> counts [1, 2] -> blocks [1, 1]; sorted_ids = [1, S | 0, 2] (S = 3 pads
expert 0's run); block_expert = [0, 1] (then -1 for the unused blocks of the bound below).

A pair whose expert is `num_experts` (the sentinel: an expert held by another shard,
diag.int4.sharded) is routed nowhere: it is in no block, and its output row is never written.
Worked example, block_m 2, E 2, experts [2, 0, 2] (T 3, K 1): sorted [0, 2, 2], counts [1, 0],
blocks [1, 0]; sorted_ids = [1, S | S, S | S, S] (3 // 2 + 2 = 3 blocks), block_expert = [0, -1, -1].

No host sync: the number of blocks is bounded by S // block_m + min(E, S), and the counts come
from searchsorted over the sorted ids (torch.bincount asks the host for its maximum). So the
computation can be captured. It is some 40 small kernels, whose launches took 1.3 ms of host
time per MoE layer on an H200's host (the GPU idle meanwhile: 5% of Kimi's layer at 8k tokens,
most of it at a decode step's few tokens). `replayed_routes` captures it once per shape and
replays it for every later layer and step of that shape (one launch). Inside a captured forward
(the verify's graph, a program's) the ~30 kernels are the graph's own, and their device time is
paid at every MoE layer: on CUDA, up to KERNEL_PAIRS pairs, routes() is one Triton kernel
instead (routing_kernel.py; the same values, tests/test_routing.py holds them equal).

The bound: an expert with c >= 1 pairs takes ceil(c / block_m) = floor((c - 1) / block_m) + 1
blocks, so n such experts take at most (S - n) // block_m + n <= S // block_m + n blocks, and
n <= min(E, S). The GEMMs launch a row of programs per bound block and the unused ones exit at
once, so at a decode step's few pairs the bound is the launch: Kimi, 8 tokens x 8 slots,
block_m 16 -> 64 // 16 + 64 = 68 blocks, where S // block_m + E launched 388 (320 empty, times
every N tile).

This module knows index arithmetic and CUDA graphs; nothing about weights or the GEMMs' kernels.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Routing:
    sorted_ids: torch.Tensor     # [num_blocks * BLOCK_M] int32 pair indices, S = padding
    block_expert: torch.Tensor   # [num_blocks] int32 expert of each block, -1 unused
    num_pairs: int
    block_m: int = 0             # rows per block (each expert's run is padded to it)


def route(top_k_index: torch.Tensor, num_experts: int, block_m: int) -> Routing:
    """[T, K] expert ids -> padded, expert-grouped pair order, without a host sync."""
    return routes(top_k_index, num_experts, (block_m,))[block_m]


# routes() in one kernel (routing_kernel.py) on CUDA up to this many pairs, and experts below
# KERNEL_EXPERTS (its program holds the pairs and the experts' bins in registers); past them, the
# torch ops below. KERNEL: False turns it off (bench/routing_ab.py times both ways).
KERNEL = True
KERNEL_PAIRS = 4096
KERNEL_EXPERTS = 1024


def routes(top_k_index: torch.Tensor, num_experts: int, block_ms) -> dict[int, Routing]:
    """route() for each block_m, the pairs sorted by expert once."""
    if in_kernel(top_k_index, num_experts):
        return {bm: kernel_route(top_k_index, num_experts, bm) for bm in dict.fromkeys(block_ms)}
    return torch_routes(top_k_index, num_experts, block_ms)


def torch_routes(top_k_index: torch.Tensor, num_experts: int, block_ms) -> dict[int, Routing]:
    """routes() in torch ops (~30 small kernels on CUDA; any device)."""
    flat = top_k_index.reshape(-1).to(torch.int64)                         # [S]
    S, dev = flat.numel(), flat.device
    order = torch.argsort(flat, stable=True)                               # [S]
    e_sorted = flat[order]
    bounds = torch.searchsorted(e_sorted, torch.arange(num_experts + 1, device=dev))   # [E + 1]
    counts = bounds[1:] - bounds[:-1]                                      # [E]
    rank = torch.arange(S, device=dev) - bounds[e_sorted]                  # place within its expert
    routed = e_sorted < num_experts                                        # the sentinel's pairs are not
    out = {}
    for block_m in dict.fromkeys(block_ms):
        blocks = (counts + block_m - 1) // block_m                         # [E]
        ends = torch.cumsum(blocks, 0)                                     # [E]
        padded_start = (ends - blocks) * block_m
        max_blocks = S // block_m + min(num_experts, S)                    # the row blocks: the docstring's bound
        sorted_ids = torch.full((max_blocks * block_m + 1,), S, dtype=torch.int32, device=dev)
        at = padded_start[e_sorted.clamp(max=num_experts - 1)] + rank
        sorted_ids[torch.where(routed, at, max_blocks * block_m)] = order.to(torch.int32)   # the last: a drop
        sorted_ids = sorted_ids[:-1]
        expert = torch.searchsorted(ends, torch.arange(max_blocks, device=dev), right=True)   # [max_blocks]
        block_expert = torch.where(expert < num_experts, expert, -1).to(torch.int32)
        out[block_m] = Routing(sorted_ids, block_expert, S, block_m)
    return out


def in_kernel(top_k_index: torch.Tensor, num_experts: int) -> bool:
    """Whether routes() takes the one kernel: on CUDA, KERNEL on, at most KERNEL_PAIRS pairs
    and KERNEL_EXPERTS experts, Triton importable."""
    if not (KERNEL and top_k_index.is_cuda and 0 < top_k_index.numel() <= KERNEL_PAIRS
            and num_experts < KERNEL_EXPERTS):
        return False
    from diag.int4.fast import triton_available
    return triton_available()


def kernel_route(top_k_index: torch.Tensor, num_experts: int, block_m: int) -> Routing:
    """route() from routing_kernel.route_pairs, one launch: the same sorted_ids and block_expert
    (on any device Triton runs on: the CPU under TRITON_INTERPRET)."""
    from diag.int4.routing_kernel import route_pairs

    flat = top_k_index.reshape(-1).contiguous()
    S, dev = flat.numel(), flat.device
    sp, ep = max(16, 1 << (S - 1).bit_length()), max(16, 1 << num_experts.bit_length())   # > num_experts
    max_blocks = S // block_m + min(num_experts, S)
    rows, mbp = max_blocks * block_m, max(16, 1 << max_blocks.bit_length())   # > max_blocks: ends reach it
    sorted_ids = torch.empty(rows, dtype=torch.int32, device=dev)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    scratch = torch.empty(2 * ep + mbp, dtype=torch.int32, device=dev)
    route_pairs[(1,)](flat, sorted_ids, block_expert, scratch, S, num_experts, max_blocks, rows,
                      BM=block_m, SP=sp, EP=ep, ROWSP=max(16, 1 << (rows - 1).bit_length()), MBP=mbp,
                      num_warps=4 if sp <= 1024 else 8)
    return Routing(sorted_ids, block_expert, S, block_m)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    index: torch.Tensor              # the static input the graph reads
    out: dict[int, Routing]          # the static outputs it writes


# Graphs by (device, shape, dtype, experts, block_ms); a shape is captured the second time it
# is seen (a one-off shape costs no capture), and at most KEPT graphs are held (least recently
# used dropped), each a few MB at most (Kimi at 32k tokens: 262,144 pairs). The shapes seen
# once are forgotten past SEEN_KEPT of them (a long run's many one-off prefill shapes).
KEPT = 16
SEEN_KEPT = 1024
_GRAPHS: "OrderedDict[tuple, _Captured]" = OrderedDict()
_SEEN: dict[tuple, bool] = {}


_EAGERLY = [0]          # open `routed_eagerly` blocks


@contextlib.contextmanager
def routed_eagerly():
    """Inside the block `replayed_routes` routes with its kernels, no graph captured or replayed.
    For torch.profiler's windows (bench/sampled.py's profiles): a profile wants the routing's own
    kernels, and a routing graph captured before a profile and replayed inside one crashed the
    process (a segfault in CUDAGraph.replay under the profiler, H100, torch 2.11; reports/bench/NOTES.md,
    twenty-second stop)."""
    _EAGERLY[0] += 1
    try:
        yield
    finally:
        _EAGERLY[0] -= 1


def graphs_allowed(dev: torch.device) -> bool:
    """Whether `replayed_routes` may use its graphs on `dev`: on CUDA, outside `routed_eagerly`,
    and not while the caller's stream is itself being captured (the routing is then part of the
    caller's graph)."""
    return dev.type == "cuda" and not _EAGERLY[0] and not torch.cuda.is_current_stream_capturing()


def replayed_routes(top_k_index: torch.Tensor, num_experts: int, block_ms) -> dict[int, Routing]:
    """routes(), replayed from a CUDA graph where the same shape was routed before.

    The Routing tensors of a replay are the graph's static outputs: they hold this call's
    routing until the next replayed_routes() of the same shape on the same device, which
    overwrites them in stream order. A caller that consumes them in the same stream before
    routing again (fused_experts: one layer's GEMMs) reads them safely; one that keeps them
    must call routes(). Off CUDA, while the caller's stream is itself being captured, or where
    routes() is one kernel (in_kernel), routes() as is."""
    block_ms = tuple(dict.fromkeys(block_ms))
    dev = top_k_index.device
    if not graphs_allowed(dev) or in_kernel(top_k_index, num_experts):     # the kernel: one launch as is
        return routes(top_k_index, num_experts, block_ms)
    key = (dev.index, tuple(top_k_index.shape), top_k_index.dtype, num_experts, block_ms)
    got = _GRAPHS.get(key)
    if got is None:
        if key not in _SEEN:
            if len(_SEEN) >= SEEN_KEPT:
                _SEEN.clear()
            _SEEN[key] = True
            return routes(top_k_index, num_experts, block_ms)
        del _SEEN[key]
        got = _capture(top_k_index, num_experts, block_ms)
        _GRAPHS[key] = got
        while len(_GRAPHS) > KEPT:
            _GRAPHS.popitem(last=False)
    _GRAPHS.move_to_end(key)
    got.index.copy_(top_k_index)
    got.graph.replay()
    return got.out


def _capture(top_k_index: torch.Tensor, num_experts: int, block_ms: tuple) -> _Captured:
    with torch.cuda.device(top_k_index.device):
        index = top_k_index.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                  # warm-up off the capture, as torch asks
            routes(index, num_experts, block_ms)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = routes(index, num_experts, block_ms)
    return _Captured(graph, index, out)
