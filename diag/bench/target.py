"""Target-side benchmarks: one MoE layer's experts three ways (diag's eager packed loop,
the fused INT4 kernel of diag.int4.fast, transformers' bf16 grouped_mm on the same
weights dequantized), and whole teacher-forced capture passes with their peak memory.

FLOPs of routed experts for T tokens, top-K, expert width I, hidden H:
  2 * T * K * (2I * H + I * H) = 6 * T * K * I * H
  Kimi, T 8192: 6 * 8192 * 8 * 2048 * 7168 = 5.77e12 -> 7.3 ms at 790 TFLOP/s.
This module knows models and timing; it knows nothing about files or reports.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from diag.bench.common import sync, timed
from diag.int4.packed import PackedExperts, resident_bytes
from diag.layouts import CapturePoint
from diag.target.passes import Sequence, run_capture


def synthetic_sequences(n: int, length: int, prompt_len: int, vocab: int, seed: int = 0) -> list[Sequence]:
    """n random token sequences of `length` ids (stand-ins for prompt + continuation)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=gen)
    return [Sequence(f"s{i}", "synthetic", prompt_len, ids[i].clone()) for i in range(n)]


def expert_flops(tokens: int, top_k: int, inter: int, hidden: int) -> int:
    return 6 * tokens * top_k * inter * hidden


def routed_inputs(moe: nn.Module, tokens: int, seed: int = 0):
    """x [T, H] bf16 and the layer's own router's (top_k_index, top_k_weights) for it."""
    dev = moe.gate.weight.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(tokens, moe.config.hidden_size, device=dev, generator=gen, dtype=torch.bfloat16)
    with torch.no_grad():
        _, weights, index = moe.gate(x)
    return x, index, weights


def dense_grouped_mm(packed: PackedExperts, config) -> nn.Module:
    """transformers' own DeepseekV3Experts holding the dequantized bf16 weights, dispatched
    to its grouped_mm implementation (34 GB for one Kimi layer)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts

    cfg = copy.copy(config)
    cfg._experts_implementation = "grouped_mm"
    with torch.device("meta"):
        dense = DeepseekV3Experts(cfg)
    dev = packed.gate_up_proj_packed.device
    for proj in ("gate_up_proj", "down_proj"):
        shape = getattr(dense, proj).shape
        full = torch.empty(shape, dtype=torch.bfloat16, device=dev)
        for e in range(shape[0]):
            full[e] = packed.expert_weight(proj, e, torch.bfloat16)
        setattr(dense, proj, nn.Parameter(full, requires_grad=False))
    dense.act_fn = packed.act_fn
    return dense.eval()


@torch.no_grad()
def experts_compare(moe: nn.Module, tokens: list[int], peak: float, *, eager_tokens: int | None,
                    tile_budget_s: float = 120.0) -> dict:
    """Per token count: fused INT4 and bf16 grouped_mm seconds, TFLOP/s, fraction of peak;
    the eager packed loop once at `eager_tokens`; max relative error of fused vs eager."""
    from diag.int4.fast import fused_experts

    packed = moe.experts
    cfg = moe.config
    out = {"int4_bytes": resident_bytes(packed)}
    x, idx, w = routed_inputs(moe, 512, seed=1)
    ref = PackedExperts.forward(packed, x, idx, w)
    got = fused_experts(packed, x, idx, w)
    out["fused_vs_eager_rel_err"] = float((got.float() - ref.float()).norm() / ref.float().norm())
    if eager_tokens:
        x, idx, w = routed_inputs(moe, eager_tokens)
        out["eager_seconds"] = {eager_tokens: timed(lambda: PackedExperts.forward(packed, x, idx, w),
                                                    repeat=1, warmup=0)}
    from diag.bench.tiles import tune_grouped
    from diag.int4.fast import grouped_fits
    out["tiles"] = tune_grouped(moe, 8192, budget_s=tile_budget_s) if grouped_fits(packed) else tune_tiles(moe, 8192)
    if grouped_fits(packed):                    # the row blocks' costs at the tiles just chosen
        from diag.bench.tiles import block_costs
        out["block_costs"] = block_costs(packed, top_k=idx.shape[1])
    out["kernel"] = "grouped" if grouped_fits(packed) else "any-width"
    dense = dense_grouped_mm(packed, cfg)
    out["bf16_bytes"] = resident_bytes(dense)
    rows = []
    for t in tokens:
        x, idx, w = routed_inputs(moe, t)
        flops = expert_flops(t, idx.shape[1], cfg.moe_intermediate_size, cfg.hidden_size)
        t_int4 = timed(lambda: fused_experts(packed, x, idx, w), repeat=5)
        t_bf16 = timed(lambda: dense(x, idx, w), repeat=5)
        rows.append({"tokens": t, "flops": flops, "int4_seconds": t_int4, "bf16_seconds": t_bf16,
                     "int4_fraction_of_peak": flops / t_int4 / peak,
                     "bf16_fraction_of_peak": flops / t_bf16 / peak,
                     "int4_over_bf16_throughput": t_bf16 / t_int4})
    out["rows"] = rows
    out["weight_memory_ratio"] = out["int4_bytes"] / out["bf16_bytes"]
    del dense
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


TILE_CHOICES = ({"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 3},
                {"block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3},
                {"block_m": 64, "block_n": 128, "block_k": 128, "num_warps": 8, "num_stages": 3},
                {"block_m": 128, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 4})


@torch.no_grad()
def tune_tiles(moe: nn.Module, tokens: int) -> list[dict]:
    """Time the fused path under each tile choice at `tokens`; keep the fastest in
    diag.int4.fast.TILES for the rest of the run."""
    from diag.int4 import fast

    x, idx, w = routed_inputs(moe, tokens, seed=2)
    rows = []
    for tiles in TILE_CHOICES:
        fast.TILES.update(tiles)
        try:
            rows.append({**tiles, "seconds": timed(lambda: fast.fused_experts(moe.experts, x, idx, w), repeat=3)})
        except Exception as err:  # e.g. a tile needing more shared memory than the GPU has
            rows.append({**tiles, "seconds": float("inf"), "error": repr(err)[:300]})
    fast.TILES.update({k: v for k, v in min(rows, key=lambda r: r["seconds"]).items()
                       if k not in ("seconds", "error")})
    return rows


def capture_throughput(model: nn.Module, seqs: list[Sequence], points: tuple[CapturePoint, ...],
                       token_budget: int, *, repeat: int = 2):
    """Seconds of one run_capture over seqs (median of `repeat` after a warm-up), tokens/s,
    peak device bytes above the resident weights. Returns (row, last TargetPass)."""
    box = {}

    def once():
        box["tp"] = run_capture(model, seqs, points, regime="as-loaded", token_budget=token_budget,
                                progress=False)
    weights = resident_bytes(model)
    if torch.cuda.is_available():
        sync()
        torch.cuda.reset_peak_memory_stats()
    seconds = timed(once, repeat=repeat, warmup=1)
    tokens = sum(len(s.ids) for s in seqs)
    row = {"token_budget": token_budget, "tokens": tokens, "seconds": seconds,
           "tokens_per_second": tokens / seconds, "weight_bytes": weights}
    if torch.cuda.is_available():
        row["peak_bytes"] = torch.cuda.max_memory_allocated()
        row["activation_peak_bytes"] = row["peak_bytes"] - weights
    return row, box["tp"]
