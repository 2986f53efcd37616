"""Loading speed against the disk: the raw read of the shards (as `cat` does, and with 8
readers), diag's INT4 load onto the GPU, cold (page cache dropped) and warm, and their ratio;
the content digest alone (what a first run would read a second time without priming) and
the load that primes it.

  ratio_cold = checkpoint bytes / diag load seconds, over raw sequential bytes/s, both cold
  Example: 25.3 GB, raw 17.3 s (1.46 GB/s), load 19.0 s (1.33 GB/s) -> 0.91 (goal >= 0.8)

The load's seconds are wall time of load_packed_target (config, skeleton, key checks, the
read, the copies to the GPU), not the read alone. This module knows the loader's entry point
and clocks; nothing about replay or reports.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch

from diag.bench.common import sync
from diag.bench.disk import drop_page_cache, raw_read
from diag.checkpoint.headers import shard_files


def _diag_load(target: Path, device: str, *, digest: bool, threads: int | None = None) -> dict:
    from diag.int4.load import load_packed_target

    old = os.environ.get("DIAG_LOAD_THREADS")
    if threads:
        os.environ["DIAG_LOAD_THREADS"] = str(threads)
    try:
        sync()
        t0 = time.perf_counter()
        model = load_packed_target(target, dtype=torch.bfloat16, device=device, digest=digest)
        sync()
        seconds = time.perf_counter() - t0
    finally:
        if threads:
            os.environ.pop("DIAG_LOAD_THREADS") if old is None else os.environ.update(DIAG_LOAD_THREADS=old)
    st = model.diag_read_stats
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"seconds": seconds, "read_seconds": st.seconds, "bytes_read": st.bytes_read,
            "threads": st.threads, "segments": st.segments, "digested_files": len(st.digests)}


def _identity_alone(target: Path) -> float:
    """Seconds of checkpoint_identity with an empty digest memo (every byte hashed)."""
    from diag.checkpoint.identity import checkpoint_identity

    old = os.environ.get("DIAG_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="diag-memo-") as tmp:
        os.environ["DIAG_CACHE_DIR"] = tmp
        try:
            t0 = time.perf_counter()
            checkpoint_identity(target)
            return time.perf_counter() - t0
        finally:
            os.environ.pop("DIAG_CACHE_DIR") if old is None else os.environ.update(DIAG_CACHE_DIR=old)


def _warm_imports(target: Path) -> None:
    """Build the model's meta skeleton once, untimed: the first load in a process would
    otherwise count transformers' module imports (seconds, no disk) as load time."""
    import json

    from diag.int4.skeleton import build_meta, resolve_config

    cfg = Path(target) / "config.json"
    build_meta(resolve_config(json.loads(cfg.read_text()), file=str(cfg)))


def load_bench(target: Path, device: str = "cuda", *, warm_threads=(4, 8, 16), with_digest: bool = True,
               whole_machine: bool = True, log=print) -> dict:
    """whole_machine=False: only these files' pages are dropped (a shared machine's cache
    stays; disk.drop_page_cache)."""
    files = shard_files(Path(target))
    size = sum(f.stat().st_size for f in files)
    out: dict = {"checkpoint_bytes": size, "files": len(files), "device": device}

    def cold(name, fn):
        out["cache_drop"] = drop_page_cache(files, whole_machine=whole_machine)
        out[name] = fn()
        log(f"[bench] load {name}: {out[name]}")

    _warm_imports(target)
    cold("raw_cold", lambda: raw_read(files))
    cold("raw_cold_8_readers", lambda: raw_read(files, threads=8))
    cold("diag_cold", lambda: _diag_load(target, device, digest=False))
    if with_digest:
        cold("identity_alone_cold", lambda: {"seconds": _identity_alone(target)})
        cold("diag_cold_with_digest", lambda: _diag_load(target, device, digest=True))
    out["raw_warm"] = raw_read(files)
    out["raw_warm_8_readers"] = raw_read(files, threads=8)
    out["diag_warm"] = [_diag_load(target, device, digest=False, threads=t) for t in warm_threads]
    return {**out, **_ratios(out, size)}


def _ratios(out: dict, size: int) -> dict:
    def rate(row):
        return size / row["seconds"]

    best_warm = min(out["diag_warm"], key=lambda r: r["seconds"])
    r = {"raw_cold_bytes_per_s": out["raw_cold"]["bytes_per_second"],
         "diag_cold_bytes_per_s": rate(out["diag_cold"]),
         "raw_warm_bytes_per_s": out["raw_warm"]["bytes_per_second"],
         "diag_warm_bytes_per_s": rate(best_warm), "diag_warm_threads": best_warm["threads"]}
    r["ratio_cold"] = r["diag_cold_bytes_per_s"] / r["raw_cold_bytes_per_s"]
    r["ratio_warm"] = r["diag_warm_bytes_per_s"] / r["raw_warm_bytes_per_s"]
    if "diag_cold_with_digest" in out:
        r["digest_priming_cost_s"] = out["diag_cold_with_digest"]["seconds"] - out["diag_cold"]["seconds"]
        r["first_run_saved_s"] = out["identity_alone_cold"]["seconds"] - r["digest_priming_cost_s"]
    return r
