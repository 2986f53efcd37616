"""Where the grouped INT4 kernel's time goes, by ablation (no hardware counters needed):
the DEQUANT 3 loop of fast_kernel.moe_int4_gemm_grouped timed whole and with one stage
replaced by a cheaper stand-in, on Kimi's widths with random packed weights and uniform
top-8 routing. Differences between the variants place the time. Numbers are wrong in
the ablated variants by design; only their clocks are read.

  0  the kernel as shipped (DEQUANT 3, bf16x2)
  1  no dequantization: the words' low halves bitcast to bf16 (one op instead of four)
  2  no activation loads: the first K step's activation tiles reused for every K step
  3  no weight loads: the first K step's words reused
  4  no MMA: the weights and activations summed into the accumulator's first row/column
  and 0 again with the K loop under Triton's warp_specialize (Triton >= 3.4)

Usage (CUDA): python scripts/ablate_int4.py [tokens ...]   ($OUT set: ablate.json there)
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

from diag.int4 import fast
from diag.int4.fast_kernel import _block_rows, _dequant_pair


@triton.jit
def ablated(a_ptr, w_ptr, s_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, N, K, num_pairs, a_div,
            stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_sg, stride_om,
            GROUP: tl.constexpr, PIECE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
            ABLATE: tl.constexpr, WS: tl.constexpr = False):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pair, row_ok, a_row = _block_rows(sorted_ids_ptr, pid_m, num_pairs, a_div, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_p = tl.arange(0, PIECE)
    a_base = a_ptr + a_row[None, :].to(tl.int64) * stride_am + offs_p[:, None]
    w_base = (w_ptr + expert.to(tl.int64) * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
              + offs_p[None, :])
    s_base = s_ptr + expert.to(tl.int64) * stride_se + offs_n.to(tl.int64) * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in tl.range(0, K, 8 * PIECE, warp_specialize=WS):
        kw = 0 if ABLATE == 3 else k0
        words = tl.load(w_base + kw // 8, mask=n_ok[:, None], other=0)
        for i in tl.static_range(4):
            ka = 0 if ABLATE == 2 else k0
            lo, hi = ka + i * PIECE, ka + (i + 4) * PIECE
            a_lo = tl.load(a_base + lo, mask=row_ok[None, :], other=0.0)
            a_hi = tl.load(a_base + hi, mask=row_ok[None, :], other=0.0)
            s_lo = tl.load(s_base + ((k0 + i * PIECE) // GROUP) * stride_sg, mask=n_ok, other=0.0)
            s_hi = tl.load(s_base + ((k0 + (i + 4) * PIECE) // GROUP) * stride_sg, mask=n_ok, other=0.0)
            if ABLATE == 1:
                w_lo = (words >> (4 * i)).to(tl.int16).to(tl.bfloat16, bitcast=True)
                w_hi = (words >> (4 * i + 16)).to(tl.int16).to(tl.bfloat16, bitcast=True)
            else:
                w_lo, w_hi = _dequant_pair(words, 4 * i, s_lo, s_hi)
            if ABLATE == 4:
                acc += (tl.sum(w_lo.to(tl.float32) + w_hi.to(tl.float32), 1)[:, None]
                        + tl.sum(a_lo.to(tl.float32) + a_hi.to(tl.float32), 0)[None, :])
            else:
                acc = tl.dot(w_lo, a_lo, acc)
                acc = tl.dot(w_hi, a_hi, acc)
    out_ptrs = out_ptr + pair[None, :].to(tl.int64) * stride_om + offs_n[:, None]
    tl.store(out_ptrs, acc.to(tl.bfloat16), mask=n_ok[:, None] & row_ok[None, :])


def main(tokens_list):
    dev = torch.device("cuda")
    E, H, I, K, G, P = 384, 7168, 2048, 8, 32, 32
    gen = torch.Generator(device=dev).manual_seed(0)
    res = {}
    shapes = {"gate_up": (2 * I, H, K), "down": (H, I, 1)}
    for tokens in tokens_list:
        idx = torch.stack([torch.randperm(E, device=dev, generator=gen)[:K] for _ in range(tokens)])
        S = tokens * K
        for which, (N, Kd, a_div) in shapes.items():
            t = fast.GROUPED[which]
            bm = fast.grouped_block_m(S, E, which)
            r = fast.route(idx, E, bm)
            words = torch.randint(-2 ** 31, 2 ** 31 - 1, (E, N, Kd // 8), device=dev, dtype=torch.int32, generator=gen)
            scale = fast.scales_group_major((torch.rand(E, N, Kd // G, device=dev, generator=gen) * 0.01).to(torch.bfloat16))
            a = torch.randn(tokens if a_div == K else S, Kd, device=dev, generator=gen).to(torch.bfloat16)
            out = torch.empty(S, N, device=dev, dtype=torch.bfloat16)
            grid = (triton.cdiv(N, t["block_n"]), r.block_expert.numel())
            flops = 2 * S * N * Kd
            for ablate, ws in ((0, False), (1, False), (2, False), (3, False), (4, False), (0, True)):
                fn = lambda: ablated[grid](a, words, scale, out, r.sorted_ids, r.block_expert, N, Kd, S, a_div,  # noqa: E731
                                           a.stride(0), words.stride(0), words.stride(1), scale.stride(0),
                                           scale.stride(1), scale.stride(2), out.stride(0), GROUP=G, PIECE=P,
                                           BLOCK_N=t["block_n"], BLOCK_M=bm, ABLATE=ablate, WS=ws,
                                           num_warps=t["num_warps"], num_stages=t["num_stages"])
                ms = triton.testing.do_bench(fn, warmup=5, rep=40)
                key = f"{tokens}/{which}/ablate{ablate}" + ("/warp_specialize" if ws else "")
                res[key] = {"ms": ms, "tflops": flops / ms / 1e9, "block_m": bm}
                print(f"{key:36s} {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s  block_m {bm}", flush=True)
            del words, scale, a, out
    return res


if __name__ == "__main__":
    import os
    out = main([int(t) for t in sys.argv[1:]] or [8192, 32768])
    if os.environ.get("OUT"):
        json.dump(out, open(os.path.join(os.environ["OUT"], "ablate.json"), "w"), indent=1)
