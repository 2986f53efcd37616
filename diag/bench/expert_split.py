"""What one GPU's share of a layer's routed experts costs when the experts are split over N
GPUs (`[placement] experts = "split"`, diag.int4.sharded), measured on one GPU: the layer's
experts forward at a round's token count, all E experts against one shard of E / N (its pairs
only, the others' the sentinel), each timed with CUDA events, the median of REPEATS kept.

On N GPUs the shards run at once, so a layer's experts take about the shard's time instead of
the whole layer's; the extrapolation (bench/extrapolate.py) takes the difference off each
layer's round cost:
      saved(tokens) = all(tokens) - shard(tokens)      per layer, per round
between the measured token counts linearly, outside them the nearest.
Worked example: at 64 tokens all 2.9 ms, one shard of 8 0.45 ms -> 2.45 ms a layer-round
saved; over 59 added layers and 121 rounds, 17.5 s.

Not measured here (one GPU): the hand-off of the hidden states to the N - 1 other GPUs and
their partial sums back (a round of 64 tokens: 64 x 7168 x (2 + 4) B = 2.8 MB a GPU, some
10 us at NVLink's bandwidth), and the launches of N devices' kernels from one host thread.
This module knows the experts' forward and CUDA timing; nothing about runs or reports.
"""

from __future__ import annotations

import statistics

import torch

from diag.bench.round_slope import LARGE, SMALL
from diag.trees import tree_shape

SHARDS = 8                # Kimi's GPUs
# a round's verified tokens: the decode-loop probe's two sizes (bench/round_slope.py: 16 rows of chain-1,
# 32 tokens; 48 of s3-k8-d16, 768) and 64 between them. With 64 and 768 only, saved() took the 64-token
# row for the further variant's ~45-token rounds: 2.83 ms saved a layer-round on the H100, more than the
# decode-loop fit's whole layer-round at 32 tokens (2.78 ms; reports/bench/NOTES.md, twenty-fifth stop)
TOKENS = (SMALL[1] * tree_shape(SMALL[0]).num_draft_tokens, 64, LARGE[1] * tree_shape(LARGE[0]).num_draft_tokens)
REPEATS = 20


def _timed(fn, repeats: int = REPEATS) -> float:
    fn()                                                   # first call: layout, routing graph, compile
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


@torch.no_grad()
def probe(model, shards: int = SHARDS, tokens=TOKENS, top_k: int | None = None, seed: int = 0) -> dict:
    """The first routed-experts module of `model` (on CUDA): {"shards", "experts", "rows":
    [{"tokens", "all_s", "shard_s", "saved_s", "shard_fraction"}]}; {"error": why} when it
    cannot run (no CUDA experts, or the forward failed: data, not a crash)."""
    from diag.int4.fast import fused_experts
    from diag.int4.packed import PackedExperts
    from diag.int4.sharded import ShardedExperts, local_index, shard_pairs

    module = next((m for m in model.modules() if isinstance(m, PackedExperts)), None)
    if module is None or not module.gate_up_proj_packed.is_cuda:
        return {"error": "no routed experts on a CUDA device"}
    k = top_k or int(getattr(model.config, "num_experts_per_tok", 8))
    gen = torch.Generator(device=module.gate_up_proj_packed.device).manual_seed(seed)
    rows = []
    try:
        with torch.cuda.device(module.gate_up_proj_packed.device):
            for t in tokens:
                dev = module.gate_up_proj_packed.device
                x = torch.randn(t, module.hidden_dim, device=dev, generator=gen, dtype=torch.bfloat16)
                idx = torch.rand(t, module.num_experts, device=dev, generator=gen).topk(k, dim=-1).indices
                w = torch.rand(t, k, device=dev, generator=gen, dtype=torch.bfloat16)
                all_s = _timed(lambda: module(x, idx, w))
                shard = ShardedExperts.of(module, [dev] * shards).shards[0]     # views: what GPU 0 holds
                local = local_index(idx, 0, shard.num_experts)
                share = shard_pairs(local.numel(), shard.num_experts, module.num_experts)
                shard_s = _timed(lambda: fused_experts(shard, x, local, w, partial=True, pairs=share))
                rows.append({"tokens": t, "all_s": all_s, "shard_s": shard_s, "saved_s": all_s - shard_s,
                             "shard_fraction": shard_s / all_s})
    except Exception as err:  # recorded in the JSON
        return {"error": repr(err)[-400:]}
    return {"shards": shards, "experts": module.num_experts, "experts_per_shard": shard.num_experts, "top_k": k,
            "rows": rows}


def saved(split: dict, tokens: float) -> float:
    """saved_s per layer-round at `tokens` verified tokens (module docstring)."""
    rows = sorted(split.get("rows", []), key=lambda r: r["tokens"])
    if not rows:
        return 0.0
    if tokens <= rows[0]["tokens"]:
        return rows[0]["saved_s"]
    for lo, hi in zip(rows, rows[1:]):
        if tokens <= hi["tokens"]:
            f = (tokens - lo["tokens"]) / (hi["tokens"] - lo["tokens"])
            return lo["saved_s"] + f * (hi["saved_s"] - lo["saved_s"])
    return rows[-1]["saved_s"]
