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

Two routings: uniform (each token's top-k drawn at random: a trained Kimi's balanced router
reaches nearly every expert) and, given token ids, the model's own router on them (`model_routed`:
the bench's target routes as the decode-loop fit's rounds were routed, so the saving that comes
off that fit is the one measured on it; there the slowest shard sets the pace). The twenty-eighth
stop's H100 had all 384 experts at 64 uniform tokens cost 3.15 ms, more than the fit's whole
layer-round at those tokens (2.88 ms): the bench target's rounds reach fewer experts than uniform.

Not measured by `probe` (one GPU): the hand-off of the hidden states to the N - 1 other GPUs
and their partial sums back (a round of 64 tokens: 64 x 7168 x (2 + 4) B = 2.8 MB a GPU, some
10 us at NVLink's bandwidth), and the launches of N devices' kernels from one host thread.
`OneGpuOfN` puts those in: a layer's experts as one GPU of N runs them, on one GPU (the host
issues every shard's launches and hand-off copies, the device runs one shard's pairs), which
round_slope.split_probe times inside the decode loop, graphed and eager.
This module knows the experts' forward and CUDA timing; nothing about runs or reports.
"""

from __future__ import annotations

import statistics
from contextlib import contextmanager

import torch
from torch import nn

from diag.bench.round_slope import LARGE, SMALL
from diag.int4.sharded import ShardedExperts, local_index, packed, runs_fused, shard_pairs, summed, unpacked
from diag.target.device_program import cut, hand_off
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
def probe(model, shards: int = SHARDS, tokens=TOKENS, top_k: int | None = None, seed: int = 0,
          ids: torch.Tensor | None = None) -> dict:
    """The first routed-experts module of `model` (on CUDA): {"shards", "experts", "rows":
    [{"tokens", "all_s", "shard_s", "saved_s", "shard_fraction"}]} under uniform routing, and
    with `ids` ([B, L] token ids) "model_rows" likewise under the routing the model's own router
    gives those tokens (`model_routed`), whose shard_s is the slowest shard's (the GPUs wait for
    it); {"error": why} when it cannot run (no CUDA experts, or the forward failed: data, not a
    crash)."""
    from diag.int4.packed import PackedExperts

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
                shard_s, _ = _shard_timed(shard, module.num_experts, x, idx, w)
                rows.append({"tokens": t, "all_s": all_s, "shard_s": shard_s, "saved_s": all_s - shard_s,
                             "shard_fraction": shard_s / all_s})
        model_rows = _model_rows(model, module, ids, shards, tokens) if ids is not None else None
    except Exception as err:  # recorded in the JSON
        return {"error": repr(err)[-400:]}
    return {"shards": shards, "experts": module.num_experts, "experts_per_shard": shard.num_experts, "top_k": k,
            "rows": rows, **({"model_rows": model_rows} if model_rows is not None else {})}


class _Reached(Exception):
    """Raised by model_routed's hook: the experts' inputs are in hand, the forward need go no further."""


def model_routed(model, module, ids: torch.Tensor, tokens: int) -> tuple:
    """(x, top_k_index, top_k_weights) the model's own router hands `module` for `ids` [B, L]
    (the forward stopped there), `tokens` of them taken position by position across the rows,
    as a round's verified tokens come from many rows. Example: ids [2, 3], tokens 4 -> the
    tokens of (row 0, pos 0), (1, 0), (0, 1), (1, 1)."""
    got = {}

    def grab(_module, args):
        got["args"] = args
        raise _Reached

    hook = module.register_forward_pre_hook(grab)
    try:
        model(input_ids=ids.to(module.gate_up_proj_packed.device))
    except _Reached:
        pass
    finally:
        hook.remove()
    x, idx, w = got["args"][:3]
    B, L = ids.shape
    order = torch.arange(B * L, device=x.device).view(B, L).T.reshape(-1)[:tokens]
    return x[order], idx[order], w[order]


def _shard_timed(shard, experts: int, x, idx, w) -> tuple[float, int]:
    """One shard's experts on the pairs routed to it (the others' the sentinel), its row blocks
    sized for its share as ShardedExperts sizes them: (seconds, its pairs)."""
    from diag.int4.fast import fused_experts

    local = local_index(idx, shard.first_expert, shard.num_experts)
    share = shard_pairs(local.numel(), shard.num_experts, experts)
    seconds = _timed(lambda: fused_experts(shard, x, local, w, partial=True, pairs=share))
    return seconds, int((local < shard.num_experts).sum())


def _model_rows(model, module, ids, shards: int, tokens) -> list[dict]:
    """probe's rows under the model's routing: all experts, then every shard (its pairs only),
    the slowest shard's time kept, with each shard's pairs."""
    rows = []
    for t in (t for t in tokens if t <= ids.numel()):
        x, idx, w = model_routed(model, module, ids, t)
        all_s = _timed(lambda: module(x, idx, w))
        times, pairs = zip(*(_shard_timed(shard, module.num_experts, x, idx, w)
                             for shard in ShardedExperts.of(module, [x.device] * shards).shards))
        times, pairs = list(times), list(pairs)
        rows.append({"tokens": t, "all_s": all_s, "shard_s": max(times), "saved_s": all_s - max(times),
                     "shard_fraction": max(times) / all_s, "shard_seconds": times, "shard_pairs": pairs,
                     "experts_reached": int(idx.unique().numel())})
    return rows


def saved(split: dict, tokens: float, routing: str | None = None) -> float:
    """saved_s per layer-round at `tokens` verified tokens (module docstring), from the rows of
    `routing` ("model": the model's own router, "uniform"; default: the model's where the probe
    has them, as the decode-loop fit the saving comes off was measured on that routing)."""
    return at(split, tokens, "saved_s", routing)


def at(split: dict, tokens: float, key: str, routing: str | None = None) -> float:
    """A probe row's `key` at `tokens`: linear between the measured token counts, the nearest
    outside them, 0 without rows."""
    rows = sorted(split.get(_rows_key(split, routing), []), key=lambda r: r["tokens"])
    if not rows:
        return 0.0
    if tokens <= rows[0]["tokens"]:
        return rows[0][key]
    for lo, hi in zip(rows, rows[1:]):
        if tokens <= hi["tokens"]:
            f = (tokens - lo["tokens"]) / (hi["tokens"] - lo["tokens"])
            return lo[key] + f * (hi[key] - lo[key])
    return rows[-1][key]


def routing_of(split: dict, routing: str | None = None) -> str:
    """Which routing saved() reads: "model" where asked or, by default, where the probe has it."""
    return "model" if _rows_key(split, routing) == "model_rows" else "uniform"


def _rows_key(split: dict, routing: str | None) -> str:
    if routing == "model" or (routing is None and split.get("model_rows")):
        return "model_rows"
    return "rows"


class OneGpuOfN(ShardedExperts):
    """A layer's routed experts split over N GPUs as one of them sees a forward, on one GPU: the
    host issues what ShardedExperts issues on N devices, every shard's kernels and the hand-off
    copies (shards 1.. N-1 are elsewhere: their inputs in, one packed buffer each, and their
    partial sums back, as clones, the device's copy of the same bytes, and in a program's
    recording the cuts a hand-off makes: `handed`), while the device runs shard `busy`'s pairs
    only; the others' index is all sentinel (their kernels launch over no pairs), as the other
    GPUs run their own shares meanwhile. In a captured forward (a graph, a program) the other
    shards' kernels, their local index's among them (ShardedExperts takes it on the shard's own
    device), are left to their GPUs (`elsewhere`: one kernel and, in a program, a graph boundary
    stand in for each: a graph holds one device's work); eager they are launched here, as the
    host issues them. The output is shard busy's partial sum: a timing's module, not the
    model's numbers. Worked example, E 4 over N 2, busy 1: top_k_index [[3, 0]] -> shard 1
    adds expert 3's output alone, expert 0's slot skipped (the sentinel)."""

    def __init__(self, module: nn.Module, shards: int, busy: int = 0):
        dev = module.gate_up_proj_packed.device
        if dev.type == "cuda" and hasattr(module, "fused_runs"):     # the shards are views of the module's
            from diag.int4.fast import grouped_fits, to_kernel_layout  # words: laid out first, as its first
            if grouped_fits(module):                                  # forward lays them (ShardedExperts.of)
                to_kernel_layout(module)
        super().__init__(list(ShardedExperts.of(module, [dev] * shards).shards))
        self.busy = busy

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        from diag.int4.fast import fused_experts

        inputs, buf, sent = (hidden_states, top_k_index, top_k_weights), None, []
        fused = all(runs_fused(shard, hidden_states) for shard in self.shards)
        captured = fused and hidden_states.is_cuda and torch.cuda.is_current_stream_capturing()
        for j, shard in enumerate(self.shards):
            start = shard.first_expert if j == self.busy else self.num_experts      # past them all: sentinel
            x, idx, w = inputs                                                      # shard 0 on the layer's GPU
            if j:                                                                   # the others: one buffer in
                buf = packed(*inputs) if buf is None else buf
                x, idx, w = unpacked(handed(buf), inputs)
            elsewhere_j = captured and j != self.busy       # its local index is its own GPU's kernels too
            sent.append((shard, x, None if elsewhere_j else local_index(idx, start, shard.num_experts), w))
        if fused:
            parts = [elsewhere(x) if idx is None else
                     fused_experts(shard, x, idx, w, partial=True,
                                   pairs=shard_pairs(idx.numel(), shard.num_experts, self.num_experts))
                     for shard, x, idx, w in sent]
            return summed(parts[0], parts[1:], handed).to(hidden_states.dtype)     # the partial sums back
        final = torch.zeros_like(hidden_states)
        for j, (shard, x, idx, w) in enumerate(sent):
            final = shard.add_into(final if j == 0 else handed(final), x, idx, w)
        return final


def elsewhere(x: torch.Tensor) -> torch.Tensor:
    """Another GPU's shard in a captured forward: its graph replays on that GPU, not on this one's
    stream, so here a graph of one kernel stands in for it (device_program.cut: the host's replay of
    it, in a program), and its partial sum is zeros, what its all-sentinel pairs add. Eager, the
    host issues that shard's kernels itself (OneGpuOfN launches them)."""
    cut()
    zeros = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    cut()
    return zeros


def handed(t: torch.Tensor) -> torch.Tensor:
    """t as another GPU would receive it: a clone, and, inside a program's recording, a cut of the
    program where the GPUs hand off (target/device_program.hand_off, forced on the one device)."""
    return hand_off(t, force=True)


@contextmanager
def one_gpu_of(model, shards: int = SHARDS, busy: int = 0):
    """Every layer's routed experts module (PackedExperts) of `model` replaced by OneGpuOfN for
    the block, the modules put back after it (their buffers shared, nothing copied). Yields the
    number of layers replaced. Split a fused module after its first forward (ShardedExperts.of)."""
    from diag.int4.packed import PackedExperts

    swapped = []
    for layer in model.model.layers:
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if isinstance(experts, PackedExperts):
            swapped.append((layer.mlp, experts))
            layer.mlp.experts = OneGpuOfN(experts, shards, busy)
    try:
        yield len(swapped)
    finally:
        for mlp, experts in swapped:
            mlp.experts = experts


def slowest_shard(split: dict, tokens: float) -> int:
    """The shard the probe's model-routed row nearest `tokens` found slowest (the GPUs wait for
    it), 0 without model rows."""
    rows = split.get("model_rows") or []
    if not rows:
        return 0
    row = min(rows, key=lambda r: abs(r["tokens"] - tokens))
    times = row.get("shard_seconds") or [0.0]
    return max(range(len(times)), key=times.__getitem__)
