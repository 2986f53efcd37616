"""Triton compilations inside a timed region: which kernels a region compiled, how many times,
and the wall seconds each took (Triton's own `jit_cache_hook`, called before a kernel is
compiled for a specialisation it has not seen in this process, and `jit_post_compile_hook`,
after). A loop timed against a pass must not pay a kernel's first compile: the H100's sampled
section timed chain-1's loop at 1.91 s and the same loop, run again, at 0.97 s (its CPU seconds
near its wall: host work, not device time). This module knows Triton's hooks; nothing about
models or loops.

Example: with compiles() as seen: loop.run(...)  ->  seen.count 3, seen.seconds 2.1,
seen.by_kernel {"route_pairs": [2, 1.4], "moe_int4_gemm_wgmma": [1, 0.7]}.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Compiles:
    """What a region compiled. available: False where Triton (or its hooks) is absent: nothing
    could be seen, and count says 0 without meaning none."""

    available: bool = False
    by_kernel: dict[str, list] = field(default_factory=dict)     # name -> [count, seconds]

    @property
    def count(self) -> int:
        return sum(n for n, _ in self.by_kernel.values())

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.by_kernel.values())

    def to_dict(self) -> dict:
        return {"available": self.available, "count": self.count, "seconds": round(self.seconds, 3),
                "by_kernel": {k: [n, round(s, 3)] for k, (n, s) in sorted(self.by_kernel.items())}}


def _knobs():
    try:
        from triton import knobs
        return knobs.runtime if hasattr(knobs.runtime, "jit_post_compile_hook") else None
    except Exception:                                   # no Triton, or one without knobs (< 3.4)
        return None


@contextmanager
def compiles():
    """The Triton compilations inside the block, as `Compiles`; the hooks set before are kept
    and called as before (ours return None: a true return from the cache hook would skip the
    compile)."""
    seen = Compiles()
    runtime = _knobs()
    if runtime is None:
        yield seen
        return
    seen.available = True
    before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    started: dict[str, float] = {}

    def name_of(kwargs) -> str:
        fn = kwargs.get("fn")
        return getattr(fn, "name", None) or str(kwargs.get("repr", "?")).split("[")[0]

    def on_miss(*args, **kwargs):
        started[str(kwargs.get("key"))] = time.perf_counter()
        return before(*args, **kwargs) if before else None

    def on_compiled(*args, **kwargs):
        t0 = started.pop(str(kwargs.get("key")), None)
        row = seen.by_kernel.setdefault(name_of(kwargs), [0, 0.0])
        row[0] += 1
        row[1] += time.perf_counter() - t0 if t0 is not None else 0.0
        return after(*args, **kwargs) if after else None

    runtime.jit_cache_hook, runtime.jit_post_compile_hook = on_miss, on_compiled
    try:
        yield seen
    finally:
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = before, after
