"""Choosing the grouped INT4 kernel's tiles on the GPU at hand, and proving each dequant
variant bit for bit at Kimi's widths.

  tiles     CONFIGS (piece width, block_m, block_n, warps, stages, wide, split), each GEMM timed alone
            (the piece and the dequant variant are shared by both GEMMs: the weights' layout;
            block_m is each GEMM's own: each is routed for its tile); the best tile of each
            GEMM per (piece, dequant), then the best pair of those, go into fast.GROUPED
            (an H200 run chose DEQUANT 2 over 0 and 1 at every tile tried; NOTES.md)
  exact     A = identity rows routed to one expert: out^T is the dequantized weight, which
            must equal format.dequantize's bf16 bits, for every DEQUANT variant
  blocks    the device time a row block of each small size costs (block_costs), which
            grouped_block_m weighs against the blocks each size launches, under the tile
            variant per size that runs it fastest (fast.tile_of's "by_rows")
Stops trying after `budget_s` (every compile costs seconds); what was tried is returned.
This module knows the kernel's knobs and clocks; nothing about files.
"""

from __future__ import annotations

import copy
import time

import torch

from diag.bench.common import timed

# (piece, block_m, block_n, num_warps, num_stages, wide), each tried for both GEMMs. Shared
# memory is about stages * block_m * 8P * 2 + (stages - 1) * block_n * P * 4 bytes (232448 on
# an H200): P 32 with block_m 256 never fits; P 16 with block_m 256 fits at 3 stages. wide:
# one dot of depth 8P per K step (fast_kernel's WIDE). Ordered so that the budget cuts the
# least promising last: the wide rows and block_m 256 (never timed before this list) first.
CONFIGS = ((16, 128, 128, 8, 3, True, 1), (16, 128, 256, 8, 3, True, 1), (16, 128, 64, 4, 3, True, 1),
           (16, 256, 128, 8, 3, True, 1), (16, 256, 128, 8, 2, False, 1), (16, 256, 128, 8, 3, False, 1),
           (16, 256, 64, 4, 3, False, 1), (16, 256, 256, 8, 2, False, 1), (16, 128, 128, 8, 3, False, 1),
           (16, 128, 256, 8, 3, False, 1), (16, 128, 128, 8, 4, False, 1), (16, 64, 128, 8, 3, False, 1),
           (16, 64, 128, 4, 4, True, 1),
           (32, 64, 128, 8, 3, True, 1), (32, 64, 256, 8, 3, True, 1), (32, 128, 128, 8, 3, True, 1),
           (32, 128, 128, 8, 2, True, 1), (32, 64, 128, 8, 2, False, 1), (32, 64, 256, 8, 3, False, 1),
           (32, 128, 128, 8, 3, False, 1))
# DEQUANT 3 (bf16x2, two weights per instruction) on the narrow rows that led before, tried
# first: its rows are new, and on a GPU without it (interpreter, < sm_80) they time variant 2.
DEQUANT3 = ((32, 64, 128, 8, 2, False, 1), (32, 64, 128, 8, 3, False, 1), (32, 64, 256, 8, 3, False, 1),
            (32, 128, 128, 8, 3, False, 1), (32, 128, 256, 8, 3, False, 1), (16, 128, 128, 8, 3, False, 1),
            (16, 256, 128, 8, 3, False, 1), (32, 64, 64, 4, 3, False, 1),
            # each GEMM's block_m its own (routing per GEMM): down's short K at larger token tiles
            (32, 128, 64, 4, 3, False, 1), (32, 128, 128, 4, 3, False, 1), (32, 32, 128, 8, 3, False, 1),
            (32, 64, 128, 4, 3, False, 1))
# Row blocks of several sub-blocks (fast_kernel's SPLIT) that share each decoded weight tile:
# 3 x 64 rows pad Kimi's 171 pairs per expert at 8k tokens to 192 and decode once, where 64
# decodes three times and 128 / 256 pad to 256. Shared memory per stage is about
# split * block_m * 8P * 2 + block_n * P * 4 bytes, so piece 32 fits 2 stages, piece 16 3.
SPLITS = ((32, 64, 128, 8, 2, False, 3), (16, 64, 128, 8, 3, False, 3), (32, 64, 128, 8, 2, False, 2),
          (16, 64, 128, 8, 3, False, 4), (32, 32, 128, 8, 3, False, 4), (16, 64, 128, 8, 2, False, 3))
# wgmma_kernel's explicit Hopper pipeline (a last field: "wgmma" empties the MMA queue at every
# K step, "wgmma-lag" keeps the last piece in flight into the next and prefetches one step less,
# so needs 3 stages); tried first, at DEQUANT 3 (its decode). Where it cannot run (not sm_90)
# the rows time the Triton kernel of the same tile. Shared memory as SPLITS'. An H200 A/B
# (NOTES.md, scripts/ab_wgmma.py) had split 3 at 2 stages fastest for both GEMMs at 8k tokens.
WGMMA = ((32, 64, 128, 8, 2, False, 3, "wgmma"), (32, 64, 128, 8, 2, False, 1, "wgmma"),
         (16, 64, 128, 8, 3, False, 3, "wgmma-lag"), (16, 64, 128, 8, 4, False, 3, "wgmma-lag"),
         (16, 64, 128, 8, 2, False, 3, "wgmma"), (16, 64, 128, 8, 3, False, 3, "wgmma"),
         (32, 64, 128, 8, 2, False, 2, "wgmma"), (32, 128, 128, 8, 2, False, 1, "wgmma"))

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
                           experts.num_experts, fast.block_rows(which))
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
    """The two GEMMs of one MoE layer at one token count, routed for a given block_m; gate_up
    with the activation in its epilogue where fused_experts puts it there."""

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
        self.r = fast.route(self.idx, self.experts.num_experts, block_m)

    def time(self, which: str, glu: bool = False) -> float:
        """One GEMM's seconds; gate_up with the activation either in its epilogue (glu) or
        as fused_experts applies it after an unfused product, so the two compare fairly."""
        from diag.int4 import fast
        e, g = self.experts, self.experts.group_size
        if which == "gate_up":
            def fn():
                out = fast.grouped_int4_gemm(self.x, e.gate_up_proj_packed, e.gate_up_proj_scale, self.r, g,
                                             "gate_up", a_div=self.idx.shape[1], piece=e.kernel_layout, glu=glu)
                return out if glu else fast.activate(e, out)
        else:
            fn = lambda: fast.grouped_int4_gemm(self.h, e.down_proj_packed, e.down_proj_scale,  # noqa: E731
                                                self.r, g, "down", a_div=1, route_w=self.route_w,
                                                piece=e.kernel_layout)
        return timed(fn, repeat=5, warmup=1)


def _tile(cand: tuple) -> dict:
    """(block_m, block_n, num_warps, num_stages, wide, split, pipe[, glu]) -> one GEMM's entry
    of fast.GROUPED (pipe: "" for the Triton kernel, "wgmma" / "wgmma-lag" for wgmma_kernel
    with and without the drain; glu: gate_up's, whether the activation is in its epilogue;
    split only where it is not 1)."""
    bm, bn, warps, stages, wide, split, pipe, *glu = cand
    return {"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages, "wide": wide,
            **({"split": split} if split != 1 else {}), **({"glu": glu[0]} if glu else {}),
            **({"wgmma": True, "drain": pipe == "wgmma"} if pipe else {})}


def _set_tile(which: str, cand: tuple) -> None:
    """fast.GROUPED[which] = the candidate's tile, its row sizes' own tiles (by_rows) kept."""
    from diag.int4 import fast
    by = fast.GROUPED[which].get("by_rows")
    fast.GROUPED[which] = {**_tile(cand), **({"by_rows": by} if by is not None else {})}


def _try(g: _Gemms, which: str, cand: tuple, rows: list, tag: dict) -> float:
    _set_tile(which, cand)
    row = {**tag, "gemm": which, **_tile(cand)}
    try:
        row["seconds"] = g.time(which, glu=row.get("glu", False))
    except Exception as err:  # e.g. a tile that needs more shared memory than the GPU has
        row.update(seconds=float("inf"), error=repr(err)[:300])
    rows.append(row)
    return row["seconds"]


def _gemm_tiles(cand: tuple, fusable: bool) -> list[tuple[str, tuple]]:
    """The (GEMM, tile) pairs one config is timed as: gate_up with the activation in its
    epilogue and after it, where the activation can be fused (wgmma_kernel has no such
    epilogue: after it only); down once.
    (64, 128, 8, 2, False, 1, ""), fusable -> gate_up (..., True), gate_up (..., False), down (...)."""
    if not fusable:
        ups = [cand]
    elif cand[6]:                                       # pipe: wgmma_kernel
        ups = [cand + (False,)]
    else:
        ups = [cand + (True,), cand + (False,)]
    return [("gate_up", t) for t in ups] + [("down", cand)]


@torch.no_grad()
def tune_grouped(moe, tokens: int = 8192, *, budget_s: float = 120.0, configs=CONFIGS,
                 dequant: int = 2, dequant3=WGMMA + SPLITS + DEQUANT3, log=print) -> dict:
    """Each config's two GEMMs timed alone at `tokens` (the weights re-laid per piece width),
    `configs` at `dequant`, `dequant3` at DEQUANT 3; the fastest (piece, dequant) by the sum
    of its best tile per GEMM (each GEMM's block_m its own) chosen into fast.GROUPED, then
    every DEQUANT variant proven bit-exact at the chosen layout."""
    from diag.int4 import fast

    t0 = time.perf_counter()
    g = _Gemms(moe, tokens)
    rows: list[dict] = []
    best: dict = {}
    tried = [(*c[:7], c[7] if len(c) > 7 else "", 3) for c in dequant3] + [(*c, "", dequant) for c in configs]
    for piece in dict.fromkeys(c[0] for c in tried):
        fast.to_kernel_layout(moe.experts, piece)
        for _, *cand, dq in (c for c in tried if c[0] == piece):
            if time.perf_counter() - t0 > budget_s:
                break
            g.route(cand[0] * cand[5])                   # block_m x split rows per block
            fast.GROUPED["dequant"] = dq
            for which, tile in _gemm_tiles(tuple(cand), fast.fuses_activation(moe.experts)):
                s = _try(g, which, tile, rows, {"dequant": dq, "piece": piece})
                if s < best.get((piece, dq, which), (float("inf"),))[0]:
                    best[(piece, dq, which)] = (s, tile)
        log(f"[bench] tiles piece {piece}: {[(k, v) for k, v in best.items() if k[0] == piece]}")
    out = {"rows": rows, **_choose(best, moe.experts, tokens)}
    out["dequant_bit_exact"] = {d: dequant_exact(moe.experts, d) for d in (0, 1, 2, 3)}
    return out


def _choose(best: dict, experts, tokens: int) -> dict:
    from diag.int4 import fast
    full = {(p, dq): best[(p, dq, "gate_up")][0] + best[(p, dq, "down")][0]
            for (p, dq, w) in best if w == "gate_up" and (p, dq, "down") in best}
    if not full:
        return {"tokens": tokens, "chosen": copy.deepcopy(fast.GROUPED), "error": "no tile ran"}
    piece, dq = min(full, key=full.get)
    fast.to_kernel_layout(experts, piece)
    fast.GROUPED.update(piece=piece, dequant=dq)
    for which in ("gate_up", "down"):
        _set_tile(which, best[(piece, dq, which)][1])
    return {"tokens": tokens, "chosen": copy.deepcopy(fast.GROUPED), "gemm_seconds": full[(piece, dq)],
            "by_piece_and_dequant": {f"piece{p}_dequant{d}": v for (p, d), v in full.items()}}


BLOCK_COST_ROWS = (16, 32, 64, 128)
# The tile variants block_costs times at each row size (fast.tile_of's "by_rows"): the GEMM's own
# tile, then wider weight slabs, which re-read each block's activations half as often. An H200 at
# 3072 tokens (NOTES.md, twenty-seventh stop): 64 rows 9.20 / 8.79 / 9.16 ms, 128 rows 12.78 /
# 10.57 / 10.37; 16 and 32 rows lost with either (4.09 -> 4.93 ms at 192 tokens).
BLOCK_VARIANTS = ({}, {"block_n": 256}, {"block_n": 256, "num_warps": 16})


@torch.no_grad()
def block_costs(experts, rows=BLOCK_COST_ROWS, *, top_k: int = 8, seed: int = 5, repeat: int = 5,
                variants=BLOCK_VARIANTS) -> dict:
    """fast.GROUPED["block_costs"] measured on the device at hand (set there, and returned with
    what each came from): for each row block r below the full block, the layer's experts
    (fused_experts, both GEMMs routed for r rows) at the token count that gives each expert r / 2
    pairs on average under uniform top-k routing, so that hardly any expert overflows its block,
    timed under each of `variants` (both GEMMs' tile for r rows, fast.tile_of), the fastest kept
    into each GEMM's "by_rows" (none where the GEMM's own tile wins; a variant that does not
    compile or run is recorded with its error), its time divided by the row blocks launched (each
    expert's ceil(pairs / r)): us a block. Kimi's 384 experts, top 8: 16 rows at 384 tokens, 32
    at 768, 64 at 1536, 128 at 3072. On the H200 these were 11.1, 12.9, 16.5 and 32.9 us with
    the GEMMs' own tile (int4/blocks.BLOCK_COSTS)."""
    from diag.int4 import fast

    dev = experts.gate_up_proj_packed.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    E, full = experts.num_experts, min(fast.block_rows(w) for w in ("gate_up", "down"))
    out, costs, chosen = [], {}, {}
    for w in ("gate_up", "down"):
        fast.GROUPED[w]["by_rows"] = {}                 # each size timed from the GEMM's own tile
    for r in (r for r in rows if r < full):
        tokens = max(1, r * E // (2 * top_k))
        x = torch.randn(tokens, experts.hidden_dim, device=dev, generator=gen, dtype=torch.bfloat16)
        idx = torch.rand(tokens, E, device=dev, generator=gen).topk(min(top_k, E), dim=-1).indices
        w = torch.rand(idx.shape, device=dev, generator=gen, dtype=torch.bfloat16)
        blocks = int((-(-torch.bincount(idx.reshape(-1), minlength=E) // r)).sum())
        tried = [_time_variant(lambda: fast.fused_experts(experts, x, idx, w, rows=r), r, v, repeat)
                 for v in variants]
        best = min(tried, key=lambda t: t["seconds"])
        _set_by_rows(r, best["variant"])
        if best["variant"]:
            chosen[r] = best["variant"]
        s = best["seconds"]
        costs[r] = s / blocks * 1e6
        out.append({"rows": r, "tokens": tokens, "blocks": blocks, "seconds": s, "us_per_block": costs[r],
                    "variant": best["variant"], "tried": tried})
    if costs:
        fast.GROUPED["block_costs"] = costs
    return {"costs_us": costs, "by_rows": chosen, "rows": out}


def _time_variant(fn, rows: int, variant: dict, repeat: int) -> dict:
    """fn's seconds with both GEMMs' row blocks of `rows` on `variant`; inf and the error's text
    where it does not compile or run (e.g. a tile wider than this GPU's shared memory)."""
    _set_by_rows(rows, variant)
    try:
        return {"variant": dict(variant), "seconds": timed(fn, repeat=repeat, warmup=1)}
    except Exception as err:  # a variant this GPU cannot run is data, not a crash
        return {"variant": dict(variant), "seconds": float("inf"), "error": repr(err)[:300]}


def _set_by_rows(rows: int, variant: dict) -> None:
    """Both GEMMs' tile variant for row blocks of `rows` ({}: their own tile)."""
    from diag.int4 import fast
    for w in ("gate_up", "down"):
        by = dict(fast.GROUPED[w].get("by_rows") or {})
        by.pop(rows, None)
        if variant:
            by[rows] = dict(variant)
        fast.GROUPED[w]["by_rows"] = by
