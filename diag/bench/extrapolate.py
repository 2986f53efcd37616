"""From a K-layer Kimi-shaped run on one GPU to Kimi-K2.5 (61 layers, 8 GPUs): a pure
function over the benchmark's JSON sections, every figure with the formula that made it.

Assumptions (reports/bench/NOTES.md says why each holds or might not):
  bytes     Kimi's shards hold 1 dense layer, 60 MoE layers and the embeddings/head; the
            Kimi-shaped writer puts layer i in shard i, so bytes_61 = s_0 + 60 s_1 + s_last
  load      the 8 GPUs' shards are read concurrently from one host's disk, so the disk, not
            the GPUs, bounds it: load_61 = bytes_61 / (first-run load bytes/s measured here:
            cold, with the content digest the pass cache needs, as a first run loads;
            an older run without that row: the plain cold load's, and the formula says so)
  layers    placement runs layers one after another (no tensor parallelism), so a pass
            costs the sum of its layers: phase_61 = phase_K + (61 - K) * slope, the slopes
            measured by growing the model in GPU memory (same widths, random weights)
  pipeline  the teacher-forced pass streams its M token-budget batches through the 8 GPUs'
            stages as GPipe microbatches (diag/target/stages.py): capture_61 = the sum of
            its layers * (M + 7) / (8 M), bubble (S - 1) / (M + S - 1) = 7 / (M + 7); M is
            the e2e run's count (the same sequences and token budget make the same batches).
            Stages are taken as balanced (placement balances bytes; the embedding and head
            ride on the first and last). The greedy generation is taken as measured, one
            batch stage after stage ([placement] microbatches = 1, as the e2e run generates)
  hand-off  activations cross 7 GPU boundaries per forward; at 7168 x 2 bytes per token
            that is 229 KB for a 16-row decode step: not counted
  drafter   replay, verdicts and report do not depend on the target's depth: as measured
  sampled   a run with a sampled decoding: its decode loop (sampled_s) is taken out of the
            greedy verdict and grown by rounds x the decode slope (sampled_extrapolation says how),
            with the goals SAMPLED_GOALS: first sampled verdict after the load <= 300 s, each
            further sampled variant (the one-more-layout run) <= 10 s
  graphs    the slopes are measured on one GPU, where diag replays the greedy step and the
            verify from CUDA graphs (target/generate.py, target/verify_graphs.py); a target placed
            over several GPUs runs both eagerly (a graph is captured on one device), so on 8 GPUs a
            layer costs the larger of its device time and its launches' host time: the grown
            section's transformers_generate_* slope (eager) beside the graphed one brackets it
            (GRAPHS_NOTE, in the result); the split figure is timed eager where the grown
            section ran the loop as one GPU of the split runs it (_split_measured)
  batch     the decode slope is measured at the e2e run's generation batch; the batch Kimi
            itself would get on 8 GPUs of the same memory is computed by gen_batch's rule
            (each GPU holding 1/8 of the bytes; per GPU half the rest for caches, half for
            the prefill) and reported beside it: when they differ the extrapolation says so
Worked example, bytes: s_0 0.8 GB, s_1 9.9 GB, s_last 4.7 GB -> 0.8 + 60 * 9.9 + 4.7 =
599.5 GB; at 1.3 GB/s cold that loads in 461 s. Pipeline: a pass of 5 token-budget
batches taking 11.1 s layer after layer -> 11.1 * (5 + 7) / (8 * 5) = 3.3 s, bubble 7 / 12.
This module knows arithmetic; it reads no files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace

from diag.target.schedule import bubble_fraction, pipelined_seconds

KIMI_LAYERS = 61
KIMI_GPUS = 8
GRAPHS_NOTE = ("per-layer slopes measured on one GPU with the greedy step and the verify replayed from CUDA "
               "graphs; over several GPUs diag replays the decode loop's target steps as programs (one graph per "
               "run of one GPU's work, the hand-off copies between them: target/device_program.py) and runs the "
               "greedy generation eagerly (transformers' generate), so on 8 GPUs these are a lower bound where "
               "a layer's launches outlast its device time")


def kimi_bytes(shard_bytes: list[int]) -> int:
    """Shard sizes of a K-layer Kimi-shaped checkpoint (layer i in shard i, the last shard
    embeddings/norm/head) -> bytes of the 61-layer one."""
    return shard_bytes[0] + (KIMI_LAYERS - 1) * shard_bytes[1] + shard_bytes[-1]


def _step_costs(first: dict, grown: dict, k: int) -> tuple[float, float, str]:
    """(step costs at 61 layers, the rest of target_s kept as measured, formula). A run that
    timed its costs (target_costs_s) grows them by the grown section's slope when it has one,
    else by 61 / K; an older run's target_s minus its phases is all taken as step costs."""
    phases = ("target_load_s", "target_generate_s", "target_capture_s")
    other = first["target_s"] - sum(first.get(p, 0.0) for p in phases) - first.get("sampled_s", 0.0)
    costs = first.get("target_costs_s")
    if costs is None:
        return other * KIMI_LAYERS / k, 0.0, f"{other:.4g} * 61 / {k}"
    slope = grown.get("costs_seconds_per_layer")
    if slope is None:
        return costs * KIMI_LAYERS / k, other - costs, f"{costs:.4g} * 61 / {k}"
    return (costs + (KIMI_LAYERS - k) * slope, other - costs,
            f"{costs:.4g} + {KIMI_LAYERS - k} layers * {slope:.4g} s/layer")


def kimi_generation_batch(first: dict, max_new_tokens: int, kimi_total: int, gpu_memory: int | None,
                          token_budget: int, gpus: int = KIMI_GPUS) -> int | None:
    """The generation batch gen_batch's rule gives Kimi (61 layers) on `gpus` GPUs of
    `gpu_memory` bytes each, holding kimi_total / gpus bytes of weights each, for the e2e run's
    prompts; None when the run or the machine does not say. 48 prompts of at most 1,365
    tokens + 512, 150 GB GPUs, 594 GB of weights -> 75.8 GB free per GPU: caches
    8 * 37.9 GB / (1877 * 2.5 MB) = 64 rows, prefill 37.9 GB / 557 kB = 68k tokens = 49
    rows -> one batch of 48."""
    from diag.target.gen_batch import batch_in_room, rooms
    from diag.zoo.kimi_shaped import kimi_config
    from diag.checkpoint.config import text_config

    longest = first.get("target_generate_longest_prompt")
    if longest is None or gpu_memory is None:
        return None
    cfg = SimpleNamespace(**text_config(kimi_config(KIMI_LAYERS)))
    free = [max(0, gpu_memory - kimi_total // gpus)] * gpus
    return batch_in_room(cfg, first["sequences"], longest, max_new_tokens, *rooms(free), token_budget)


def generate_term(first: dict, grown: dict, extra: int, steps: int, calls: int, batch: int,
                  slope: float) -> tuple[float, str, dict]:
    """(the greedy generation at 61 layers, its formula, what to report beside it). Where the
    grown section timed the steady step at the batch (bench/gpu._generation_probe: the same call
    at two lengths, differenced), each added layer costs its steady step at every step plus, at
    every generate call, what the probe's whole call cost above its steady steps (the layer's
    prefill of the prompts, its share of the step graph's capture and of the read-back):
      generate_61 = generate_K + extra * (steady * steps + per_call * calls),
      per_call    = (whole-call slope - steady) * the probe's new tokens;
    else (an older run) the whole call's slope at every step, which charges every step with a
    share of the probe's per-call costs as if each call were as short as the probe's.
    Worked example: K 2, 48 prompts in one batch, 512 new tokens; at batch 48 the probe's 64-token
    call gave 4.50 ms a layer-step, its steady step 3.09 ms -> per call (4.50 - 3.09) * 64 = 90.2 ms;
    generate_2 0.8 s -> 0.8 + 59 * (0.00309 * 512 + 0.0902 * 1) = 99.5 s, where the whole call's
    slope gives 0.8 + 59 * 0.0045 * 512 = 136.7 s."""
    first_s = first.get("target_generate_s", 0.0)
    whole = first_s + extra * slope * steps
    whole_formula = f"{first_s:.4g} + {extra} layers * {slope:.4g} s/layer/step * {steps} steps (batch {batch})"
    steady = grown.get("generate_steady_seconds_per_layer_step_by_batch", {}).get(str(batch))
    probes = [grown.get("generation")] + [(grown.get("generation_at_batch") or {}).get("grown")]
    new_tokens = next((p["new_tokens"] for p in probes if p and p.get("prompts") == batch
                       and p.get("steady_seconds_per_step") is not None), None)
    if steady is None or new_tokens is None:
        return whole, whole_formula + ": the whole call's slope (the run timed no steady step)", {}
    per_call = max(0.0, (slope - steady) * new_tokens)
    gen = first_s + extra * (steady * steps + per_call * calls)
    return gen, (f"{first_s:.4g} + {extra} layers * ({steady:.4g} s/layer/step steady * {steps} steps + "
                 f"{per_call:.4g} s/layer/call * {calls} calls) (batch {batch}; per call: ({slope:.4g} - "
                 f"{steady:.4g}) * {new_tokens} probe tokens)"), \
        {"generate_whole_call_slope_s": whole, "generate_per_layer_call_s": per_call}


def _eager_generate(first: dict, grown: dict, extra: int, steps: int, batch: int) -> dict:
    """The greedy generation at 61 layers with transformers' eager generate's slope, where the
    grown section measured it (what a multi-GPU placement runs: GRAPHS_NOTE); {} otherwise."""
    slope = grown.get("transformers_generate_seconds_per_layer_step_by_batch", {}).get(str(batch))
    if slope is None:
        return {}
    return {"generate_eager_s": first.get("target_generate_s", 0.0) + extra * slope * steps,
            "generate_eager_formula": f"{first.get('target_generate_s', 0.0):.4g} + {extra} layers * {slope:.4g} "
                                      f"s/layer/step * {steps} steps (batch {batch}, transformers' generate)"}


def _eager_layer(grown: dict, batch: int) -> float | None:
    """s a layer a forward when the forward runs eagerly (a multi-GPU placement: GRAPHS_NOTE): the
    grown section's transformers-generate steady slope at `batch`, else its largest, else None."""
    by = grown.get("transformers_generate_steady_seconds_per_layer_step_by_batch") or {}
    got = by.get(str(batch))
    return got if got is not None else max((v for v in by.values() if v is not None), default=None)


def first_run_rate(load: dict) -> tuple[float, str]:
    """(bytes/s, which row) of the load a first run does: cold with the digest, else (a run
    from before that row existed) the load measured with the digest, else the plain one.
    Example: 15.5 GB, first-run load 8.4 s -> 1.85 GB/s."""
    if "first_run_bytes_per_s" in load:
        return load["first_run_bytes_per_s"], "first-run load: cold, content digest in the read"
    if "diag_cold_with_digest" in load and "checkpoint_bytes" in load:
        return (load["checkpoint_bytes"] / load["diag_cold_with_digest"]["seconds"],
                "cold load with the digest (diag_cold_with_digest)")
    return load["diag_cold_bytes_per_s"], "plain cold load: this run measured no first-run load"


def capture_microbatches(first: dict, token_budget: int) -> tuple[int, str]:
    """(microbatches of the teacher-forced pass, where the count comes from): the e2e run's
    count, else (a run from before it counted) ceil(tokens / budget), a lower bound since
    padding fills batches before the budget does. 41,693 tokens, budget 16384 -> 3."""
    if "target_capture_microbatches" in first:
        return int(first["target_capture_microbatches"]), "the e2e run's token-budget batches"
    return (max(1, math.ceil(first["tokens"] / token_budget)),
            f"estimated: ceil({first['tokens']} tokens / {token_budget} budget), the run did not count them")


def pipeline_section(first: dict, token_budget: int, sequential_s: float, stages: int = KIMI_GPUS) -> dict:
    """The capture pass as a GPipe pipeline over `stages` GPUs (module docstring)."""
    m, source = capture_microbatches(first, token_budget)
    return {"stages": stages, "microbatches": m, "microbatches_from": source,
            "bubble_fraction": bubble_fraction(stages, m), "capture_sequential_s": sequential_s,
            "capture_pipelined_s": pipelined_seconds(sequential_s, stages, m),
            "generation": ("as measured, stage after stage: the e2e run generates its batch whole "
                           "([placement] microbatches = 1); with microbatches = 8 its parts would pass "
                           "the 8 GPUs at once, at a per-microbatch decode cost this bench does not measure")}


def extrapolate(e2e: dict, grown: dict, load: dict, shard_bytes: list[int], *, batch: int = 16,
                gpu_memory: int | None = None, copy_bytes_per_s: float | None = None) -> dict:
    """e2e, grown, load: the benchmark's sections; batch: prompts per generation batch when
    the e2e run does not say (timings.target_generate_batch); the per-layer decode slope is
    the grown section's at that batch when it measured one."""
    k = e2e["layers"]
    first = e2e["first"]
    extra = KIMI_LAYERS - k
    total = kimi_bytes(shard_bytes)
    batch = int(first.get("target_generate_batch", batch))
    slope = grown.get("generate_seconds_per_layer_step_by_batch", {}).get(
        str(batch), grown["generate_seconds_per_layer_step"])
    calls = math.ceil(first["sequences"] / batch)
    steps = calls * e2e["max_new_tokens"]
    rate, rate_name = first_run_rate(load)
    load_61 = total / rate
    gen, gen_formula, gen_terms = generate_term(first, grown, extra, steps, calls, batch, slope)
    cap_seq = first.get("target_capture_s", 0.0) + extra * grown["capture_seconds_per_layer_token"] * first["tokens"]
    pipe = pipeline_section(first, e2e.get("token_budget", 16384), cap_seq)
    cap = pipe["capture_pipelined_s"]
    costs_61, other, costs_formula = _step_costs(first, grown, k)
    rest = first["checks_s"] + first["drafter_s"] + first["summary_s"] + first["report_s"] + other
    verdict = gen + cap + costs_61 + rest
    kimi_batch = kimi_generation_batch(first, e2e["max_new_tokens"], total, gpu_memory,
                                       e2e.get("token_budget", 16384))
    sampled = (sampled_extrapolation(e2e, round_cost(grown, slope, batch), verdict, total, sum(shard_bytes),
                                     copy_bytes_per_s, split=grown.get("expert_split"),
                                     eager_layer=_eager_layer(grown, batch), split_loop=_split_loop(grown, k))
               if "sampled_s" in first else None)
    terms = {"load_s": load_61, "generate_s": gen, "capture_s": cap, "step_costs_s": costs_61,
             "drafter_and_report_s": rest}
    return {
        "first_run_total_terms": " + ".join(f"{k[:-2]} {v:.1f}" for k, v in terms.items())
                                 + f" = {load_61 + verdict:.1f} s",
        "kimi_bytes": total, "load_s": load_61, "load_rate": rate_name, "generate_s": gen, "capture_s": cap,
        "step_costs_s": costs_61, "drafter_and_report_s": rest, "first_verdict_after_load_s": verdict,
        "first_verdict_without_step_costs_s": verdict - costs_61,
        "first_run_total_s": load_61 + verdict, "decode_steps": steps, "generation_batch": batch,
        "cached_seconds_per_variant": e2e["cached_seconds_per_variant"],
        "kimi_8gpu_generation_batch": kimi_batch, "pipeline": pipe, "graphs_note": GRAPHS_NOTE, **gen_terms,
        **_eager_generate(first, grown, extra, steps, batch),
        **({"sampled": sampled} if sampled else {}),
        "batch_note": ("Kimi on 8 GPUs would generate at the measured batch" if kimi_batch == batch
                       else "not computed: the run or the machine does not say" if kimi_batch is None
                       else f"Kimi on 8 GPUs would generate at batch {kimi_batch}, not the measured "
                            f"{batch}: its decode steps would be {math.ceil(first['sequences'] / kimi_batch)}"
                            f" x {e2e['max_new_tokens']}, at a slope not measured"),
        "formulas": {
            "kimi_bytes": f"{shard_bytes[0]} + 60 * {shard_bytes[1]} + {shard_bytes[-1]}",
            "load_s": f"{total:.4g} B / {rate:.4g} B/s ({rate_name})",
            "first_run_total_s": "load_s + generate_s + capture_s + step_costs_s + drafter_and_report_s",
            "generate_s": gen_formula,
            "capture_s": f"({first.get('target_capture_s', 0.0):.4g} + {extra} layers * "
                         f"{grown['capture_seconds_per_layer_token']:.4g} s/layer/token * {first['tokens']} tokens)"
                         f" * ({pipe['microbatches']} + {KIMI_GPUS - 1}) / ({KIMI_GPUS} * {pipe['microbatches']}): "
                         f"GPipe over {KIMI_GPUS} stages, {pipe['microbatches']} microbatches, bubble "
                         f"{pipe['bubble_fraction']:.3f}",
            "step_costs_s": costs_formula,
            "drafter_and_report_s": "checks + drafter + summary + report (+ target_s not in a timed "
                                    "phase: pass-cache writes, keys; not sampled_s, which `sampled` grows), "
                                    "as measured",
            "first_verdict_without_step_costs_s": "[speedup] measure = false, or the server's costs given"}}


def _split_loop(grown: dict, k: int) -> dict | None:
    """The grown section's split slope (round_slope.split_fit), its base's split MoE layers kept only
    where that base is as deep as the e2e run's target (the kept run's: _split_measured)."""
    loop = grown.get("split_round_slope")
    if loop and grown.get("base_layers") != k:
        return {**loop, "base_layers_split": None}
    return loop


SAMPLED_GOALS = {"first_sampled_verdict_after_load_s": 300.0, "further_sampled_variant_s": 10.0,
                 "further_sampled_variant_kept_s": 10.0,    # s, at most (the kept one: a run with one)
                 "further_sampled_variant_kept_split_s": 10.0}   # and experts split over the 8 GPUs


@dataclass(frozen=True)
class RoundCost:
    """What each added layer costs the decode loop: `a` s per round and `b` s per verified token
    (the line), `loop` s per decode loop (its prefill and captures; 0 when not measured), and,
    where the grown section measured the round at more than two sizes, `points` [[tokens, s], ...]
    that `per_layer_round` follows instead of the line (bench/round_slope.layer_round)."""
    a: float
    b: float
    source: str
    loop: float = 0.0
    points: tuple = ()

    @property
    def piecewise(self) -> bool:
        """Whether the points say more than the line (three sizes or more)."""
        return len(self.points) > 2

    def per_layer_round(self, tokens: float) -> float:
        from diag.bench.round_slope import layer_round

        return layer_round(self.points, tokens) if self.piecewise else self.a + self.b * tokens


def round_cost(grown: dict, decode_slope: float, batch: int) -> RoundCost:
    """The grown section's fit of the decode loop (bench/round_slope.py) when it made one (`loop`
    where it timed two lengths, `points` where it timed three sizes), else the greedy decode step's
    slope at the e2e's batch as a per round cost (b = 0: both read each layer's weights once per
    forward; the verify's rows x num_draft_tokens tokens exceed the step's batch, so where its
    kernels are not bound by weight reads this under-counts)."""
    fit = grown.get("sampled_round_slope") or {}
    if fit.get("seconds_per_layer_round") is not None:
        name = "the grown section's decode-loop fit (bench/round_slope.py)"
        cost = RoundCost(fit["seconds_per_layer_round"], fit["seconds_per_layer_verified_token"], name,
                         fit.get("seconds_per_layer_loop") or 0.0, tuple(tuple(p) for p in fit.get("points") or ()))
        if cost.piecewise:
            name += f", piecewise over {len(cost.points)} sizes"
        if fit.get("seconds_per_layer_loop") is not None:
            name += ", steady rounds and each loop's own costs"
        return replace(cost, source=name)
    why = f": no decode-loop fit ({fit['error']})" if fit.get("error") else " (no decode-loop fit in grown)"
    return RoundCost(decode_slope, 0.0, f"the greedy decode slope at batch {batch}{why}")


def sampled_extrapolation(e2e: dict, cost: RoundCost, greedy_verdict: float, kimi_total: float,
                          measured_bytes: float, copy_bytes_per_s: float | None = None, *,
                          split: dict | None = None, eager_layer: float | None = None,
                          split_loop: dict | None = None) -> dict:
    """The e2e run's sampled decoding (e2e.sampled_figures) at 61 layers on 8 GPUs.
    Layers: a round of the decode loop is one verify forward of its batch through every layer,
    stage after stage (no pipelining: a round waits for the last one's accept), plus the
    drafter's steps and the host's accept, which do not grow with depth. cost (round_cost): each
    added layer costs L(t) a round of t verified tokens (a + b t on the line; the fit's points
    where it measured three sizes) and c per decode loop (its prefill and graph captures; 0 when
    the fit has none); *_if_all_per_layer_s (every second of the loop grown by 61 / K) bracket it.
      sampled_61         = sampled_s + (61 - K) * (rounds * L(verified tokens / rounds) + c * decode loop(s))
    (on the line, rounds * L(tokens / rounds) = a * rounds + b * tokens; on the points, a run's mean
    round stands for its rounds, which over-counts a little where L bends down: L is concave)
      first verdict      = greedy verdict after the load (sampled_s excluded) + first run's sampled_61
      further variant    = the one-more-layout run as measured, less its load and decode,
                           + its decode at 61 layers + its load at 61 layers (the repeat run loads
                           the target again when a loop misses the sampled cache, at its measured
                           rate: load_s * kimi_bytes / measured checkpoint bytes)
      further variant kept = the same without the reload, from the run on the kept target
                           (_kept_variant: `diag run --watch`)
      ... and split    = the kept variant with each layer's experts split over the 8 GPUs
                           (`[placement] experts = "split"`): each added layer's round cost
                           less what one GPU's share saves (bench/expert_split.py, `split`,
                           the grown section's probe), _split_variant; where the grown section
                           timed the loop as one GPU of the split runs it (`split_loop`,
                           round_slope.split_fit), its eager per-layer round instead, as diag
                           runs a target over several GPUs (_split_measured)
    Worked example, K 2, a 3.49 ms, b 0: first run sampled_s 60 s over 1,200 rounds ->
    60 + 59 * 0.00349 * 1200 = 307.1 s; greedy verdict 216 s -> first sampled verdict 523.1 s
    (goal 300: not met). One more layout: 9 s over 180 rounds -> 9 + 59 * 0.00349 * 180 = 46.1 s;
    it loaded 15.5 GB in 4 s -> 4 * 599.5 / 15.5 = 154.7 s; 1.5 s of checks, replay and report
    -> 202.3 s (goal 10: not met). With b 20 us and 96,000 verified tokens the first run's loop
    gains 59 * 20e-6 * 96000 = 113.3 s more. With the device's copy bandwidth, `floors` gives the
    least the rounds could cost (round_floors)."""
    k, extra = e2e["layers"], KIMI_LAYERS - e2e["layers"]
    first, more = e2e["first"], e2e.get("one_more_layout", {})
    c = cost.loop

    def grown(run: dict) -> tuple[float, str]:
        rounds, tokens = run.get("sampled_rounds", 0), run.get("sampled_verified_tokens", 0)
        runs = run.get("sampled_decode_loops", 1) if rounds else 0        # the run's decode loops
        per_loop = f" + {c:.4g} s/layer/loop * {runs} decode loop(s)" if c else ""
        mean = tokens / max(rounds, 1)
        term = (f"{cost.per_layer_round(mean):.4g} s/layer/round at {mean:.0f} verified tokens a round * {rounds} rounds"
                if cost.piecewise else
                f"{cost.a:.4g} s/layer/round * {rounds} rounds + {cost.b:.4g} s/layer/token * {tokens} verified tokens")
        return (run.get("sampled_s", 0.0) + extra * (rounds * cost.per_layer_round(mean) + c * runs),
                f"{run.get('sampled_s', 0.0):.4g} + {extra} layers * ({term}{per_loop})")

    first_61, first_formula = grown(first)
    more_61, more_formula = grown(more)
    load = more.get("target_load_s", 0.0)
    reload_61 = load * kimi_total / measured_bytes
    rest = more.get("wall_s", 0.0) - more.get("sampled_s", 0.0) - load
    out = {"first_sampled_s": first_61, "first_rounds": first.get("sampled_rounds", 0),
           "first_seconds_per_round": first_61 / max(first.get("sampled_rounds", 0), 1),
           "first_sampled_if_all_per_layer_s": first.get("sampled_s", 0.0) * KIMI_LAYERS / k,
           "greedy_verdict_after_load_s": greedy_verdict,
           "first_sampled_verdict_after_load_s": greedy_verdict + first_61,
           "further_decode_s": more_61, "further_rounds": more.get("sampled_rounds", 0),
           "further_seconds_per_round": more_61 / max(more.get("sampled_rounds", 0), 1),
           "further_lanes_decoded": more.get("sampled_lanes", 0),
           "further_reload_s": reload_61, "further_rest_s": rest,
           "further_sampled_variant_s": rest + reload_61 + more_61,
           "further_decode_if_all_per_layer_s": more.get("sampled_s", 0.0) * KIMI_LAYERS / k,
           "slope": cost.source}
    out["terms"] = {"first_sampled_verdict_after_load_s": f"greedy verdict {greedy_verdict:.1f} + sampled "
                                                          f"{first_61:.1f} = {greedy_verdict + first_61:.1f} s",
                    "further_sampled_variant_s": f"checks, replay and report {rest:.1f} + reload {reload_61:.1f} "
                                                 f"+ decode {more_61:.1f} = {rest + reload_61 + more_61:.1f} s"}
    out["formulas"] = {"first_sampled_s": first_formula, "further_decode_s": more_formula,
                       "further_reload_s": f"{load:.4g} s * {kimi_total:.4g} B / {measured_bytes:.4g} B",
                       "further_rest_s": "the one-more-layout run's wall_s - sampled_s - target_load_s, as measured",
                       "first_sampled_if_all_per_layer_s": f"{first.get('sampled_s', 0.0):.4g} * 61 / {k}"}
    out.update(_kept_variant(e2e.get("one_more_layout_kept"), grown, out))
    out.update(_split_variant(e2e.get("one_more_layout_kept"), split, extra, out, cost.per_layer_round, eager_layer))
    measured = _split_measured(e2e.get("one_more_layout_kept"), split_loop, extra, out, cost.per_layer_round)
    out.update(measured)
    out["goals"] = {key: {"value": out[key], "limit": limit, "met": out[key] <= limit}
                    for key, limit in SAMPLED_GOALS.items() if key in out}
    split_goal = out["goals"].get("further_sampled_variant_kept_split_s")
    if measured:                                         # the loop timed as one GPU of the split runs it
        split_goal["note"] = measured["further_kept_split_not_measured"]
    elif out.get("further_kept_split_saving_capped"):    # an optimistic estimate decides nothing
        split_goal.update(met=None, undecided="a term capped: optimistic",
                          note="the split's saving was capped at the fit's layer-round less the shard's time: the "
                               "figure assumes the layer's other work gone, an optimistic estimate")
    elif split_goal and split_goal["met"]:               # a lower bound can miss the goal, never meet it
        split_goal.update(met=None, undecided="a lower bound: the GPUs' hand-off and launches not measured",
                          note="measured on one GPU: the hand-off between the GPUs and the other GPUs' launches "
                               "(a target over several GPUs runs eagerly, GRAPHS_NOTE) are not in the figure, "
                               "which can show the goal missed but not met; with each layer's round at least an "
                               "eager forward's: further_sampled_variant_kept_split_eager_s")
    if copy_bytes_per_s:
        out["floors"] = {"first": round_floors(out["first_rounds"], kimi_total, copy_bytes_per_s),
                         "further": round_floors(out["further_rounds"], kimi_total, copy_bytes_per_s)}
    return out


def _kept_variant(kept: dict | None, grown, out: dict) -> dict:
    """The further variant on the target the first run kept loaded (`diag run --watch`,
    e2e's one_more_layout_kept): no reload; its checks, replay and report as measured, its decode
    grown to 61 layers as the new-process run's. {} for an e2e run made before it existed.
      further_sampled_variant_kept_s = (wall_s - sampled_s - target_load_s) + sampled_61
    Worked example: 3.1 s of wall, 2.0 s of it the loop over 180 rounds, no load, a 3.49 ms
    slope -> 1.1 + (2.0 + 59 * 0.00349 * 180) = 40.2 s."""
    if not kept:
        return {}
    decode, formula = grown(kept)
    rest = kept.get("wall_s", 0.0) - kept.get("sampled_s", 0.0) - kept.get("target_load_s", 0.0)
    out["terms"]["further_sampled_variant_kept_s"] = (f"checks, replay and report {rest:.1f} + decode {decode:.1f} "
                                                      f"= {rest + decode:.1f} s (the target kept loaded)")
    out["formulas"]["further_kept_decode_s"] = formula
    return {"further_kept_decode_s": decode, "further_kept_rest_s": rest,
            "further_kept_rounds": kept.get("sampled_rounds", 0),
            "further_kept_targets": kept.get("target_kept", 0),
            "further_sampled_variant_kept_s": rest + decode}


def _split_variant(kept: dict | None, split: dict | None, extra: int, out: dict, layer_round=None,
                   eager_layer: float | None = None) -> dict:
    """The kept variant with every layer's experts split over the GPUs: its decode less, for
    each added layer and round, what the shard saves at the round's verified tokens
    (expert_split.saved), at most the fit's layer-round there (`layer_round(tokens)`) less the
    shard's own time: a layer's round cannot cost less than its experts' shard alone. {} without
    a kept run or a split probe.
      further_kept_split_decode_s = further_kept_decode_s - extra * rounds * min(saved, round - shard)
    Worked example: decode 42.3 s over 121 rounds of 45 tokens, 59 added layers, 2.45 ms saved a
    layer-round -> 42.3 - 59 * 121 * 0.00245 = 24.8 s. The twenty-eighth stop's H100: 64 tokens a
    round, the fit's layer-round 2.88 ms, all 384 experts under uniform routing 3.15 ms, a shard
    0.71 ms: saved 2.44 ms capped at 2.88 - 0.71 = 2.17 ms.
    `eager_layer` (s a layer a forward, the grown section's transformers-generate steady slope: an
    eager forward's launches, host-bound): a target over several GPUs runs eagerly (GRAPHS_NOTE), so
    beside the figure, each added layer's split round at least that:
      further_sampled_variant_kept_split_eager_s = the figure + extra * rounds * max(eager - split round, 0)
    Worked example: split round 0.91 ms, eager 2.40 ms, 59 x 121 -> + 10.6 s."""
    from diag.bench.expert_split import at, routing_of, saved

    if not kept or not split or not split.get("rows") or "further_kept_decode_s" not in out:
        return {"further_kept_split_note": (split or {}).get("error", "no split probe in the grown section")} \
            if kept else {}
    rounds = max(kept.get("sampled_rounds", 0), 1)
    per_round = kept.get("sampled_verified_tokens", 0) / rounds
    routing = routing_of(split)

    def cut(how: str | None) -> tuple[float, bool]:
        s = saved(split, per_round, how)
        cap = layer_round(per_round) - at(split, per_round, "shard_s", how) if layer_round else s
        return extra * rounds * max(min(s, cap), 0.0), cap < s
    taken, capped = cut(None)
    decode = max(out["further_kept_decode_s"] - taken, 0.0)
    rest = out["further_kept_rest_s"]
    out["terms"]["further_sampled_variant_kept_split_s"] = (
        f"checks, replay and report {rest:.1f} + decode {decode:.1f} = {rest + decode:.1f} s (kept, experts split "
        f"over {split['shards']} GPUs)")
    out["formulas"]["further_kept_split_decode_s"] = (
        f"{out['further_kept_decode_s']:.4g} - {extra} layers * {rounds} rounds * {taken / extra / rounds:.4g} s "
        f"saved a layer-round at {per_round:.0f} tokens ({routing} routing"
        + (f"; the probe's {saved(split, per_round):.4g} s capped at the fit's layer-round less the shard's time)"
           if capped else ")"))
    uniform = max(out["further_kept_decode_s"] - cut("uniform")[0], 0.0)
    eager = {}
    if eager_layer and layer_round:
        split_round = layer_round(per_round) - taken / extra / rounds
        more = extra * rounds * max(eager_layer - split_round, 0.0)
        eager = {"further_sampled_variant_kept_split_eager_s": rest + decode + more,
                 "further_kept_split_eager_layer_s": eager_layer}
        out["formulas"]["further_sampled_variant_kept_split_eager_s"] = (
            f"{rest + decode:.4g} + {extra} layers * {rounds} rounds * max({eager_layer:.4g} s eager a layer "
            f"(transformers' generate, steady) - {split_round:.4g} s split round, 0)")
    return {"further_kept_split_decode_s": decode, "further_sampled_variant_kept_split_s": rest + decode, **eager,
            "further_kept_split_routing": routing, "further_kept_split_saving_capped": capped,
            **({"further_sampled_variant_kept_split_uniform_routing_s": rest + uniform} if routing == "model" else {}),
            "further_kept_split_not_measured": "the hand-off between GPUs and the other devices' launches "
                                               "(one GPU measured: bench/expert_split.py)"}


def _split_measured(kept: dict | None, loop: dict | None, extra: int, out: dict, layer_round=None) -> dict:
    """The kept variant with every layer's experts split, from the decode loop timed as one GPU of
    the split runs it (round_slope.split_probe / split_fit: `loop`, per-layer rounds at its
    tokens): each added layer's round as diag runs a target over several GPUs, which becomes the
    split goal's figure: "program" (each GPU's graphs and the hand-off copies between them,
    target/device_program.py) where the probe ran it, else "eager" (a probe from before programs:
    GRAPHS_NOTE); the other modes beside it (..._eager_s, ..._graphs_s: one graph a step, a bound),
    and the estimate from the experts' saving as ..._subtracted_s. {} without a kept run or a slope.
    The kept run's own MoE layers are split too (Kimi's 60 all are): where the probe's base is the
    kept run's target (`loop["base_layers_split"]`, m of its K layers; extrapolate checks the
    depth), each of them costs the split round c instead of the unsplit one L(t) that its loop
    paid (`layer_round`, the decode-loop fit's at the run's verified tokens a round):
      further_sampled_variant_kept_split_s = rest + sampled_s (as measured, K layers)
                                             - m * rounds * (L(t) - c) + extra * rounds * c
    Worked example: rest 2.3 s, the kept run's loop 1.1 s, 59 added layers x 121 rounds at 2.1 ms
    a program's layer-round -> 2.3 + 1.1 + 15.0 = 18.4 s; at 0.9 ms graphed -> 9.8 s; with its one
    MoE layer at L 3.76 ms split as well -> 9.8 - 121 * (3.76 - 0.9) ms = 9.49 s."""
    main = "program" if loop and loop.get("program") else "eager"
    if not kept or not loop or not loop.get(main) or "further_kept_rest_s" not in out:
        return {}
    rounds, rest, own = kept.get("sampled_rounds", 0), out["further_kept_rest_s"], kept.get("sampled_s", 0.0)
    tokens = kept.get("sampled_verified_tokens", 0) / max(rounds, 1)
    m = int(loop.get("base_layers_split") or 0) if layer_round else 0
    unsplit = layer_round(tokens) if m else 0.0
    how = SPLIT_HOW[main]
    got = {"further_sampled_variant_kept_split_subtracted_s": out.get("further_sampled_variant_kept_split_s"),
           "further_kept_split_from": (f"the decode loop with each layer as one GPU of {loop['shards']} runs it "
                                       f"(bench/round_slope.split_probe), {how}"),
           "further_kept_split_mode": main, "further_kept_split_loop_tokens": loop["tokens"],
           "further_kept_split_own_layers": m}
    for mode in ("program", "eager", "graphs"):
        if loop.get(mode):
            key = "further_sampled_variant_kept_split" + ("" if mode == main else f"_{mode}") + "_s"
            got[key] = rest + own - m * rounds * (unsplit - loop[mode]) + extra * rounds * loop[mode]
            got[f"further_kept_split_{mode}_layer_round_s"] = loop[mode]
            own_split = (f" - {m} own MoE layer(s) * {rounds} rounds * ({unsplit:.4g} unsplit - {loop[mode]:.4g} "
                         f"split) s" if m else "")
            out["formulas"][key] = (f"{rest:.4g} rest + {own:.4g} s the kept run's loop{own_split} + {extra} layers * "
                                    f"{rounds} rounds * {loop[mode]:.4g} s a layer-round ({mode}, one GPU of "
                                    f"{loop['shards']}, measured at {loop['tokens']:.0f} tokens a round; the run's "
                                    f"{tokens:.0f})")
    out["terms"]["further_sampled_variant_kept_split_s"] = (
        f"checks, replay and report {rest:.1f} + decode {got['further_sampled_variant_kept_split_s'] - rest:.1f} = "
        f"{got['further_sampled_variant_kept_split_s']:.1f} s (kept, experts split over {loop['shards']} GPUs, "
        f"{how}: the loop measured as one GPU of them runs it)")
    got["further_kept_split_not_measured"] = (
        "one GPU of the split measured: its host issues every shard's launches and hand-off copies (as graph "
        "replays and copies in a program), its device runs the slowest shard's pairs (captured, the other shards' "
        "kernels are one stand-in kernel each: they run on their own GPUs); the copies' NVLink time (some 10 us a "
        "layer-round) and the devices' waits on each other are not in it")
    return got


SPLIT_HOW = {"program": "the target's steps replayed as programs (each GPU's graphs, the hand-offs between them)",
             "eager": "the target eager (as diag ran a target over several GPUs before programs)"}


def round_floors(rounds: int, kimi_total: float, copy_bytes_per_s: float, gpus: int = KIMI_GPUS) -> dict:
    """The least `rounds` verify rounds can cost on Kimi: each reads the checkpoint's bytes once
    (at these batches every routed expert is reached: rows x D x 8 picks over 384 experts,
    1 - (1 - 1/384)^(64 x 4 x 8) = 0.995), at the device's copy bandwidth. stage_after_stage:
    diag's placement, one GPU reading its layers while the others wait (a round's accept needs
    the last layer before the next round can start); all_gpus: the 8 GPUs reading their share of
    every layer at once, what tensor parallelism reaches (as servers run Kimi). Pipelining
    several loops over the stages does not lower one loop's floor: a round bound by weight reads
    reads a stage's weights whatever its rows, so splitting one loop's rows into microbatches
    multiplies the reads; loops of other variants in flight share the stages as rows of one loop
    share a verify (DecodeLoop's trees in one loop do that already).
    Worked example: 120 rounds, 594 GB, 3.0 TB/s -> 23.8 s stage after stage, 2.97 s on all 8."""
    one = kimi_total / copy_bytes_per_s
    return {"rounds": rounds, "seconds_per_round_stage_after_stage": one,
            "stage_after_stage_s": rounds * one, "all_gpus_s": rounds * one / gpus,
            "formula": f"{rounds} rounds * {kimi_total:.4g} B / {copy_bytes_per_s:.4g} B/s (/ {gpus} on all GPUs)"}
