"""Loading speed against the disk, side by side in one run: the raw read of the shards (as
`cat` does, and with 8 readers), diag's INT4 load cold (page cache dropped) and warm, and
the load a first run really does: cold, with an empty digest memo, so that every shard is
hashed (checkpoint.identity: xxh3-128 chunk tree) during the one read the load needs.

  ratio_cold           = (bytes / diag load s) / (bytes / raw sequential s), both cold
  plain_over_raw       = diag cold load s / raw cold read s                  goal <= 1.25
  first_run_over_plain = first-run load s / diag cold load s                 goal <= 1.1
                         (the load with the digest, then the pass key's identity from the
                         memo it primed: a few hundred KiB of spot checks per shard)
Example: 25.3 GB, raw 17.3 s, load 19.0 s (ratio 0.91, plain_over_raw 1.10), first run
19.5 s -> first_run_over_plain 1.03.
`repeats` > 1 (a shared machine) measures each cold row that many times, interleaved, and
keeps the fastest (every try is in the row's "tries").

The load's seconds are wall time of load_packed_target (config, skeleton, key checks, the
read, the hashing, the copies to the GPU), not the read alone. This module knows the loader's
entry point and clocks; nothing about replay or reports.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch

from diag.bench.common import sync
from diag.bench.disk import drop_page_cache, hash_rates, raw_read
from diag.checkpoint.headers import shard_files


def _diag_load(target: Path, device: str, *, digest: bool | None, threads: int | None = None) -> dict:
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


def _first_run_load(target: Path, device: str) -> dict:
    """The load of a first run: an empty digest memo (a temporary DIAG_CACHE_DIR), digest=None
    as the pipeline loads, then the checkpoint identity the pass cache's key needs (memo hits:
    only the spot checks). `identity_after_s` is that identity's cost."""
    from diag.checkpoint.identity import DIGEST_VERSION, checkpoint_identity

    with _empty_memo():
        row = _diag_load(target, device, digest=None)
        t0 = time.perf_counter()
        checkpoint_identity(target)
        row["identity_after_s"] = time.perf_counter() - t0
    row["digest_version"] = DIGEST_VERSION
    return row


class _empty_memo:
    def __enter__(self):
        self.old = os.environ.get("DIAG_CACHE_DIR")
        self.tmp = tempfile.TemporaryDirectory(prefix="diag-memo-")
        os.environ["DIAG_CACHE_DIR"] = self.tmp.name

    def __exit__(self, *exc):
        os.environ.pop("DIAG_CACHE_DIR") if self.old is None else os.environ.update(DIAG_CACHE_DIR=self.old)
        self.tmp.cleanup()


def _identity_alone(target: Path) -> float:
    """Seconds of checkpoint_identity with an empty digest memo (every byte hashed)."""
    from diag.checkpoint.identity import checkpoint_identity

    with _empty_memo():
        t0 = time.perf_counter()
        checkpoint_identity(target)
        return time.perf_counter() - t0


def _warm_imports(target: Path) -> None:
    """Build the model's meta skeleton once, untimed: the first load in a process would
    otherwise count transformers' module imports (seconds, no disk) as load time."""
    import json

    from diag.int4.skeleton import build_meta, resolve_config

    cfg = Path(target) / "config.json"
    build_meta(resolve_config(json.loads(cfg.read_text()), file=str(cfg)))


def load_bench(target: Path, device: str = "cuda", *, warm_threads=(4, 8, 16), with_digest: bool = True,
               whole_machine: bool = True, repeats: int = 1, log=print) -> dict:
    """whole_machine=False: only these files' pages are dropped (a shared machine's cache
    stays; disk.drop_page_cache)."""
    files = shard_files(Path(target))
    size = sum(f.stat().st_size for f in files)
    out: dict = {"checkpoint_bytes": size, "files": len(files), "device": device, "repeats": repeats}
    rows = {"raw_cold": lambda: raw_read(files), "raw_cold_8_readers": lambda: raw_read(files, threads=8),
            "diag_cold": lambda: _diag_load(target, device, digest=False)}
    if with_digest:
        rows.update({"diag_cold_with_digest": lambda: _first_run_load(target, device),
                     "identity_alone_cold": lambda: {"seconds": _identity_alone(target)}})
    _warm_imports(target)
    for _ in range(repeats):
        for name, fn in rows.items():
            out["cache_drop"] = drop_page_cache(files, whole_machine=whole_machine)
            row = fn()
            log(f"[bench] load {name}: {row}")
            tries = out.get(name, {}).get("tries", []) + [row["seconds"]]
            out[name] = min(out.get(name, row), row, key=lambda r: r["seconds"])
            out[name]["tries"] = tries
    out["hash_bytes_per_s"] = hash_rates()
    log(f"[bench] load hash_bytes_per_s: {out['hash_bytes_per_s']}")
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
    r["plain_over_raw"] = out["diag_cold"]["seconds"] / out["raw_cold"]["seconds"]
    if "diag_cold_with_digest" in out:
        row = out["diag_cold_with_digest"]                # the load, then the pass key's identity
        first = row["seconds"] + row.get("identity_after_s", 0.0)
        r["first_run_load_s"] = first
        r["first_run_bytes_per_s"] = size / first
        r["first_run_over_plain"] = first / out["diag_cold"]["seconds"]
        r["first_run_over_raw"] = first / out["raw_cold"]["seconds"]
        r["digest_priming_cost_s"] = first - out["diag_cold"]["seconds"]
        r["first_run_saved_s"] = out["identity_alone_cold"]["seconds"] - r["digest_priming_cost_s"]
    return r
