"""The zoo's build time on this machine (issue 19's goals: the demo's checkpoints in <= 3
minutes on 2 cores, the whole zoo in <= 5), measured as a newcomer meets it: into an empty
cache, the demo's entries first (what `diag run` on the demo builds), then the rest.

Reports wall seconds for both stages and for the whole, each entry's own `seconds` from its
zoo_meta.json, and the machine's load average before and after: the 2-core machines' speed
moves 20-30% by the hour, so a figure without its load is half a figure.

This module knows the zoo's entry points; the builders are diag.zoo's.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path



def demo_entries() -> tuple[str, ...]:
    """The zoo entries cases/demo.toml names as its target and drafter ("zoo:NAME" paths):
    ("llama-tiny", "llama-tiny-eagle3-embed-vllm-ids")."""
    from diag.run.case import read_case
    from diag.run.shipped import DEMO, shipped
    case = read_case(shipped(DEMO))
    return tuple(m.path.removeprefix("zoo:") for m in (case.target, case.drafter) if m.path.startswith("zoo:"))


@contextmanager
def _cache_at(root: Path):
    before = os.environ.get("DIAG_CACHE_DIR")
    os.environ["DIAG_CACHE_DIR"] = str(root)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DIAG_CACHE_DIR", None)
        else:
            os.environ["DIAG_CACHE_DIR"] = before


def zoo_build_bench(workdir: Path) -> dict:
    """Build the whole zoo into workdir/cache (which must not hold one yet)."""
    from diag.zoo import ZOO
    from diag.zoo.build import closure, ensure, read_meta
    from diag.zoo.train import BUILD_THREADS

    root = workdir / "cache"
    if (root / "zoo").exists():
        raise FileExistsError(f"{root / 'zoo'} holds a zoo already: the benchmark builds into an empty cache")
    first = list(demo_entries())
    load_before = os.getloadavg()
    with _cache_at(root):
        t0 = time.perf_counter()
        ensure(first)
        demo = time.perf_counter() - t0
        ensure(list(ZOO))
        whole = time.perf_counter() - t0
        entries = {n: (read_meta(n) or {}).get("seconds") for n in closure(list(ZOO))}
    return {"demo_entries": closure(first), "demo_seconds": round(demo, 1),
            "whole_seconds": round(whole, 1), "rest_seconds": round(whole - demo, 1),
            "entry_seconds": entries, "build_threads": BUILD_THREADS, "cpu_count": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
