"""Choosing the grouped INT4 kernel's tiles on the GPU at hand, and proving each dequant
variant bit for bit at Kimi's widths.

  exact     A = identity rows routed to one expert: out^T is the dequantized weight, which
            must equal format.dequantize's bf16 bits, for every DEQUANT variant
  stage 1   piece widths 16 and 32 (the weights re-laid for each) x the three DEQUANT
            variants at the default tiles, each GEMM timed alone
  stage 2   with the fastest exact pair, block_m in (64, 128, 256) x (block_n, warps, stages)
            candidates, each GEMM timed alone (block_m is shared: it is the routing's);
            the fastest pair per block_m, then the fastest block_m, go into fast.GROUPED
Stops trying after `budget_s` (every compile costs seconds); what was tried is returned.
This module knows the kernel's knobs and clocks; nothing about files.
"""

from __future__ import annotations

import copy
import time

import torch

from diag.bench.common import timed

CANDIDATES = ((128, 8, 3), (128, 4, 3), (64, 4, 3), (256, 8, 3), (128, 8, 4), (128, 8, 2), (64, 4, 4))


@torch.no_grad()
def dequant_exact(experts, dequant: int) -> bool | str:
    """Both projections of expert 0 through the kernel with A = I, against expert_weight;
    the error's text when the variant does not compile or run."""
    try:
        return _dequant_exact(experts, dequant)
    except Exception as err:  # a variant this Triton cannot build is data, not a crash
        return repr(err)[-600:]


def _dequant_exact(experts, dequant: int) -> bool:
    from diag.int4 import fast

    saved = copy.deepcopy(fast.GROUPED)
    fast.GROUPED["dequant"] = dequant
    try:
        dev = experts.down_proj_packed.device
        ok = True
        for proj, which in (("down_proj", "down"), ("gate_up_proj", "gate_up")):
            want = experts.expert_weight(proj, 0, torch.bfloat16)                 # [N, K]
            eye = torch.eye(want.shape[1], device=dev, dtype=torch.bfloat16)
            r = fast.route(torch.zeros(want.shape[1], 1, dtype=torch.long, device=dev),
                           experts.num_experts, fast.GROUPED["block_m"])
            got = fast.grouped_int4_gemm(eye, getattr(experts, f"{proj}_packed"),
                                         getattr(experts, f"{proj}_scale"), r, experts.group_size,
                                         which, a_div=1, piece=experts.kernel_layout)
            ok = ok and torch.equal(got.T, want)
            del eye, got
        return ok
    finally:
        fast.GROUPED.clear()
        fast.GROUPED.update(saved)


class _Gemms:
    """The two GEMMs of one MoE layer at one token count, routed for a given block_m."""

    def __init__(self, moe, tokens: int, seed: int = 3):
        from diag.bench.target import routed_inputs
        self.experts = moe.experts
        self.x, self.idx, self.w = routed_inputs(moe, tokens, seed=seed)
        self.S = self.idx.numel()
        inter = self.experts.intermediate_dim
        self.h = torch.randn(self.S, inter, device=self.x.device, dtype=torch.bfloat16)
        self.route_w = self.w.reshape(-1).float().contiguous()
        self.r = None

    def route(self, block_m: int):
        from diag.int4 import fast
        fast.GROUPED["block_m"] = block_m
        self.r = fast.route(self.idx, self.experts.num_experts, block_m)

    def time(self, which: str) -> float:
        from diag.int4 import fast
        e, g = self.experts, self.experts.group_size
        if which == "gate_up":
            fn = lambda: fast.grouped_int4_gemm(self.x, e.gate_up_proj_packed, e.gate_up_proj_scale,  # noqa: E731
                                                self.r, g, "gate_up", a_div=self.idx.shape[1],
                                                piece=e.kernel_layout)
        else:
            fn = lambda: fast.grouped_int4_gemm(self.h, e.down_proj_packed, e.down_proj_scale,  # noqa: E731
                                                self.r, g, "down", a_div=1, route_w=self.route_w,
                                                piece=e.kernel_layout)
        return timed(fn, repeat=5, warmup=1)


def _try(g: _Gemms, which: str, cand: tuple, rows: list, tag: dict) -> float:
    from diag.int4 import fast
    bn, warps, stages = cand
    fast.GROUPED[which] = {"block_n": bn, "num_warps": warps, "num_stages": stages}
    row = {**tag, "gemm": which, "block_n": bn, "num_warps": warps, "num_stages": stages}
    try:
        row["seconds"] = g.time(which)
    except Exception as err:  # e.g. a tile that needs more shared memory than the GPU has
        row.update(seconds=float("inf"), error=repr(err)[:300])
    rows.append(row)
    return row["seconds"]


@torch.no_grad()
def tune_grouped(moe, tokens: int = 8192, *, budget_s: float = 120.0, log=print) -> dict:
    from diag.int4 import fast

    t0 = time.perf_counter()
    g = _Gemms(moe, tokens)
    rows: list[dict] = []
    exact, stage1 = {}, {}
    g.route(128)
    for piece in (16, 32):
        fast.to_kernel_layout(moe.experts, piece)
        for d in (0, 1, 2):
            fast.GROUPED["dequant"] = d
            tag = {"block_m": 128, "dequant": d, "piece": piece}
            stage1[(piece, d)] = sum(_try(g, w, CANDIDATES[0], rows, tag) for w in ("gate_up", "down"))
            exact[f"piece{piece}_dequant{d}"] = dequant_exact(moe.experts, d)
    ok = [k for k in stage1 if exact[f"piece{k[0]}_dequant{k[1]}"] is True]
    piece, best_d = min(ok, key=lambda k: stage1[k]) if ok else (16, 1)
    fast.to_kernel_layout(moe.experts, piece)
    fast.GROUPED.update(piece=piece, dequant=best_d)
    log(f"[bench] tiles stage 1: {stage1}, exact {exact} -> piece {piece}, dequant {best_d}")
    best: dict = {}
    for bm in (128, 64, 256):
        g.route(bm)
        for which in ("gate_up", "down"):
            for cand in CANDIDATES:
                if time.perf_counter() - t0 > budget_s:
                    break
                s = _try(g, which, cand, rows, {"block_m": bm, "dequant": best_d, "piece": piece})
                key = (bm, which)
                if s < best.get(key, (float("inf"),))[0]:
                    best[key] = (s, cand)
        log(f"[bench] tiles block_m={bm}: {[(k, v) for k, v in best.items() if k[0] == bm]}")
    out = {"dequant_bit_exact": exact, "rows": rows, **_choose(best, best_d, tokens)}
    out["chosen_bit_exact"] = dequant_exact(moe.experts, best_d)
    return out


def _choose(best: dict, dequant: int, tokens: int) -> dict:
    from diag.int4 import fast
    full = {bm: best[(bm, "gate_up")][0] + best[(bm, "down")][0] for bm in (64, 128, 256)
            if (bm, "gate_up") in best and (bm, "down") in best}
    if not full:
        return {"tokens": tokens, "chosen": copy.deepcopy(fast.GROUPED), "error": "no tile ran"}
    bm = min(full, key=full.get)
    fast.GROUPED["block_m"], fast.GROUPED["dequant"] = bm, dequant
    for which in ("gate_up", "down"):
        bn, warps, stages = best[(bm, which)][1]
        fast.GROUPED[which] = {"block_n": bn, "num_warps": warps, "num_stages": stages}
    return {"tokens": tokens, "chosen": copy.deepcopy(fast.GROUPED), "gemm_seconds": full[bm]}
