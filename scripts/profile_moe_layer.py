"""Where one Kimi-shaped MoE layer's time goes in diag.int4.fast.fused_experts, kernel by kernel
(torch.profiler's CUDA activity): the two INT4 GEMMs, the activation pass, the routing and the
final sum over each token's slots. Random packed weights and uniform top-8 routing at Kimi's
widths (384 experts, hidden 7168, expert width 2048, group 32); the defaults of fast.GROUPED.

Usage (CUDA): python scripts/profile_moe_layer.py [tokens ...]   ($OUT set: profile.json there)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile
from transformers.activations import ACT2FN

from diag.int4 import fast
from diag.int4.packed import PackedExperts

E, H, I, K, G = 384, 7168, 2048, 8, 32


def _experts(dev) -> PackedExperts:
    gen = torch.Generator(device=dev).manual_seed(0)
    m = PackedExperts(E, H, I, G, ACT2FN["silu"], device=dev)
    for name in ("gate_up_proj", "down_proj"):
        packed = getattr(m, f"{name}_packed")
        packed.copy_(torch.randint(-2 ** 31, 2 ** 31 - 1, packed.shape, device=dev, dtype=torch.int32, generator=gen))
        scale = getattr(m, f"{name}_scale")
        scale.copy_((torch.rand(scale.shape, device=dev, generator=gen) * 0.01).to(scale.dtype))
    return m


def _kind(name: str) -> str:
    for key, kind in (("moe_int4_gemm_split", "int4 gemm (split)"), ("moe_int4_gemm_grouped", "int4 gemm (one block)"),
                      ("glu_rows", "activation pass"), ("sort", "routing (sort)"), ("reduce", "sum over slots"),
                      ("elementwise", "elementwise / casts"), ("copy", "copies"), ("scatter", "routing (scatter)"),
                      ("index", "routing (index)"), ("cumsum", "routing (scan)"), ("scan", "routing (scan)")):
        if key in name.lower():
            return kind
    return "other"


def main(tokens_list):
    dev = torch.device("cuda")
    m = _experts(dev)
    fast.to_kernel_layout(m)
    res = {"tiles": fast.GROUPED, "rows": []}
    for tokens in tokens_list:
        gen = torch.Generator(device=dev).manual_seed(tokens)
        x = torch.randn(tokens, H, device=dev, generator=gen).to(torch.bfloat16)
        idx = torch.rand(tokens, E, device=dev, generator=gen).topk(K, dim=-1).indices
        w = torch.softmax(torch.randn(tokens, K, device=dev, generator=gen), -1)
        for _ in range(3):
            fast.fused_experts(m, x, idx, w)
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fast.fused_experts(m, x, idx, w)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        reps = 5
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(reps):
                fast.fused_experts(m, x, idx, w)
            torch.cuda.synchronize()
        kernels, kinds = defaultdict(float), defaultdict(float)
        for ev in p.key_averages():
            us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if us and ev.key and not ev.key.startswith("ProfilerStep"):
                kernels[ev.key] += us / reps / 1000
        for name, ms in kernels.items():
            kinds[_kind(name)] += ms
        row = {"tokens": tokens, "layer_ms_median": statistics.median(times),
               "kernel_ms_sum": sum(kernels.values()),
               "by_kind_ms": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
               "kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:15])}
        res["rows"].append(row)
        print(json.dumps(row, indent=1), flush=True)
    return res


if __name__ == "__main__":
    out = main([int(t) for t in sys.argv[1:]] or [8192, 32768])
    if os.environ.get("OUT"):
        json.dump(out, open(os.path.join(os.environ["OUT"], "profile.json"), "w"), indent=1)
