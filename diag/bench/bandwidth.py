"""The greedy decode step against the bytes it must read (issue 36: the decode step, most of
Kimi's first verdict, has the verify's goal: >= 50% of the weight-read limit).

A step of T rows through one MoE layer reads the layer's other weights whole (attention, the
shared expert, the router) and of its routed experts only those a row is routed to: with T x k
slots over E experts, E (1 - (1 - 1/E)^(T k)) distinct experts are expected (uniform routing;
the bench's random-weight gate routes close to it). So, per added layer of the grown section:
  step bytes  = rest + routed x (1 - (1 - 1/E)^(T k))
  bytes/s     = step bytes / the grown section's seconds per layer-step at batch T
  fraction    = bytes/s / the device's measured copy bandwidth        (goal >= 0.5)
  limit       = step bytes / the copy bandwidth: the step's physical floor
A fraction over 1 is no device rate (host_bound): a path whose host launches outlast its kernels
(transformers' eager generate: 8.3 ms a step at 2 layers, batch 16, against 3.1 graphed) adds a
layer's launches to the slope, its device time hidden under them.
The layer's bytes: the grown section's (weight_bytes - base weight_bytes) / added layers, its
routed share measured on the grown model (`added_layer`) or, for a run before it was recorded,
Kimi's (routed_bytes(): 384 experts x 3 x 2048 x 7168 INT4 with bf16 scales per 32).
Worked example (Kimi's MoE layer: routed 9.513e9 B, rest 0.296e9 B, E 384, k 8), batch 16:
128 slots -> 384 (1 - (383/384)^128) = 109.0 experts, 0.2838 of them -> 0.2838 x 9.513e9 +
0.296e9 = 2.995e9 B; 4.922 ms a layer-step -> 6.09e11 B/s; copy 2.989e12 B/s -> 0.204.
This module knows arithmetic; it reads no files.
"""

from __future__ import annotations

GOAL = 0.5          # the step's bytes/s over the copy bandwidth, at least


def routed_bytes(experts: int, intermediate: int, hidden: int, group: int, scale_bytes: int = 2) -> int:
    """One MoE layer's routed experts as pack-quantized INT4: gate, up and down (3 x I x H
    weights, 4 bits each) and a scale (bf16: 2 bytes) per `group` weights. Kimi: 384 x 3 x 2048
    x 7168 x (1/2 + 2/32) = 9,512,681,472 B."""
    weights = 3 * intermediate * hidden
    return experts * (weights // 2 + scale_bytes * (weights // group))


def expected_experts(experts: int, slots: int) -> float:
    """Distinct experts that `slots` uniform draws hit: E (1 - (1 - 1/E)^slots). 384, 128 -> 109.0."""
    return experts * (1.0 - (1.0 - 1.0 / experts) ** slots)


def decode_step_bandwidth(grown: dict, copy_bytes_per_s: float, *, routed: int, experts: int,
                          top_k: int, routed_from: str, key: str = "generate_seconds_per_layer_step_by_batch") -> dict:
    """Per batch the grown section timed (`key`: the pipeline's greedy step, or
    transformers_generate_seconds_per_layer_step_by_batch, transformers' generate beside it): the
    step's bytes, bytes/s, fraction of the copy bandwidth and the floor (module docstring); the
    worst fraction and whether it meets GOAL."""
    added = grown["layers"] - grown["base_layers"]
    per_layer = (grown["weight_bytes"] - grown["base_capture"]["weight_bytes"]) / max(added, 1)
    rest = per_layer - routed
    rows = {}
    for batch, seconds in sorted(grown.get(key, {}).items(),
                                 key=lambda kv: int(kv[0])):
        share = expected_experts(experts, int(batch) * top_k) / experts
        step = rest + routed * share
        rate = step / seconds if seconds and seconds > 0 else None
        fraction = rate / copy_bytes_per_s if rate else None
        rows[batch] = {"step_bytes": step, "experts_share": share, "seconds_per_layer_step": seconds,
                       "bytes_per_second": rate, "fraction_of_copy_bandwidth": fraction,
                       "limit_seconds_per_layer_step": step / copy_bytes_per_s,
                       "host_bound": fraction is not None and fraction > 1.0}
    fractions = [r["fraction_of_copy_bandwidth"] for r in rows.values() if r["fraction_of_copy_bandwidth"]]
    worst = min(fractions) if fractions else None
    return {"by_batch": rows, "layer_bytes": per_layer, "routed_bytes": routed, "rest_bytes": rest,
            "experts": experts, "top_k": top_k, "routed_from": routed_from, "copy_bytes_per_s": copy_bytes_per_s,
            "fraction_of_copy_bandwidth_min": worst, "goal": GOAL,
            "goal_met": worst is not None and worst >= GOAL}
