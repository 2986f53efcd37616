"""A forward replayed from CUDA graphs, one per bucket of its shapes: the decode loop's verify
per (rows B, tree size D, cache width W), and each other step of its round (draft, accept, the
target cache's commit, the drafter's extend) per (tree, rows, buffers); the greedy generation's
step per (rows, cache width) (issue 36: a round of the 2-layer Kimi-shaped target launched ~400
kernels for its verify alone, ~1,400-2,400 in all, and the host's launches, not the device, set
its pace).

A graph needs every shape and address fixed: the verify runs on fixed widths (the attention
reads the cache's whole buffer, kv_buffer.fixed_width), the new keys are written at a slots
tensor instead of a Python slice, and the inputs (ids, positions, the attention bias, the
slots) are copied into the graph's own tensors before each replay. A bucket's first call
runs eagerly once on a side stream (first calls: Triton's compiles, the routing graphs), and its
outputs are that call's; it is then captured (a capture runs nothing); later calls of the bucket
only copy their inputs and replay. So every call runs its forward's kernels once, which a forward
that moves data within its buffers needs (the commit's moves run twice would read slots the
first run overwrote). The outputs come back as copies (the graph's outputs are overwritten by
the next replay). Worked example: chain-3 (D 4) on 96 rows over a 228-slot cache -> bucket
(96, 4, 228); 10 rows retire -> the cache's rows are taken (new buffers, new stamps) -> every
graph of the old buffers is dropped and (86, 4, 228) is captured at the next round.

A graph is kept only while the buffers it reads are the ones it was captured on (`buffers`: the
caller's identity of them, kv_buffer.stamps for a target cache); a capture that fails (an op that
asks the host, a backend that cannot be captured) turns the graphs off for this object, names why
in `failure`, and the forward runs eagerly from then on: the same numbers either way, only
slower. A model on one CUDA device replays one graph a bucket; a model over several CUDA
devices replays a program of one graph per run of one device's work and the hand-off copies
between them (target/device_program.py; `how`). This module knows CUDA graphs; the forwards are
their callers'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import time

import torch

from diag.errors import env_switch
from diag.target import device_program


def graphs_wanted() -> bool:
    """CUDA graphs (the decode loop's verify, the greedy generation's step) are on unless
    DIAG_VERIFY_GRAPHS is "0": a switch to rule them out when a GPU run misbehaves (they change
    no number)."""
    return env_switch("DIAG_VERIFY_GRAPHS") is not False


def _devices(model: torch.nn.Module) -> set[torch.device]:
    """Every device a parameter or buffer of `model` sits on."""
    return {t.device for t in model.parameters()} | {t.device for t in model.buffers()}


@dataclass
class _Graph:
    graph: "torch.cuda.CUDAGraph | device_program.Program"  # either replays the bucket's forward (replay())
    inputs: dict[str, torch.Tensor]          # the graph's own copies of ids, pos, bias, slots
    sink: dict[str, torch.Tensor]            # the captured points it writes


@dataclass
class VerifyGraphs:
    """The graphs of one forward's buckets (module docstring): a decode loop's verify or draft,
    a generation batch's step. counts: captured, replayed,
    eager (verifies run without a graph, the captures' warm-ups among them), capture_s (wall
    seconds spent capturing, warm-ups included: what a short loop pays before replays repay it),
    of it warm_s (the first calls, launched) and record_s (the captures themselves, recorded)."""
    graphs: dict[tuple, _Graph] = field(default_factory=dict)
    buffers: tuple = ()
    pool: object = None
    failure: str | None = None
    counts: dict[str, float] = field(default_factory=lambda: {"captured": 0, "replayed": 0, "eager": 0,
                                                               "capture_s": 0.0, "warm_s": 0.0, "record_s": 0.0})
    side: object = None                       # the stream the first calls run on, one for every capture
    placed: dict[int, tuple] = field(default_factory=dict)   # id(model) -> (model, how, its devices): `how`
    pools: dict[int, object] = field(default_factory=dict)   # a program's graph pool on each device

    def how(self, model: torch.nn.Module) -> str | None:
        """How `model`'s forwards replay: "graph" (every parameter and buffer on one CUDA device),
        "program" (all on CUDA, over several devices: target/device_program.py), None (eager: a
        capture failed, a model off CUDA, or one `eager_for` named). A model's devices are looked
        up once per object (`placed`): a placement does not move while its forwards run, and
        walking a model's modules each call cost a decode loop 2 ms a round on the host (310
        calls of the 2-layer Kimi-shaped target and its drafter, 0.13 s of a 1.1 s loop;
        reports/bench/NOTES.md, twenty-second stop)."""
        if self.failure is not None:
            return None
        key = id(model)
        if key not in self.placed:
            devs = _devices(model)
            on_cuda = all(d.type == "cuda" for d in devs)
            how = None if not on_cuda else "graph" if len(devs) == 1 else "program"
            self.placed[key] = (model, how, sorted(d.index for d in devs) if on_cuda else [])
        return self.placed[key][1]

    def usable(self, model: torch.nn.Module) -> bool:
        """Graphs on for `model` (`how`)."""
        return self.how(model) is not None

    def eager_for(self, model: torch.nn.Module) -> None:
        """`model`'s steps run eagerly from now on (`how` None): bench/round_slope.split_probe
        times one GPU of a split target so, as diag ran a target over several devices before
        programs."""
        self.placed[id(model)] = (model, None, [])

    def programmed_for(self, model: torch.nn.Module) -> None:
        """`model`'s steps replay as programs (`how` "program") though it sits on one device:
        bench/round_slope.split_probe times one GPU of a split target so (expert_split.OneGpuOfN
        cuts its graphs where the GPUs hand off)."""
        self.placed[id(model)] = (model, "program", sorted(d.index for d in _devices(model)))

    def run(self, buffers: tuple, inputs: dict[str, torch.Tensor], key: tuple,
            forward: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
            model: torch.nn.Module | None = None) -> dict[str, torch.Tensor] | None:
        """forward(inputs)'s outputs, by a graph of `key` on the buffers `buffers` names (their
        identity: kv_buffer.stamps of a cache), or by a program where `model` (the forward's,
        `how`) spans several devices; None when the capture failed (the caller runs the forward
        eagerly)."""
        now = buffers
        if now != self.buffers:                 # new buffers: the old graphs point at freed memory
            self.graphs.clear()
            self.buffers = now
        g = self.graphs.get(key)
        if g is None:
            t0 = time.perf_counter()
            try:
                placed = self.placed.get(id(model)) if model is not None else None
                if placed is not None and placed[1] == "program":
                    g, first = self._record(inputs, forward, placed[2])
                else:
                    g, first = self._capture(inputs, forward)
            except Exception as e:                          # noqa: BLE001 (any failure: eager from now on)
                self.failure = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                self.graphs.clear()
                if torch.cuda.is_available():              # let a broken capture's work drain before eager
                    torch.cuda.synchronize()
                return None
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.graphs[key] = g
            self.counts["captured"] += 1
            self.counts["capture_s"] += time.perf_counter() - t0
            return first
        return self.replay(buffers, inputs, key)

    def replay(self, buffers: tuple, inputs: dict[str, torch.Tensor], key: tuple) -> dict[str, torch.Tensor] | None:
        """The outputs of the graph of `key` already captured on the buffers `buffers` names, its
        inputs copied in first; None where there is none (this captures nothing)."""
        g = self.graphs.get(key) if buffers == self.buffers and self.failure is None else None
        if g is None:
            return None
        for name, t in inputs.items():
            g.inputs[name].copy_(t)
        g.graph.replay()
        self.counts["replayed"] += 1
        return {k: v.clone() for k, v in g.sink.items()}

    def _record(self, inputs, forward, devices) -> tuple[_Graph, dict[str, torch.Tensor]]:
        """The bucket's program over `devices` (device_program.record), and the outputs of its
        first call, run eagerly before on the devices' current streams."""
        static = {k: v.clone() for k, v in inputs.items()}
        t0 = time.perf_counter()
        first = {k: v.clone() for k, v in forward(static).items()}
        self.counts["eager"] += 1
        t1 = time.perf_counter()
        program, sink = device_program.record(forward, static, self.pools, devices)
        for k, v in program.counts().items():
            self.counts[f"program_{k}"] = v                   # the last program's host calls a replay
        self.counts["warm_s"] += t1 - t0
        self.counts["record_s"] += time.perf_counter() - t1
        return _Graph(program, static, sink), first

    def _capture(self, inputs, forward) -> tuple[_Graph, dict[str, torch.Tensor]]:
        """The bucket's graph, and the outputs of its first call (run eagerly before the capture)."""
        static = {k: v.clone() for k, v in inputs.items()}
        t0 = time.perf_counter()
        if self.side is None:
            self.side = torch.cuda.Stream(device=next(iter(inputs.values())).device)
        side = self.side
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                        # first calls, off the capture (as torch asks)
            first = {k: v.clone() for k, v in forward(static).items()}
        torch.cuda.current_stream().wait_stream(side)
        for v in first.values():                             # read on this stream: not reused before it has
            v.record_stream(torch.cuda.current_stream())
        self.counts["eager"] += 1
        t1 = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            sink = forward(static)
        self.pool = graph.pool()
        self.counts["warm_s"] += t1 - t0
        self.counts["record_s"] += time.perf_counter() - t1
        return _Graph(graph, static, sink), first
