"""A stand-in for CUDA graphs on the CPU: VerifyGraphs (target/verify_graphs.py) captures and
replays as on the GPU, with a "graph" that re-runs the forward it captured on the graph's own
inputs and copies into its own outputs (as a replay writes them), so tests hold the bookkeeping
(inputs copied in, outputs handed out as copies, graphs dropped with their buffers) where no
CUDA device is."""

from __future__ import annotations

import torch

from diag.target.verify_graphs import VerifyGraphs, _Graph


def stand_in(monkeypatch, layers=lambda: []) -> None:
    """Every VerifyGraphs usable, its captures stand-ins. layers(): the cache layers whose Python
    views a replay must leave as they were (a real replay runs no update() on them)."""

    class Replay:
        def __init__(self, forward, inputs, sink):
            self.forward, self.inputs, self.sink = forward, inputs, sink

        def replay(self):                    # the kernels again; Python's views of the cache untouched
            views = [(x, x.keys, x.values) for x in layers()]
            for k, v in self.forward(self.inputs).items():
                self.sink[k].copy_(v)
            for x, k, v in views:
                x.keys, x.values = k, v

    def capture(self, inputs, forward):
        static = {k: v.clone() for k, v in inputs.items()}
        first = {k: v.clone() for k, v in forward(static).items()}          # the warm-up: this call's outputs
        self.counts["eager"] += 1
        junk = lambda v: torch.full_like(v, float("nan") if v.is_floating_point() else 7)  # noqa: E731
        sink = {k: junk(v) for k, v in first.items()}                       # a capture runs nothing
        return _Graph(Replay(forward, static, sink), static, sink), first

    monkeypatch.setattr(VerifyGraphs, "_capture", capture)
    monkeypatch.setattr(VerifyGraphs, "usable", lambda self, model: self.failure is None)
