"""The grouped INT4 GEMMs at Kimi's widths, Triton's pipeline against wgmma_kernel's, one GEMM
at a time, with the outputs compared bit for bit (same routing, same inputs). Random packed
weights, uniform top-8 routing (384 experts, hidden 7168, expert width 2048, group 32).

Usage (CUDA, sm_90): python scripts/ab_wgmma.py [--layer] [tokens ...]   ($OUT set: ab_wgmma.json there)
  --layer: the whole layer (fast.fused_experts, routing replayed) at the shipped tiles, on
           wgmma_kernel and on the Triton kernels of the same tiles, and at the previous
           all-Triton tiles (gate_up one 64-row block, down 3 x 64)
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch

from diag.int4 import fast
from profile_moe_layer import E, H, I, K, _experts  # noqa: E402  (run as a script: scripts/ is on the path)

# (name, GEMM, tile): Triton's shipped tiles first, then wgmma variants
VARIANTS = [
    ("triton", "gate_up", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "glu": False}),
    ("wgmma drain st2", "gate_up", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "wgmma": True, "drain": True}),
    ("wgmma lag st3", "gate_up", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 3, "wgmma": True, "drain": False}),
    ("wgmma drain st3", "gate_up", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 3, "wgmma": True, "drain": True}),
    ("wgmma split2 drain st2", "gate_up", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "split": 2, "wgmma": True, "drain": True}),
    ("wgmma split3 drain st2", "gate_up", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "split": 3, "wgmma": True, "drain": True}),
    ("wgmma bm128 drain st2", "gate_up", {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 2, "wgmma": True, "drain": True}),
    ("triton", "down", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "split": 3}),
    ("wgmma split3 drain st2", "down", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "split": 3, "wgmma": True, "drain": True}),
    ("wgmma drain st2", "down", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "wgmma": True, "drain": True}),
    ("wgmma lag st3", "down", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 3, "wgmma": True, "drain": False}),
    ("wgmma split2 drain st2", "down", {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "split": 2, "wgmma": True, "drain": True}),
    ("wgmma bm128 drain st2", "down", {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 2, "wgmma": True, "drain": True}),
]


def _events(fn, repeat=10):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


PREVIOUS = {"gate_up": {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "glu": False},
            "down": {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "split": 3}}


def layer(tokens_list):
    dev = torch.device("cuda")
    m = _experts(dev)
    fast.to_kernel_layout(m)
    shipped = copy.deepcopy(fast.GROUPED)
    triton_tiles = {k: {**v, "wgmma": False} for k, v in shipped.items() if isinstance(v, dict)}
    rows = []
    for tokens in tokens_list:
        gen = torch.Generator(device=dev).manual_seed(tokens)
        x = torch.randn(tokens, H, device=dev, generator=gen).to(torch.bfloat16)
        idx = torch.rand(tokens, E, device=dev, generator=gen).topk(K, dim=-1).indices
        w = torch.softmax(torch.randn(tokens, K, device=dev, generator=gen), -1)
        outs = {}
        for name, tiles in (("shipped (wgmma)", {}), ("shipped tiles on triton", triton_tiles), ("previous", PREVIOUS)):
            fast.GROUPED.update(copy.deepcopy(tiles))
            outs[name] = fast.fused_experts(m, x, idx, w)
            ms = _events(lambda: fast.fused_experts(m, x, idx, w), repeat=20) * 1e3
            row = {"tokens": tokens, "name": name, "ms": round(ms, 3),
                   "bit_equal_to_shipped": bool(torch.equal(outs[name], outs["shipped (wgmma)"]))}
            print(row, flush=True)
            rows.append(row)
            fast.GROUPED.clear()
            fast.GROUPED.update(copy.deepcopy(shipped))
    return rows


def main(tokens_list):
    dev = torch.device("cuda")
    m = _experts(dev)
    fast.to_kernel_layout(m)
    saved = copy.deepcopy(fast.GROUPED)
    rows = []
    for tokens in tokens_list:
        gen = torch.Generator(device=dev).manual_seed(tokens)
        x = torch.randn(tokens, H, device=dev, generator=gen).to(torch.bfloat16)
        idx = torch.rand(tokens, E, device=dev, generator=gen).topk(K, dim=-1).indices
        h = torch.randn(tokens * K, I, device=dev, generator=gen).to(torch.bfloat16)
        w = torch.rand(tokens * K, device=dev, generator=gen)
        ref = {}
        for name, which, tile in VARIANTS:
            fast.GROUPED[which] = dict(tile)
            rows_per_block = fast.block_rows(which)
            r = fast.route(idx, E, rows_per_block)
            if which == "gate_up":
                fn = lambda: fast.grouped_int4_gemm(x, m.gate_up_proj_packed, m.gate_up_proj_scale, r, 32,  # noqa: E731
                                                    "gate_up", a_div=K, piece=m.kernel_layout)
            else:
                fn = lambda: fast.grouped_int4_gemm(h, m.down_proj_packed, m.down_proj_scale, r, 32, "down",  # noqa: E731
                                                    a_div=1, route_w=w, piece=m.kernel_layout)
            row = {"tokens": tokens, "gemm": which, "name": name, **tile}
            try:
                out = fn()
                torch.cuda.synchronize()
                if name == "triton":
                    ref[which] = out
                else:
                    row["bit_equal"] = bool(torch.equal(out, ref[which]))
                    row["max_abs_diff"] = float((out.float() - ref[which].float()).abs().max())
                row["ms"] = round(_events(fn) * 1e3, 3)
                flops = 2 * tokens * K * (H * 2 * I if which == "gate_up" else I * H)
                row["tflops"] = round(flops / (row["ms"] / 1e3) / 1e12, 1)
            except Exception as err:  # a variant that does not compile or run is data
                row["error"] = repr(err)[-800:]
            print(row, flush=True)
            rows.append(row)
            fast.GROUPED.clear()
            fast.GROUPED.update(copy.deepcopy(saved))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "ab_wgmma.json"), "w") as f:
            json.dump({"rows": rows, "device": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--layer":
        rows = layer([int(t) for t in args[1:]] or [48, 512, 2048, 8192])
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "ab_wgmma_layer.json"), "w") as f:
                json.dump({"rows": rows, "device": torch.cuda.get_device_name()}, f, indent=1)
    else:
        main([int(t) for t in args] or [8192])
