"""Where an unsynchronised sampled round leaves the device idle, and what the host did meanwhile.

bench/sampled.round_profile synchronises CUDA around every phase of a round, so its per-phase
figures add up; the syncs also move the round (the H100's chain-1 round read 14.7 ms of wall
against ~9.5 ms of device work). This profile runs the loop as a run does, with no syncs and only
the phases' ranges (DecodeLoop(profile="ranges")), exports torch.profiler's chrome trace and reads
it (`gaps`, a pure function of the trace):
  - the device's busy and idle time per round (idle: the window's time that no kernel, copy or
    set covers, on any stream);
  - each idle gap charged to the phase, and the runtime or driver call (cudaLaunchKernel,
    cudaGraphLaunch, cuLaunchKernel, cudaMemcpyAsync), of the launch that ended it, matched by
    the profiler's correlation id: a gap ended by a launch from "accept" is host time in accept
    that the device waited for;
  - the host's own time during the idle, per (phase, op): each host event's overlap with the
    idle, less its children's (an aten op's own time, a phase's own Python between its ops);
  - each phase's device time, and its largest kernels (device_kernels_by_phase).
Worked example (tests/test_bench_round_gaps.py): one 1,000 us round; verify_forward's linear
launches a kernel at 95 us that runs 100-300 us; accept sorts on the host 610-900 us, then
launches a kernel that runs 910-990 us -> busy 280 us, idle 720 us: 610 charged to accept
(the gap 300-910), 100 to verify_forward (0-100), 10 to the window's end; the host's own time
in that idle: accept's sort 290 us.
On the CPU there are no device events: the device figures are None, the phases' host time stays.
"""

from __future__ import annotations

import bisect
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path


DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
HOST_CATS = ("cpu_op", "user_annotation", "python_function") + LAUNCH_CATS
WINDOW_END = "(the window's end)"
OUTSIDE = "(outside the phases)"
UNTRACED = "(launch not traced)"


class _Idle:
    """The idle intervals of a window, sorted and disjoint, with their running total: the idle
    time inside any [a, b) in O(log n)."""

    def __init__(self, gaps: list[tuple[float, float]]):
        self.starts = [a for a, _ in gaps]
        self.ends = [b for _, b in gaps]
        self.before = [0.0]
        for a, b in gaps:
            self.before.append(self.before[-1] + (b - a))

    def within(self, a: float, b: float) -> float:
        if b <= a or not self.starts:
            return 0.0
        return self._upto(b) - self._upto(a)

    def _upto(self, t: float) -> float:
        """Idle time before t."""
        i = bisect.bisect_right(self.starts, t)              # gaps starting at or before t
        if i == 0:
            return 0.0
        a, b = self.starts[i - 1], self.ends[i - 1]
        return self.before[i - 1] + (min(t, b) - a)


def _nest(events: list[dict]) -> dict[int, list[int]]:
    """Children (indices) of each host event on its thread, by containment: {parent: [child]}."""
    kids: dict[int, list[int]] = defaultdict(list)
    by_thread: dict = defaultdict(list)
    for i, e in enumerate(events):
        by_thread[(e.get("pid"), e.get("tid"))].append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        stack: list[int] = []
        for i in idx:
            ts = events[i]["ts"]
            while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= ts:
                stack.pop()
            if stack:
                kids[stack[-1]].append(i)
            stack.append(i)
    return kids


def _phase_at(phases: list[dict], t: float) -> str:
    """The innermost "diag.<phase>" range around t, by name without the prefix."""
    inside = [p for p in phases if p["ts"] <= t < p["ts"] + p["dur"]]
    return min(inside, key=lambda p: p["dur"])["name"][5:] if inside else OUTSIDE


def gaps(trace: dict, *, top: int = 12) -> dict:
    """A chrome trace of a profiled loop (torch.profiler's export, its active steps
    "ProfilerStep#N") -> per round: the wall, the device's busy and idle time, the idle charged
    to the phase and call of the launch that ended each gap, the host's own time during the idle
    per (phase, op), and the `top` largest gaps. Milliseconds a round."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in events if e.get("name", "").startswith("ProfilerStep")        # the host's, not
                    and e.get("cat") in ("user_annotation", "cpu_op")), key=lambda e: e["ts"])  # their GPU echo
    if not steps:
        raise ValueError("round_gaps: the trace holds no ProfilerStep ranges (no active profiler step)")
    t0, t1 = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    n = len(steps)
    host = [e for e in events if e.get("cat") in HOST_CATS and t0 <= e["ts"] < t1
            and not e["name"].startswith("ProfilerStep")]
    phases = [e for e in host if e["name"].startswith("diag.")]
    per_phase = defaultdict(float)
    for p in phases:
        per_phase[p["name"][5:]] += p["dur"]
    out = {"rounds": n, "wall_ms_per_round": (t1 - t0) / 1e3 / n,
           "phase_host_ms_per_round": {k: round(v / 1e3 / n, 3) for k, v in per_phase.items()}}
    device = sorted((e for e in events if e.get("cat") in DEVICE_CATS and t0 <= e["ts"] < t1), key=lambda e: e["ts"])
    if not device:
        return {**out, "device_busy_ms_per_round": None, "device_idle_ms_per_round": None,
                "idle_ms_per_round_by_phase": None, "idle_ms_per_round_by_call": None,
                "host_ms_during_idle_per_round": None, "device_ms_per_round_by_phase": None,
                "device_kernels_by_phase": None, "largest_gaps": []}
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    on_device = defaultdict(float)                    # device time of the kernels each phase launched
    kernels = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))    # phase -> kernel -> [us, count]
    idle, ended, end, busy = [], [], t0, 0.0          # ended: (phase, call, kernel) of the launch after a gap
    for e in device:
        r = launches.get(e.get("args", {}).get("correlation"))
        phase, call = (_phase_at(phases, r["ts"]), r["name"]) if r is not None else (UNTRACED, UNTRACED)
        on_device[phase] += e["dur"]
        k = kernels[phase][e["name"][:80]]
        k[0] += e["dur"]
        k[1] += 1
        s, f = e["ts"], e["ts"] + e["dur"]
        if s > end:
            idle.append((end, s))
            ended.append((phase, call, e["name"][:80]))
        busy += max(0.0, min(f, t1) - max(s, end))
        end = max(end, f)
    if end < t1:
        idle.append((end, t1))
        ended.append((WINDOW_END, WINDOW_END, None))
    by_phase, by_call, largest = defaultdict(float), defaultdict(float), []
    for (a, b), (phase, call, kernel) in zip(idle, ended):
        by_phase[phase] += b - a
        by_call[call] += b - a
        largest.append({"gap_us": round(b - a, 1), "phase": phase, "call": call, "kernel": kernel})
    span = _Idle(idle)
    kids = _nest(host)
    ranges = {id(p) for p in phases}
    own = defaultdict(float)
    for i, e in enumerate(host):
        mine = span.within(e["ts"], e["ts"] + e["dur"]) - sum(
            span.within(host[k]["ts"], host[k]["ts"] + host[k]["dur"]) for k in kids.get(i, ()))
        if mine > 0:
            name = "(own Python)" if id(e) in ranges else e["name"][:70]
            own[f"{_phase_at(phases, e['ts'])}: {name}"] += mine
    ms = lambda d: {k: round(v / 1e3 / n, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}   # noqa: E731
    return {**out, "device_busy_ms_per_round": busy / 1e3 / n, "device_idle_ms_per_round": span.before[-1] / 1e3 / n,
            "device_busy_fraction": busy / (t1 - t0), "gaps_per_round": len(idle) / n,
            "gaps_over_20us_per_round": sum(1 for a, b in idle if b - a > 20) / n,
            "idle_ms_per_round_by_phase": ms(by_phase), "idle_ms_per_round_by_call": ms(by_call),
            "host_ms_during_idle_per_round": dict(list(ms(own).items())[:3 * top]),
            "device_ms_per_round_by_phase": ms(on_device),
            "device_kernels_by_phase": {                  # each phase's `top` kernels: [name, ms, calls] a round
                phase: [[name, round(us / 1e3 / n, 3), round(c / n, 2)]
                        for name, (us, c) in sorted(ks.items(), key=lambda kv: -kv[1][0])[:top]]
                for phase, ks in sorted(kernels.items(), key=lambda kv: -on_device[kv[0]])},
            "largest_gaps": sorted(largest, key=lambda g: -g["gap_us"])[:top]}


def round_gaps(model, drafter, embed, head, layouts: list[str], prompts: list[list[int]], tree: str, *,
               max_new_tokens: int = 128, skip: int = 6, rounds: int = 6, top: int = 12) -> dict:
    """`gaps` of `rounds` rounds of the tree's loop (one lane per layout, every prompt), after the
    prefill and `skip` - 1 rounds, unsynchronised; beside it, the same loop's wall a round
    unprofiled (what the profiler adds)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from diag.bench.sampled import bench_loop, sync
    from diag.trees import tree_shape

    shape = tree_shape(tree)
    cuda = next(drafter.parameters()).device.type == "cuda"
    warm, _, rows = bench_loop(model, drafter, embed, head, layouts, shape, len(prompts))
    warm.run(prompts, rows, min(max_new_tokens, 2 * shape.num_steps + 2))        # first calls of every shape
    plain, _, rows = bench_loop(model, drafter, embed, head, layouts, shape, len(prompts))
    sync()
    t0 = time.perf_counter()
    plain.run(prompts, rows, max_new_tokens)
    sync()
    unprofiled = (time.perf_counter() - t0) / max(1, plain.counts["rounds"])
    loop, _, rows = bench_loop(model, drafter, embed, head, layouts, shape, len(prompts), profile="ranges")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts, schedule=schedule(wait=skip, warmup=2, active=rounds, repeat=1)) as prof:
        loop.on_step = prof.step
        loop.run(prompts, rows, max_new_tokens)
        sync()
    if loop.counts["rounds"] < skip + 2 + rounds:
        raise ValueError(f"round_gaps({tree}): {loop.counts['rounds']} rounds, fewer than the {skip + 2 + rounds} "
                         f"the window needs; raise max_new_tokens ({max_new_tokens})")
    with tempfile.TemporaryDirectory(prefix="diag-round-gaps-") as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return {"tree": tree, "rows": len(rows), "unprofiled_wall_ms_per_round": unprofiled * 1e3, **gaps(trace, top=top)}
