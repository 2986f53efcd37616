"""Timing, ceilings and the result envelope shared by the benchmarks.

Timing on CUDA uses events around the region after warm-up and reports the median of
`repeat` runs; on the CPU, perf_counter. Ceilings are measured in the same run: an
8192^3 bf16 matmul (TFLOP/s) and a 4 GiB device-to-device copy (bytes read + written).
This module knows clocks and machines; it knows nothing about models.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from diag.bench import BENCH_VERSION


def sync(device: torch.device | str | None = None) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1) -> float:
    """Median seconds of fn() over `repeat` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_peak(device: str, n: int = 8192, repeat: int = 10, dtype=torch.bfloat16) -> float:
    """Measured matmul FLOP/s on random data (n^3 GEMM; bf16 on GPUs, fp32 on CPUs)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds = timed(lambda: a @ b, repeat=repeat, warmup=3)
    return 2 * n ** 3 / seconds


def copy_bandwidth(device: str, gib: int = 4) -> float:
    """Measured device-to-device copy, bytes read + written per second."""
    src = torch.empty(gib * 2 ** 30, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), repeat=10, warmup=2)
    return 2 * src.numel() / seconds


def machine() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "platform": platform.platform(), "cpu_count": torch.get_num_threads()}
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update({"gpu": p.name, "gpu_count": torch.cuda.device_count(), "cuda": torch.version.cuda,
                    "gpu_memory_bytes": p.total_memory, "multiprocessors": p.multi_processor_count})
    return out


def git_hash() -> str | None:
    """DIAG_GIT_HASH when set (a copy of the tree run elsewhere, e.g. on a lent GPU machine,
    sits inside another checkout), else HEAD of the checkout holding this file."""
    if os.environ.get("DIAG_GIT_HASH"):
        return os.environ["DIAG_GIT_HASH"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def section(results: dict, name: str, fn: Callable[[], dict], log=print) -> dict | None:
    """Run one benchmark section; a failure is recorded with its traceback and the run
    goes on, so one broken section never costs the others' device time."""
    t0 = time.perf_counter()
    try:
        out = fn()
        out["section_seconds"] = round(time.perf_counter() - t0, 2)
        results["sections"][name] = out
        log(f"[bench] {name}: {json.dumps(out, default=str)[:2000]}")
        return out
    except Exception as err:  # recorded, not hidden: the JSON carries the traceback
        before = results["sections"].get(name)          # what a section saved as it went (partial=)
        kept = {"partial": before} if isinstance(before, dict) and "incomplete" in before else {}
        results["sections"][name] = {"error": repr(err), "traceback": traceback.format_exc()[-4000:], **kept}
        log(f"[bench] {name} FAILED: {err!r}\n{traceback.format_exc()[-2000:]}")
        return None


def envelope(kind: str, config: dict) -> dict:
    return {"bench_version": BENCH_VERSION, "kind": kind, "git": git_hash(), "machine": machine(),
            "config": config, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sections": {}}


def save(results: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return path
