"""bench/compiles.py: Triton's compile hooks, called as Triton's JIT calls them (a CPU runs no
compile), counted per kernel; hooks set before are chained and restored."""

import time
from types import SimpleNamespace

import pytest

from diag.bench.compiles import Compiles, compiles

knobs = pytest.importorskip("triton").knobs


def _compile(name: str, key: str, seconds: float = 0.0):
    """What JITFunction.run does on a cache miss: the cache hook, the compile, the post hook."""
    info = SimpleNamespace(module=None, name=name, jit_function=None)
    args = dict(key=key, repr=f"{name}[num_warps=4](S: i32)", fn=info, compile={}, is_manual_warmup=False,
                already_compiled=False)
    skip = knobs.runtime.jit_cache_hook(**args) if knobs.runtime.jit_cache_hook else None
    time.sleep(seconds)
    if knobs.runtime.jit_post_compile_hook:
        knobs.runtime.jit_post_compile_hook(**args)
    return skip


def test_counts_each_kernel_and_its_seconds():
    with compiles() as seen:
        assert not _compile("route_pairs", "a", 0.02)            # a true return would skip the compile
        _compile("route_pairs", "b")
        _compile("glu_rows", "c")
    _compile("glu_rows", "d")                                     # after the block: not counted
    assert seen.available and seen.count == 3
    assert seen.by_kernel["route_pairs"][0] == 2 and seen.by_kernel["glu_rows"][0] == 1
    assert 0.02 <= seen.by_kernel["route_pairs"][1] < 1.0
    assert seen.to_dict()["by_kernel"]["glu_rows"][0] == 1


def test_hooks_set_before_are_chained_and_restored():
    calls = []
    before = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_cache_hook = lambda **kw: calls.append(("miss", kw["key"]))
    knobs.runtime.jit_post_compile_hook = lambda **kw: calls.append(("done", kw["key"]))
    try:
        mine = knobs.runtime.jit_cache_hook
        with compiles() as seen:
            _compile("k", "x")
        assert calls == [("miss", "x"), ("done", "x")] and seen.count == 1
        assert knobs.runtime.jit_cache_hook is mine
    finally:
        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = before


def test_nothing_seen_is_zero():
    assert Compiles().count == 0 and Compiles().seconds == 0.0 and not Compiles().available
