"""The disk the checkpoint sits on: its raw read bandwidth, with the page cache dropped
where the machine allows it, for the loader to be measured against.

  drop_page_cache(files)  `sync; echo 3 > /proc/sys/vm/drop_caches` (needs root); if that
                          is refused, posix_fadvise(DONTNEED) on each file (drops its clean
                          pages on Linux); returns which one worked, or "none"
  raw_read(files, ...)    what `cat f1 f2 ... > /dev/null` does: each file read front to
                          back in 16 MiB reads into one reused buffer, one file after
                          another (threads=1), or `threads` files/segments at once
  hash_rates()            in-memory bytes/s of sha256, xxh3-128 and blake3, one thread and
                          every core: what a content digest in the load's read can cost

Worked example: 25.3 GB in 17.3 s cold -> 1.46 GB/s; the loader's goal is >= 0.8 of it.
This module knows files, hashes and clocks; nothing about models or tensors.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

BLOCK = 16 << 20


def drop_page_cache(files: list[Path], *, whole_machine: bool = True) -> str:
    """whole_machine=False skips drop_caches (tests: it would empty a shared machine's cache)."""
    os.sync()
    try:
        if whole_machine:
            with open("/proc/sys/vm/drop_caches", "w") as fh:
                fh.write("3\n")
            return "drop_caches"
    except OSError:
        pass
    if not hasattr(os, "posix_fadvise"):
        return "none"
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise_dontneed"


def _read_range(path: Path, start: int, end: int, buf: bytearray) -> int:
    view, done = memoryview(buf), 0
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end:
            n = os.preadv(fd, [view[:min(BLOCK, end - pos)]], pos)
            if n == 0:
                break
            pos, done = pos + n, done + n
    finally:
        os.close(fd)
    return done


def raw_read(files: list[Path], *, threads: int = 1) -> dict:
    """Seconds and bytes/s of reading every byte of `files`, as cat does (threads=1) or
    with `threads` readers over ~1 GiB segments."""
    jobs = []
    for f in files:
        size = f.stat().st_size
        step = size if threads == 1 else max(1 << 30, -(-size // threads))
        jobs += [(f, a, min(size, a + step)) for a in range(0, size, step)]
    total = [0]
    lock = threading.Lock()

    def worker():
        buf = bytearray(BLOCK)
        while True:
            with lock:
                if not jobs:
                    return
                job = jobs.pop(0)
            n = _read_range(*job, buf)
            with lock:
                total[0] += n

    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - t0
    return {"threads": threads, "bytes": total[0], "seconds": seconds,
            "bytes_per_second": total[0] / seconds if seconds else 0.0}


def hash_rates(nbytes: int = 256 << 20, repeats: int = 5) -> dict:
    """In-memory bytes/s of the hashes a content digest could use, best of `repeats` (a shared
    machine is noisy): sha256 (hashlib), xxh3-128 (xxhash), blake3 (if installed), each on
    one thread and on every core (64 MiB chunks hashed by os.cpu_count() threads, as the
    loader's readers do; blake3 also with its own threads over one buffer)."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    import xxhash

    data = os.urandom(nbytes)
    chunks = [memoryview(data)[i:i + (64 << 20)] for i in range(0, nbytes, 64 << 20)]
    algos = {"sha256": lambda c: hashlib.sha256(c).digest(), "xxh3_128": lambda c: xxhash.xxh3_128(c).digest()}
    try:
        import blake3
        algos["blake3"] = lambda c: blake3.blake3(c).digest()
    except ImportError:
        blake3 = None
    cores = os.cpu_count() or 1

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return nbytes / min(times)

    out: dict = {"cores": cores, "bytes": nbytes}
    with ThreadPoolExecutor(cores) as pool:
        for name, h in algos.items():
            out[f"{name}_1_thread"] = best(lambda: [h(c) for c in chunks])
            out[f"{name}_all_cores"] = best(lambda: list(pool.map(h, chunks)))
    if blake3 is not None:
        out["blake3_own_threads"] = best(lambda: blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest())
    return out
