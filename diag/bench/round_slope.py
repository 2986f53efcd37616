"""The sampled decode loop's per-layer cost, for the 61-layer extrapolation of a sampled run
(bench/extrapolate.sampled_extrapolation): the grown section runs the loop at two verify sizes
before and after growing the model, and fits each layer's cost of one round as
      per layer, per round  =  a  +  b * verified tokens of that round
(a: reading the layer's weights and launching its kernels once; b: each verified token's share).
Two sizes, small (chain-1, SMALL_ROWS rows: 2 tokens a row) and large (s3-k8-d16, LARGE_ROWS
rows: 16 a row), at base depth K and grown depth N:
      c_i = (seconds per round at N - at K) / (N - K)      for i in small, large
      b   = (c_large - c_small) / (tokens_large - tokens_small),  a = c_small - b * tokens_small
(b < 0, noise at equal cost: b = 0 and a the larger c; a c <= 0: no fit, an "error" saying so,
and the extrapolation falls back to the greedy decode slope).
A round's cost is not linear in its tokens: its routed experts are most of a layer's round, and
the experts a round reaches grow as 1 - (1 - k/E)^tokens, fast at first, then not at all (384
experts, top 8: 192 reached at 32 tokens, 288 at 64, all at 768). So a third size, MIDDLE (chain-1
at 32 rows, 64 tokens), is measured, and the fit's `points` [[tokens, c], ...] give each layer's
round piecewise linearly between the sizes (`layer_round`): the line through small and large alone
put the H100's layer-round at 64 tokens at 2.70 ms, where its experts alone took 3.50 ms
(reports/bench/NOTES.md, twenty-ninth stop). The extrapolation then grows a run's
loop by (61 - K) * rounds * layer_round(verified tokens / rounds), its own counts
(timings.sampled_rounds, sampled_verified_tokens); on the line that is a * rounds + b * tokens.
Worked example: K 2, N 12; small 16 rows x 2 = 32 tokens a round, 20 ms at K, 70 ms at N ->
c 5 ms; large 48 x 16 = 768 tokens, 60 ms at K, 260 ms at N -> c 20 ms; b = 15 ms / 736 =
20.4 us a token, a = 5 ms - 32 * 20.4 us = 4.35 ms a round.
The drafter is the Kimi-shaped random one (accepts ~1: every row runs max_new_tokens rounds,
the timing's concern is the round, not the acceptance).

A loop's time is not all rounds: each loop prefills PROMPT_LEN tokens a row and captures each
step's graphs once (the capture round runs eagerly), and these grow with depth too. A loop of
16 rounds spreads them over 16, the further variant's loop of 121 over 121: counted per round,
the probe would carry 121/16 of them into the extrapolation. So each size runs at two lengths,
NEW_TOKENS and LONG_TOKENS, and
      per round (steady)  = (seconds_long - seconds_short) / (rounds_long - rounds_short)
      per loop            = seconds_short - rounds_short * per round
(the same captures in both: a row of the random drafter never finishes early); the fit then
gives each layer's a and b from the steady rounds, and c, its cost per loop, from the small
size's per-loop costs:   c = (per loop at N - at K) / (N - K)    (0 when it comes out < 0).
The extrapolation grows a run by (61 - K) * (a * rounds + b * tokens + c * its decode loop(s)).
Worked example: 16 rows, 15 rounds 0.2176 s, 47 rounds 0.5 s -> 8.82 ms a round, 0.085 s a loop.
This module knows the decode loop; nothing about the bench's sections.
"""

from __future__ import annotations

import time

import torch

SMALL, MIDDLE, LARGE = ("chain-1", 16), ("chain-1", 32), ("s3-k8-d16", 48)     # (tree, rows)
SPLIT_MODES = ("graphs", "program", "eager")            # split_probe's ways to run the target's steps
TARGET_STEPS = {"graphs": None, "program": "program", "eager": "eager"}        # -> DecodeLoop.target_steps
SIZES = {"small": SMALL, "middle": MIDDLE, "large": LARGE}
PROMPT_LEN, NEW_TOKENS, LONG_TOKENS = 64, 16, 48
REPEATS = 2                                            # timed loops after the warm-up; the fastest is kept


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def round_seconds(model, drafter, layout: str, tree: str, rows: int, *, new_tokens: int = NEW_TOKENS,
                  prompt_len: int = PROMPT_LEN, seed: int = 7, target_steps: str | None = None) -> dict:
    """The decode loop at T=1.0 top-p 0.95, one lane of `layout` over `rows` random prompts, run
    REPEATS + 1 times at full length, the first untimed (a first loop of a shape pays the
    allocator's and the kernels' first calls: on an H100 the base probe's first chain-1 loop took
    0.167 s a round, the grown model's 0.035, a negative per-layer cost), the fastest kept:
    {"seconds", "rounds", "verified_tokens", "seconds_per_round", "verified_tokens_per_round",
    "repeats", "program_steps"}. target_steps: "eager" or "program", the target's steps so
    (DecodeLoop.target_steps); program_steps: the host calls of the last programs' replays, by step."""
    from diag.bench.sampled import bench_loop
    from diag.engines.decoding import sampled
    from diag.trees import tree_shape

    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(10, model.config.vocab_size, (rows, prompt_len), generator=gen).tolist()
    dev = next(drafter.parameters()).device
    times = []
    for _ in range(REPEATS + 1):
        loop, _, lanes_rows = bench_loop(model, drafter, embed, head, [layout], tree_shape(tree), rows,
                                         decoding=sampled(1.0, 0.95))
        loop.target_steps = target_steps
        _sync(dev)
        t0 = time.perf_counter()
        loop.run(prompts, lanes_rows, new_tokens)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    seconds, rounds, tokens = min(times[1:]), loop.counts["rounds"], loop.counts["verified_tokens"]
    return {"tree": tree, "rows": rows, "seconds": seconds, "rounds": rounds, "verified_tokens": tokens,
            "seconds_per_round": seconds / max(rounds, 1), "verified_tokens_per_round": tokens / max(rounds, 1),
            "repeats": REPEATS, "program_steps": {k: v for k, v in loop.counts.items() if "_program_" in k}}


def steady(short: dict, long: dict) -> dict:
    """A size's two loops -> its steady round and its per-loop cost (module docstring): short's
    row with "seconds_per_round" (steady), "loop_seconds", "short" and "long" (both loops)."""
    more = long["rounds"] - short["rounds"]
    per_round = (long["seconds"] - short["seconds"]) / more if more > 0 else short["seconds_per_round"]
    return {**short, "seconds_per_round": per_round,
            "loop_seconds": max(short["seconds"] - short["rounds"] * per_round, 0.0),
            "verified_tokens_per_round": long["verified_tokens"] / max(long["rounds"], 1),
            "short": short, "long": long}


def probe(model, drafter, layout: str, *, new_tokens: tuple[int, int] = (NEW_TOKENS, LONG_TOKENS)) -> dict:
    """Every size at the model's current depth, each at both lengths: {"small": steady(...),
    "middle": ..., "large": ...}; a probe's failure (or no drafter) is data: {"error": why}, and
    the grown section's other rows stay."""
    if drafter is None:
        return {"error": "no drafter: the costs probe could not load it"}
    try:
        return {name: steady(*(round_seconds(model, drafter, layout, tree, rows, new_tokens=n) for n in new_tokens))
                for name, (tree, rows) in SIZES.items()}
    except Exception as err:  # recorded in the JSON, not hidden
        return {"error": repr(err)[-400:]}


def split_probe(model, drafter, layout: str, shards: int, busy: int = 0, *,
                new_tokens: tuple[int, int] = (NEW_TOKENS, LONG_TOKENS)) -> dict:
    """MIDDLE at the model's current depth with every layer's routed experts as one GPU of
    `shards` runs them (expert_split.OneGpuOfN: the host issues all shards' launches and hand-off
    copies, this GPU runs shard `busy`'s pairs), at both lengths, three times (SPLIT_MODES):
    "graphs", the target's steps replayed from one CUDA graph each (a bound: a graph holds one
    device's work); "program", from programs cut where the GPUs hand off, as diag runs a target
    over several GPUs (target/device_program.py: each GPU's graphs and the copies between them);
    "eager", the target's steps run eagerly, as diag ran one before programs; the drafter's steps
    graphed in all three (it sits on one GPU). Each a `steady` row, with "shards", "busy" and
    "layers_split". {"error": why} where it cannot run. `split_fit` takes each mode's per-layer
    round from two depths."""
    from diag.bench.expert_split import one_gpu_of

    if drafter is None:
        return {"error": "no drafter: the costs probe could not load it"}
    tree, rows = MIDDLE
    try:
        with one_gpu_of(model, shards, busy) as layers:
            out = {mode: steady(*(round_seconds(model, drafter, layout, tree, rows, new_tokens=n,
                                                target_steps=TARGET_STEPS[mode]) for n in new_tokens))
                   for mode in SPLIT_MODES}
    except Exception as err:  # recorded in the JSON, not hidden
        return {"error": repr(err)[-400:]}
    return {**out, "shards": shards, "busy": busy, "layers_split": layers}


def split_fit(base: dict, grown: dict, added: int) -> dict | None:
    """Each mode's per-layer round at MIDDLE's verified tokens a round, from split_probe before and
    after adding `added` layers: {"tokens": t, "graphs": c, "program": c, "eager": c, "shards",
    "busy", "base_layers_split": the base's layers split} (the modes both probes ran); None where
    a probe failed or is missing, a mode's c None where it came out <= 0 (noise).
    Worked example: eager 40 ms a round at 2 layers, 52 ms at 4 -> 6 ms a layer-round."""
    if not base or not grown or "error" in base or "error" in grown:
        return None
    modes = [m for m in SPLIT_MODES if m in base and m in grown]
    c = {m: (grown[m]["seconds_per_round"] - base[m]["seconds_per_round"]) / max(added, 1) for m in modes}
    return {"tokens": base["graphs"]["verified_tokens_per_round"], "shards": grown["shards"], "busy": grown["busy"],
            "base_layers_split": base.get("layers_split"), **{m: (v if v > 0 else None) for m, v in c.items()}}


def fit(base: dict, grown: dict, added: int) -> dict | None:
    """The per-layer round cost (module docstring) from `probe` before and after adding `added`
    layers: {"seconds_per_layer_round": a, "seconds_per_layer_verified_token": b, "points":
    [[tokens, c], ...] every size's, by tokens}; None when a probe failed. A probe made before
    MIDDLE has two points, on the line."""
    if "error" in base or "error" in grown:
        return None
    sizes = [k for k in SIZES if k in base and k in grown]
    c = {k: (grown[k]["seconds_per_round"] - base[k]["seconds_per_round"]) / max(added, 1) for k in sizes}
    t = {k: base[k]["verified_tokens_per_round"] for k in sizes}
    if min(c.values()) <= 0:            # more layers never cost less: the timings are noise, not a cost
        return {"error": f"a layer's round cost came out <= 0 (small {c['small']:.4g} s, large {c['large']:.4g} s "
                         f"over {added} added layers): the probes are noise, no fit",
                "seconds_per_layer_round": None, "per_layer_round_small": c["small"],
                "per_layer_round_large": c["large"], "tokens_per_round": t}
    b = (c["large"] - c["small"]) / (t["large"] - t["small"])
    a = c["small"] - b * t["small"]
    if b < 0:
        a, b = max(c.values()), 0.0
    loop = None                          # probes made before the two lengths: the loop's costs in a
    if "loop_seconds" in base["small"] and "loop_seconds" in grown["small"]:
        loop = max((grown["small"]["loop_seconds"] - base["small"]["loop_seconds"]) / max(added, 1), 0.0)
    return {"seconds_per_layer_round": a, "seconds_per_layer_verified_token": b, "seconds_per_layer_loop": loop,
            **{f"per_layer_round_{k}": c[k] for k in sizes}, "tokens_per_round": t, "points": _points(t, c)}


def _points(tokens: dict, cost: dict) -> list[list[float]]:
    """[[tokens, c], ...] by tokens, each c at least the one before it: more verified tokens never
    cost a layer less, so a dip is the timings' noise and is raised to its neighbour's cost."""
    out, most = [], 0.0
    for t, c in sorted((tokens[k], cost[k]) for k in tokens):
        most = max(most, c)
        out.append([t, most])
    return out


def layer_round(points: list, tokens: float) -> float:
    """One layer's round at `tokens` verified tokens from a fit's points: linear between the two
    points around it, the first point's cost below them, the last segment's line above them
    (its experts all reached, each token adds its share). Worked example: points (32, 2.53 ms),
    (64, 3.76 ms), (768, 6.45 ms): 48 tokens -> 3.145 ms, 16 -> 2.53 ms, 1000 -> 6.45 + 232 *
    2.69 / 704 = 7.336 ms."""
    if tokens <= points[0][0] or len(points) == 1:
        return points[0][1]
    for (t0, c0), (t1, c1) in zip(points, points[1:]):
        if tokens <= t1:
            return c0 + (tokens - t0) * (c1 - c0) / (t1 - t0)
    (t0, c0), (t1, c1) = points[-2], points[-1]
    return c1 + (tokens - t1) * (c1 - c0) / (t1 - t0)
