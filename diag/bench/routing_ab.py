"""The routing's two ways timed on the device at hand, and the pick: routes() in one Triton kernel
(int4/routing_kernel.py) or in torch's ops (routing.torch_routes), each at a decode round's to a
prefill chunk's pairs, for Kimi's 384 experts and a shard's 48 (with the sentinel: the other
shards' pairs). Device time a call: a CUDA graph of INNER calls replayed back to back, the best
of three timings, as a captured forward pays it at every MoE layer.

The pick (`kernel_pairs`): the most pairs up to which the kernel beat the torch ops at every
size and expert count measured, set as routing.KERNEL_PAIRS for the bench's process (0: the
kernel off, routing.KERNEL False). A kernel that loses on a shape is not chosen for it
(issue 36). Worked example: the kernel 6 us against 60 up to 2048 pairs and 70 against 65 at
4096 -> kernel_pairs 2048.

This module knows timings and the routing module's switches; nothing about models.
"""

from __future__ import annotations

import torch

EXPERTS = ((384, False), (48, True))          # (experts, with the sentinel)
TOKENS = (1, 8, 64, 128, 256, 512)            # top 8: 8 to 4096 pairs
INNER, REPEATS = 10, 50


def device_us(fn) -> float:
    """us of device time a call of fn: a graph of INNER calls, replayed REPEATS times, best of 3."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                      # warm-up off the capture: compiles, allocates
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(INNER):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end, best = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), float("inf")
    for _ in range(3):
        start.record()
        for _ in range(REPEATS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / (REPEATS * INNER))
    return best


WAYS = ("auto", "torch")     # bench gpu --routing: the pick, or the torch ops everywhere (an A/B's other arm)


def measure(device: str = "cuda", top_k: int = 8, block_m: int = 16, seed: int = 0, way: str = "auto") -> dict:
    """{"rows": [{experts, tokens, pairs, torch_us, kernel_us, equal}], "kernel_pairs", "way",
    "kernel_used_up_to"}; sets routing.KERNEL_PAIRS (and KERNEL) to the pick, or the kernel off
    where `way` is "torch" (both ways timed all the same). `equal`: the kernel's routing is the
    torch ops' (a row where it is not makes the pick 0)."""
    from diag.int4 import routing

    if way not in WAYS:
        raise ValueError(f"routing way {way!r}: expected one of {list(WAYS)}")

    gen = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for experts, sentinel in EXPERTS:
        for tokens in TOKENS:
            idx = torch.randint(0, experts + sentinel, (tokens, top_k), device=device, generator=gen)
            want, got = routing.torch_routes(idx, experts, (block_m,))[block_m], routing.kernel_route(idx, experts, block_m)
            rows.append({"experts": experts, "tokens": tokens, "pairs": tokens * top_k,
                         "torch_us": device_us(lambda: routing.torch_routes(idx, experts, (block_m,))),
                         "kernel_us": device_us(lambda: routing.kernel_route(idx, experts, block_m)),
                         "equal": torch.equal(want.sorted_ids, got.sorted_ids)
                         and torch.equal(want.block_expert, got.block_expert)})
    pick = kernel_pairs(rows)
    used = pick if way == "auto" else 0
    routing.KERNEL, routing.KERNEL_PAIRS = used > 0, used or routing.KERNEL_PAIRS
    return {"rows": rows, "kernel_pairs": pick, "block_m": block_m, "way": way, "kernel_used_up_to": used}


def kernel_pairs(rows: list[dict]) -> int:
    """The most pairs p such that the kernel won (and routed equally) at every row of <= p pairs;
    0 where it lost at the fewest. The module docstring's example."""
    pick = 0
    for pairs in sorted({r["pairs"] for r in rows}):
        at = [r for r in rows if r["pairs"] == pairs]
        if not all(r["equal"] and r["kernel_us"] < r["torch_us"] for r in at):
            break
        pick = pairs
    return pick
