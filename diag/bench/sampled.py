"""Sampled-decoding benchmark: the speculative decode loop (diag.replay.decode_loop) on a target,
3 layouts x the tree shapes, batched over the prompts, at temperature 1.0 / top-p 0.95.

Per tree shape it reports
  tokens_per_second      continuation tokens emitted by the loop per second (all lanes)
  pass_tokens_per_second the teacher-forced capture pass over the same decoded sequences
  cost_in_passes         seconds of one sampled evaluation (one layout x tree, all prompts, one
                         seed) / seconds of one teacher-forced pass over its sequences; the goal
                         is <= num_draft_tokens (one verify of D tokens per emitted token at worst)
  cost_in_passes_cpu     the same ratio of this process's CPU seconds (steadier on a shared machine)
  seconds                the loop's wall, timed without a profile (the host prepares a step while
                         the device runs the last, as in a run), after the same loop run once
                         whole (first_loop_seconds; first_loop_compiles: the Triton compiles a
                         process pays once; timed_compiles: none, else the timing is not steady)
  phases                 where the loop's time goes: prefill, draft, verify_forward, accept
                         (probabilities, the tree walk, the exact expectation), commit, retire; from
                         the same loop run again with CUDA synchronised around each phase, which
                         takes that overlap away: profiled_seconds, their sum and more
                         (profiled_same_decode: both decoded alike)
  limit                  the phase that takes the most time
  <step>_graphs          each step's CUDA graphs (decode_loop.GRAPHED: draft, verify, accept, the
                         target cache's commit, the drafter's extend): buckets captured, rounds replayed, failure
  accept_pivots_deeper   rounds whose accept graph found a top-p pivot past its window (each then
                         accepted again without the graph)
  verify_*               the verify forward against the bytes it must move per round: the target's
                         weights read once (all but the input embedding, of which it gathers rows,
                         and the head, which the accept step applies at the nodes it reads), and the
                         KV cache its attention reads (B rows x the cache's width);
                         verify_bytes_per_second = those bytes over the phase's seconds.
                         verify_bandwidth() sets them against a measured copy bandwidth: the
                         fraction and the shape's physical limit per round, one number
                         (max(bytes / bandwidth, FLOP / peak)) and module by module
                         (`roofline`: verify_modules, [count, bytes, FLOP] a round).
A random-weight target accepts little, so the loop runs close to one round per token: the
worst case for the loop's cost. This module knows the loop and timing; nothing about files.
"""

from __future__ import annotations

import time

import torch

from diag.bench.common import sync
from diag.bench.compiles import compiles
from diag.engines.decoding import sampled
from diag.int4.packed import resident_bytes
from diag.int4.routing import routed_eagerly
from diag.layouts import CapturePoint, layout, union_points
from diag.replay.decode_loop import GRAPHED, DecodeLoop
from diag.replay.decode_rows import Lane
from diag.replay.replay import Variant
from diag.target.passes import Sequence, run_capture
from diag.trees import tree_shape

TREES = ("chain-1", "chain-3", "chain-5", "s3-k4-d5", "s3-k4-d8", "s3-k8-d16")
DECODING = sampled(1.0, 0.95)
PASS_REPEATS = 3                     # the teacher-forced pass timed this many times, the fastest kept
RANGES = ("diag.", "ProfilerStep")   # the profiler's ranges (the loop's phases, its steps): on CUDA they
                                     # carry their kernels' device time again, so busy time leaves them out


def bench_loop(model, drafter, embed, head, layouts: list[str], shape, num_prompts: int, *,
               decoding=DECODING, profile: bool | str = False):
    """A fresh decode loop over one lane per layout (seed 0) and its rows, every lane on every
    prompt: (loop, lanes, rows). 3 layouts x 32 prompts -> 96 rows."""
    lanes = [Lane(Variant(name, "eagle3", shape, decoding=decoding.name), 0) for name in layouts]
    loop = DecodeLoop(model, drafter, embed, head, lanes, {n: layout(n) for n in layouts}, shape, decoding,
                      eos_ids=set(), profile=profile)
    return loop, lanes, [(li, p) for li in range(len(lanes)) for p in range(num_prompts)]


def _one_tree(model, drafter, embed, head, lays, shape, prompts, max_new, token_budget) -> dict:
    """One tree's loop against the teacher-forced pass over the tokens it decoded, each after a
    warm-up. On CUDA the loop's warm-up is the same loop run whole first (first_loop_seconds): its
    first calls compile what the timed loop would otherwise compile (first_loop_compiles: Triton's
    kernels for each specialisation met, e.g. a token count first met as rows retire, which a
    warm-up of a few rounds never reached: the H100 timed chain-1's loop at 1.91 s and the same
    loop again at 0.97 s); timed_compiles says whether the timed loop compiled anything. A process
    pays those compiles once, not each variant. Elsewhere (nothing is compiled) a few rounds of the
    same rows, first_loop_seconds then None. The timed loop's graphs' captures are its
    own, counted in verify_graphs.capture_s. The pass, a tenth of a second on the H100, is timed
    PASS_REPEATS times and the fastest kept: one timing of it moved chain-3's cost by a third
    between two runs of the same code (0.100 s, 0.150 s)."""
    warm, _, rows = bench_loop(model, drafter, embed, head, lays, shape, len(prompts))
    whole = warm.dev.type == "cuda"
    sync()
    t0 = time.perf_counter()
    with compiles() as first:
        warm.run(prompts, rows, max_new if whole else min(max_new, 2 * shape.num_steps + 2))
        sync()
    first_s = time.perf_counter() - t0 if whole else None
    timed, lanes, rows = bench_loop(model, drafter, embed, head, lays, shape, len(prompts))
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    with compiles() as again:
        out = timed.run(prompts, rows, max_new)
        sync()
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    loop, _, _ = bench_loop(model, drafter, embed, head, lays, shape, len(prompts), profile=True)
    t2 = time.perf_counter()
    profiled = loop.run(prompts, rows, max_new)             # the phases: CUDA synchronised around each
    profiled_s = time.perf_counter() - t2
    emitted = sum(len(o.ids) - len(prompts[o.prompt]) for o in out)
    seqs = [Sequence(f"r{i}", "bench", len(prompts[o.prompt]), torch.tensor(o.ids)) for i, o in enumerate(out)
            if o.lane is lanes[0]]
    points = tuple(dict.fromkeys(union_points([layout(n) for n in lays]) + (CapturePoint("final"),)))
    run_capture(model, seqs[:2], points, regime="bench", token_budget=token_budget, progress=False)  # warm-up
    passes = []                                            # (wall, cpu) of each pass; the fastest is kept
    for _ in range(PASS_REPEATS):
        sync()
        t1, c1 = time.perf_counter(), time.process_time()
        run_capture(model, seqs, points, regime="bench", token_budget=token_budget, progress=False)
        sync()
        passes.append((time.perf_counter() - t1, time.process_time() - c1))
    pass_s, pass_cpu = min(passes)
    pass_tokens = sum(len(s.ids) for s in seqs)
    rounds = sum(len(o.accepted) for o in out)
    phases = {k: round(v, 4) for k, v in loop.seconds.items()}
    verify = _verify_bytes(model, head, loop, phases.get("verify_forward"))
    return {"tree": shape.name, "num_draft_tokens": shape.num_draft_tokens, "lanes": len(lanes),
            "rows": len(rows), "seconds": seconds, "profiled_seconds": profiled_s,
            "first_loop_seconds": first_s, "first_loop_compiles": first.to_dict(),
            "timed_compiles": again.to_dict(),
            "profiled_same_decode": [(o.accepted, o.ids) for o in profiled] == [(o.accepted, o.ids) for o in out],
            "emitted_tokens": emitted,
            "tokens_per_second": emitted / seconds, "loop_rounds": loop.counts["rounds"],
            "verified_tokens": loop.counts["verified_tokens"],
            "accept_length": (emitted / rounds) if rounds else None,
            "pass_seconds": pass_s, "pass_seconds_all": [w for w, _ in passes], "pass_tokens": pass_tokens, "pass_tokens_per_second": pass_tokens / pass_s,
            "cost_in_passes": seconds / len(lanes) / pass_s,
            "cpu_seconds": cpu_s, "pass_cpu_seconds": pass_cpu, "cost_in_passes_cpu": cpu_s / len(lanes) / pass_cpu,
            "goal_met": seconds / len(lanes) / pass_s <= shape.num_draft_tokens,
            "phases": phases, "limit": max(phases, key=phases.get) if phases else None,
            **{f"{step}_graphs": _graphs(loop, step) for step in GRAPHED},     # the profiled loop's (its phases')
            "accept_pivots_deeper": loop.counts.get("accept_pivots_deeper", 0), **verify}


def _graphs(loop: DecodeLoop, name: str = "verify") -> dict | None:
    """What the CUDA graphs of a round's step did (name: one of decode_loop.GRAPHED) (target/verify_graphs.py):
    buckets captured, calls replayed, calls run eagerly, why they were turned off if they were;
    None off CUDA."""
    got = {k[len(name) + 8:]: v for k, v in loop.counts.items() if k.startswith(f"{name}_graphs_")}
    failure = loop.graph_failures.get(name)
    return {**got, "failure": failure} if got or failure else None


def _verify_bytes(model, head, loop: DecodeLoop, verify_s: float | None) -> dict:
    """Bytes per verify round (the weights it multiplies by, the KV it reads) and their rate over
    the phase. Example: 10.8e9 B of weights + 0.04e9 B of KV in 60 ms -> 1.8e11 B/s."""
    rounds = loop.counts["rounds"]
    if not rounds:
        return {}
    weights = resident_bytes(model) - _bytes(model.get_input_embeddings().weight) - _bytes(head.weight)
    kv = loop.counts["kv_bytes"] / rounds
    out = {"verify_seconds_per_round": verify_s / rounds if verify_s else None,
           "weight_bytes_per_round": weights, "kv_bytes_per_round": kv, "verify_bytes_per_round": weights + kv,
           "verify_flops_per_round": 2 * active_params(model, without=head) * loop.counts["verified_tokens"] / rounds,
           "verify_modules": module_costs(model, loop.counts["verified_tokens"] / rounds, without=head)}
    if verify_s:
        out["verify_bytes_per_second"] = (weights + kv) * rounds / verify_s
    return out


def replay_seconds_per_round(row: dict) -> float | None:
    """A row's verify seconds a replayed round: the verify phase less its graphs' captures (each
    bucket's first call, its warm-up and capture, whose outputs are that round's: VerifyGraphs.run,
    `verify_graphs.capture_s`), over the rounds that replayed. None where a round ran neither.
    Example: 0.60 s of verify over 62 rounds, 5 of them captures taking 0.27 s -> 0.33 s over 57
    replayed rounds, 5.8 ms a round (9.7 with the captures)."""
    g, verify_s = row.get("verify_graphs") or {}, (row.get("phases") or {}).get("verify_forward")
    rounds, replayed = row.get("loop_rounds"), g.get("replayed", 0)
    if not verify_s or not replayed or g.get("failure") or replayed + g.get("captured", 0) != rounds:
        return None
    return max(verify_s - g.get("capture_s", 0.0), 0.0) / replayed or None


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def active_params(model, *, without=None) -> int:
    """Weights one token multiplies: every Linear and PackedLinear but the module `without` (the
    input embedding is gathered, never multiplied), and of each PackedExperts its top-k experts'
    three matrices. Kimi's MoE layer: 8 x 3 x 2048 x 7168 = 352e6 routed, of 8.5e9 stored."""
    from torch import nn

    from diag.int4.packed import PackedExperts, PackedLinear

    top_k = int(getattr(model.config, "num_experts_per_tok", 1) or 1)
    total = 0
    for m in model.modules():
        if m is without:
            continue
        if isinstance(m, nn.Linear):
            total += m.weight.numel()
        elif isinstance(m, PackedLinear):
            total += m.in_features * m.out_features
        elif isinstance(m, PackedExperts):
            total += top_k * 3 * m.intermediate_dim * m.hidden_dim
    return total


def module_costs(model, tokens: float, *, without=None) -> list[list[float]]:
    """[count, bytes, FLOP] a round, for each kind of module a verify of `tokens` tokens multiplies
    by (active_params' modules, the same ones once: count): its weights' resident bytes, read
    once, and 2 x the weights one token multiplies x tokens; a PackedExperts' bytes are every
    expert's (each is reached at a verify's tokens), its FLOP its top-k's. Kimi's MoE layer at
    1536 tokens: [1, 9.51e9, 1.08e12]."""
    from collections import Counter

    from torch import nn

    from diag.int4.packed import PackedExperts, PackedLinear

    top_k = int(getattr(model.config, "num_experts_per_tok", 1) or 1)
    kinds: Counter = Counter()
    for m in model.modules():
        if m is without:
            continue
        if isinstance(m, nn.Linear):
            kinds[(_bytes(m.weight), m.weight.numel())] += 1
        elif isinstance(m, PackedLinear):
            own = sum(_bytes(b) for b in m.buffers(recurse=False))
            kinds[(own, m.in_features * m.out_features)] += 1
        elif isinstance(m, PackedExperts):
            own = sum(_bytes(b) for b in m.buffers(recurse=False))
            kinds[(own, top_k * 3 * m.intermediate_dim * m.hidden_dim)] += 1
    return [[n, b, 2 * w * tokens] for (b, w), n in sorted(kinds.items())]


def roofline(row: dict, copy_bytes_per_s: float, flops_per_s: float) -> dict:
    """The least a row's verify round can take, module by module (`verify_modules`): each module
    the larger of its bytes over the copy bandwidth and its FLOP over the matmul peak (a verify
    runs its modules one after another, so one's spare compute does not hide another's reads),
    plus the round's other bytes (norms, the KV it attends over) over the bandwidth; what the
    flops-bound modules take of it; and the share of this limit that the bandwidth goal asks
    for: to read its bytes at half the copy bandwidth the round must take 2 x bytes / bandwidth.
    The one-number limit (verify_limit_seconds_per_round: max(all bytes, all FLOP)) counts a
    compute-bound module's time as hidden behind the others' reads. Worked example, a round of
    10.8 GB at 3.0 TB/s and 768 TFLOP/s with two modules: experts of 9.51 GB and 1.082 TFLOP
    (3.17 ms, not 1.41), a dense MLP of 0.793 GB and 1.218 TFLOP (1.59 ms, not 0.26), the other
    0.497 GB 0.17 ms -> 4.92 ms, 1.59 of it flops-bound; half the bandwidth means 7.2 ms, so
    the goal asks for 0.68 of the roofline."""
    mods = row.get("verify_modules")
    if not mods or not flops_per_s:
        return {}
    each = [(n, b / copy_bytes_per_s, f / flops_per_s) for n, b, f in mods]
    covered = sum(n * b for n, b, _ in mods)
    rest = max(row["verify_bytes_per_round"] - covered, 0) / copy_bytes_per_s
    limit = sum(n * max(b, f) for n, b, f in each) + rest
    out = {"verify_roofline_seconds_per_round": limit,
           "verify_roofline_flops_bound_seconds": sum(n * f for n, b, f in each if f > b),
           "verify_bandwidth_goal_share_of_roofline": limit / (2 * row["verify_bytes_per_round"] / copy_bytes_per_s)}
    if row.get("verify_seconds_per_round"):
        out["verify_fraction_of_roofline"] = limit / row["verify_seconds_per_round"]
    return out


def verify_bandwidth(section: dict, copy_bytes_per_s: float, flops_per_s: float | None = None) -> dict:
    """Each row's verify rate as a fraction of the device's measured copy bandwidth (goal >= 0.5)
    and the shape's physical limit per round: its bytes over the bandwidth or, where larger, its
    multiplies over the measured bf16 matmul peak (a wide tree at 96 rows multiplies more than it
    reads: s3-k8-d16 at Kimi's widths, 1536 tokens x 2 x 0.9e9 weights = 2.8e12 FLOP, ~4 ms,
    against 10.8 GB read, ~2.6 ms); the section's worst fraction. Where the verify ran from CUDA
    graphs, the same fraction once they are captured (`replay_seconds_per_round`): what a loop
    long enough to repay its captures tends to."""
    fractions, steady = [], []
    for row in section["rows"]:
        if row.get("verify_bytes_per_second"):
            row["verify_fraction_of_copy_bandwidth"] = row["verify_bytes_per_second"] / copy_bytes_per_s
            row["verify_bytes_limit_seconds_per_round"] = row["verify_bytes_per_round"] / copy_bytes_per_s
            flops_s = row["verify_flops_per_round"] / flops_per_s if flops_per_s else 0.0
            row["verify_flops_limit_seconds_per_round"] = flops_s or None
            row["verify_limit_seconds_per_round"] = max(row["verify_bytes_limit_seconds_per_round"], flops_s)
            row["verify_bound_by"] = "flops" if flops_s > row["verify_bytes_limit_seconds_per_round"] else "bytes"
            row["verify_fraction_of_limit"] = row["verify_limit_seconds_per_round"] / row["verify_seconds_per_round"]
            row.update(roofline(row, copy_bytes_per_s, flops_per_s))
            fractions.append(row["verify_fraction_of_copy_bandwidth"])
            replay = replay_seconds_per_round(row)
            if replay:
                row["verify_replay_seconds_per_round"] = replay
                row["verify_replay_fraction_of_copy_bandwidth"] = row["verify_bytes_per_round"] / replay / copy_bytes_per_s
                steady.append(row["verify_replay_fraction_of_copy_bandwidth"])
    if fractions:
        section["verify_fraction_of_copy_bandwidth_min"] = min(fractions)
    roof = [r["verify_fraction_of_roofline"] for r in section["rows"] if "verify_fraction_of_roofline" in r]
    if roof:
        section["verify_fraction_of_roofline_min"] = min(roof)
    if steady:
        section["verify_replay_fraction_of_copy_bandwidth_min"] = min(steady)
        section["copy_bytes_per_s"] = copy_bytes_per_s
        section["bf16_matmul_flops"] = flops_per_s
    return section


@torch.no_grad()
def sampled_bench(model, drafter, embed, head, layouts: list[str], prompts: list[list[int]], *,
                  max_new_tokens: int, token_budget: int, trees=TREES, partial=None) -> dict:
    """The loop on every tree shape; rows = len(layouts) x len(prompts) per shape. partial, if
    given, receives the rows measured so far after each tree (a device call cut at its limit
    keeps them)."""
    rows = []
    for t in trees:
        rows.append(_one_tree(model, drafter, embed, head, layouts, tree_shape(t), prompts, max_new_tokens,
                              token_budget))
        if partial is not None and len(rows) < len(trees):
            partial({"decoding": DECODING.name, "layouts": layouts, "rows": list(rows),
                     "incomplete": f"{len(trees) - len(rows)} of {len(trees)} trees not measured"})
    worst = max(rows, key=lambda r: r["cost_in_passes"] / r["num_draft_tokens"])
    return {"decoding": DECODING.name, "layouts": layouts, "prompts": len(prompts),
            "max_new_tokens": max_new_tokens, "rows": rows,
            "worst_cost_over_draft_tokens": worst["cost_in_passes"] / worst["num_draft_tokens"],
            "all_goals_met": all(r["goal_met"] for r in rows),
            "tokens_per_second": sum(r["emitted_tokens"] for r in rows) / sum(r["seconds"] for r in rows)}


def round_profile(model, drafter, embed, head, layouts: list[str], prompts: list[list[int]], tree: str,
                  max_new_tokens: int = 32, rounds: int = 8, top: int = 10) -> dict:
    """Where a round's time goes: the loop under torch.profiler over `rounds` rounds after its
    prefill and one more round (both left out: the prefill is no round, and a first round pays
    first calls). Per phase (DecodeLoop's "diag.<phase>" ranges, CUDA synchronised around each)
    per round: host_ms, the wall of the phase; device_ms, the kernels it launched; launches.
    Over the window: the device's busy seconds against the wall (far below 1: a loop bound by
    the host, by launches and syncs, not by the device), launches per round, and the `top` ops
    by their own device time. On the CPU the device figures are None. The MoE routing runs its
    kernels inside the profile (int4/routing.routed_eagerly): no routing graph is replayed there."""
    from torch.profiler import ProfilerActivity, profile, schedule

    shape = tree_shape(tree)
    cuda = next(drafter.parameters()).device.type == "cuda"
    warm, _, rows = bench_loop(model, drafter, embed, head, layouts, shape, len(prompts))
    warm.run(prompts, rows, 2)                                              # first calls of every shape
    loop, _, rows = bench_loop(model, drafter, embed, head, layouts, shape, len(prompts), profile=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    marks: list[float] = []
    with routed_eagerly(), profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=rounds,
                                                                  repeat=1)) as prof:
        def step():
            sync()
            marks.append(time.perf_counter())
            prof.step()
        loop.on_step = step
        loop.run(prompts, rows, max_new_tokens)
    window = marks[2:2 + rounds + 1]               # the active steps' bounds: prefill, warm-up round left out
    n = len(window) - 1
    if n < 1:
        raise ValueError(f"round_profile({tree}): {loop.counts['rounds']} rounds, too few for a window; "
                         f"raise max_new_tokens ({max_new_tokens})")
    wall = window[-1] - window[0]
    phases: dict[str, dict] = {}
    for e in prof.events():
        if e.name.startswith("diag.") and "CPU" in str(getattr(e, "device_type", "CPU")):
            ph = phases.setdefault(e.name[5:], {"host_ms": 0.0, "device_ms": 0.0, "launches": 0})
            ph["host_ms"] += e.cpu_time_total / 1e3 / n
            ph["device_ms"] += _device_us(e, total=True) / 1e3 / n
            ph["launches"] += _launches(e) / n
    for ph in phases.values():
        ph.update({k: round(v, 3) for k, v in ph.items()})
        if not cuda:
            ph["device_ms"] = ph["launches"] = None
    ops = [e for e in prof.key_averages()                           # kernels, copies, sets: device work
           if _device_us(e) > 0 and not e.key.startswith(RANGES)]          # (not the ranges around them)
    busy = sum(_device_us(e) for e in ops) / 1e6 if cuda else None
    launches = sum(e.count for e in ops) if cuda else None
    return {"tree": tree, "rounds": n, "rows": len(rows), "wall_s_per_round": wall / n,
            "device_busy_s_per_round": busy / n if cuda else None,
            "device_busy_fraction": busy / wall if cuda and wall else None,
            "launches_per_round": launches / n if cuda else None, "phases": phases,
            "top_ops": [{"op": e.key[:80], "device_ms_per_round": round(_device_us(e) / 1e3 / n, 3),
                         "calls_per_round": round(e.count / n, 1)}
                        for e in sorted(ops, key=_device_us, reverse=True)[:top]]}


def verify_profile(model, drafter, embed, head, layouts: list[str], prompts: list[list[int]], tree: str,
                   max_new_tokens: int = 24, rounds: int = 4, top: int = 12) -> dict:
    """Where the verify forward's own time goes, which the round profile cannot show (a graph's
    replay is one launch to the profiler): the same loop verifying eagerly on fixed widths, its
    kernels inside "diag.verify_forward" over `rounds` rounds after a warm-up loop and one round.
    Per round: the verify's wall, its kernels' device time and count, and the `top` kernels by
    device time, each with its share of the verify's device time. Worked example: a verify of
    11.6 ms whose kernels take 9 ms, 4 ms of them the experts' GEMM, spends 2.6 ms between kernels
    and 5 ms in kernels other than the experts. CUDA only (None elsewhere). The routing runs its
    kernels (int4/routing.routed_eagerly), counted among the verify's. Kernels are found through the
    ops that launched them: Triton's launches (the experts' fused GEMMs) are no torch op, so the
    profiler links them to no range and they are missing here (H100, torch 2.11: chain-1's verify
    showed 1.7 ms of kernels against 4.8 ms replayed); the experts' own timings are the experts and
    grown sections'."""
    from torch.profiler import ProfilerActivity, profile, schedule

    if next(drafter.parameters()).device.type != "cuda":
        return {"tree": tree, "device": None}
    shape = tree_shape(tree)
    warm, _, rows = bench_loop(model, drafter, embed, head, layouts, shape, len(prompts))
    warm.cuda_graphs, warm.fixed_width = False, True
    warm.run(prompts, rows, 4)                                              # first calls of every shape
    loop, _, rows = bench_loop(model, drafter, embed, head, layouts, shape, len(prompts), profile=True)
    loop.cuda_graphs, loop.fixed_width = False, True
    kernels: dict[str, list[float]] = {}
    wall = 0.0
    with routed_eagerly(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                   schedule=schedule(wait=1, warmup=1, active=rounds, repeat=1)) as prof:
        loop.on_step = prof.step
        loop.run(prompts, rows, max_new_tokens)
    n = 0
    for e in prof.events():
        if e.name == "diag.verify_forward" and "CPU" in str(getattr(e, "device_type", "CPU")):
            n += 1
            wall += e.cpu_time_total / 1e3
            for name, us in _kernels_under(e):
                k = kernels.setdefault(name[:80], [0.0, 0])
                k[0] += us / 1e3
                k[1] += 1
    if not n:
        raise ValueError(f"verify_profile({tree}): no verify in the profiled window; raise max_new_tokens")
    device_ms = sum(ms for ms, _ in kernels.values())
    return {"tree": tree, "rows": len(rows), "rounds": n, "verify_wall_ms_per_round": round(wall / n, 3),
            "verify_device_ms_per_round": round(device_ms / n, 3),
            "verify_kernels_per_round": round(sum(c for _, c in kernels.values()) / n, 1),
            "top_kernels": [{"kernel": k, "device_ms_per_round": round(ms / n, 3), "calls_per_round": round(c / n, 1),
                             "share": round(ms / device_ms, 3) if device_ms else None}
                            for k, (ms, c) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]]}


def _kernels_under(e):
    """(kernel name, device microseconds) of every kernel launched inside a profiler range."""
    for k in getattr(e, "kernels", []) or []:
        yield k.name, float(k.duration)
    for c in getattr(e, "cpu_children", []) or []:
        yield from _kernels_under(c)


def graphs_ab(model, drafter, embed, head, layouts: list[str], prompts: list[list[int]], tree: str,
              max_new_tokens: int = 32) -> dict:
    """The loop with every step of a round from CUDA graphs (decode_loop.GRAPHED) against the same
    loop running them eagerly (on fixed widths), timed after a warm-up of each: seconds a round either way, eager
    over graphs (speedup), and whether both decoded the same (they must: the graphs replay the same
    kernels). A loop captures its own graphs (its caches' buffers are its own), so the graphs' time
    is given with and without the captures, every step's (`graphs_replay_s_per_round`,
    `replay_speedup`: what a loop long enough to repay them tends to). Off CUDA no graph is made;
    both arms then run eagerly."""
    got = {}
    for name, graphs in (("eager", False), ("graphs", True)):
        for _ in ("warm-up", "timed"):                               # the last loop's time is kept
            loop, _, rows = bench_loop(model, drafter, embed, head, layouts, tree_shape(tree), len(prompts))
            loop.cuda_graphs, loop.fixed_width = graphs, True
            sync()
            t0 = time.perf_counter()
            out = loop.run(prompts, rows, max_new_tokens)
            sync()
            seconds = time.perf_counter() - t0
        got[name] = {"s_per_round": seconds / max(1, loop.counts["rounds"]), "rounds": loop.counts["rounds"],
                     "decoded": [(d.accepted, d.ids) for d in out],
                     **{f"{step}_graphs": _graphs(loop, step) for step in GRAPHED}}
    e, g = got["eager"], got["graphs"]
    capture = sum((g[f"{step}_graphs"] or {}).get("capture_s", 0.0) for step in GRAPHED)
    replay = max(g["s_per_round"] - capture / max(1, g["rounds"]), 1e-9)
    return {"tree": tree, "rows": len(rows), "rounds": g["rounds"], "eager_s_per_round": e["s_per_round"],
            "graphs_s_per_round": g["s_per_round"], "speedup": e["s_per_round"] / g["s_per_round"],
            "graphs_replay_s_per_round": replay, "replay_speedup": e["s_per_round"] / replay,
            "same_decode": e["decoded"] == g["decoded"], **{f"{step}_graphs": g[f"{step}_graphs"] for step in GRAPHED}}


def _device_us(e, total: bool = False) -> float:
    """An event's device microseconds, its own (or with its children's: total), by the names
    torch has used for them."""
    names = ("device_time_total", "cuda_time_total") if total else ("self_device_time_total", "self_cuda_time_total")
    for name in names:
        if hasattr(type(e), name) or name in getattr(e, "__dict__", {}):
            return float(getattr(e, name) or 0.0)
    return 0.0


def _launches(e) -> int:
    """Kernels launched inside a profiler range: its own and its children's."""
    return len(getattr(e, "kernels", []) or []) + sum(_launches(c) for c in getattr(e, "cpu_children", []) or [])


def bench_prompts(n: int, prompt_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n random prompts of prompt_len ids (stand-ins for a prompt set)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, prompt_len), generator=g).tolist()
