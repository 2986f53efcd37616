"""A checkpoint's identity is its content: a digest of every file that decides its numbers.

Files that count: weights (*.safetensors, *.bin, *.pt), configs and indexes (*.json),
tokenizer files (*.model, *.tiktoken, *.txt, *.jinja) and remote code (*.py), in the
checkpoint directory itself. Prose (*.md) and dotfiles do not count.

A file's digest (DIGEST_VERSION) is a tree of fixed chunks, so that any reader may hash the
chunks in any order, on any number of threads, while it reads them for another purpose:
  chunk i   = xxh3-128 of bytes [i * 64 MiB, min(size, (i + 1) * 64 MiB))
  file      = xxh3-128 of "DIGEST_VERSION\\0size\\0" + chunk 0 + chunk 1 + ... (16 bytes each)
Worked example: a 150 MiB shard has chunks [0, 64Mi), [64Mi, 128Mi), [128Mi, 150Mi); the file
digest hashes 'xxh3-128-tree-64MiB-v1\\0157286400\\0' and 3 x 16 bytes. An empty file has no
chunk. The digest depends on the bytes alone, never on how they were read.

Why xxh3-128 (measured on the 2-core AMD EPYC dev machine, in memory, 256 MiB, best of 5,
repeated over three runs of a shared, noisy machine; reports/bench/cpu-load-digest.json and
reports/bench/NOTES.md): sha256 (the digest before) 0.9-1.3 GB/s a core, blake3 2.2-4.6 GB/s
a core (2.7-3.5 GB/s with its own threads), xxh3-128 10.9-18.3 GB/s a core; the raw cold read
of the same machine 1.35-1.55 GB/s (one reader), warm 3.3-6.8 GB/s. Only xxh3 stays far above
a fast disk array on the loader's few spare cycles (Kimi's 594 GB: 33 s of one core, spread
over the 8 reader threads), where blake3 would need ~130 core-seconds and sha256 ~500. It is
not cryptographic: it tells a retrained, rewritten or corrupted checkpoint from another (a
chance collision ~2^-64 per pair), not one crafted to collide, which a user's own cache does
not need.

Hashing 550 GB on every run would cost minutes, so each file's digest is memoised under
$DIAG_CACHE_DIR/digests, keyed by its stat (stat_key: resolved path, size, mtime_ns, ctime_ns,
inode, device). Any write to a file changes its ctime (which no user tool can set back), so a
rewritten, retrained or corrupted file is hashed again; an unchanged one is not read whole.
Worked example: model.safetensors rewritten in place with the same size and an mtime
restored by `touch -r` -> ctime differs -> memo miss -> re-hashed.
A memo is checked before it is believed (memo.py): written by another digest version, torn,
or disagreeing with a spot check of the file's bytes under the same stat -> hashed again,
with a note (drain_notes) saying why; never a silent wrong cache hit.

A reader that reads every byte anyway (the INT4 weight loader, diag.checkpoint.reader) hashes
the chunks as they pass and `prime_digest`s the memo, so a first run reads 550 GB once.
This module knows files and hashes; nothing about models.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

from diag.checkpoint import memo

DIGEST_VERSION = "xxh3-128-tree-64MiB-v1"
DIGEST_CHUNK = 64 << 20
_COUNTED = (".safetensors", ".bin", ".pt", ".json", ".model", ".tiktoken", ".txt", ".jinja", ".py")
_READ = 16 << 20              # one pread of a standalone hash (divides DIGEST_CHUNK)


def cache_root() -> Path:
    """$DIAG_CACHE_DIR, else ~/.cache/diag (an empty value counts as unset, never the cwd)."""
    base = os.environ.get("DIAG_CACHE_DIR")
    return Path(base).expanduser() if base else Path.home() / ".cache" / "diag"


def stat_key(path: str | Path) -> dict:
    """What the memo is keyed on: resolved path, size, mtime_ns, ctime_ns, inode, device."""
    path = Path(path)
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "ino": st.st_ino, "dev": st.st_dev}


# ---- the digest's definition ---------------------------------------------

def chunk_hasher():
    """The hasher of one chunk; feed it the chunk's bytes in order, in any number of updates."""
    return xxhash.xxh3_128()


def chunk_count(size: int) -> int:
    return -(-size // DIGEST_CHUNK)


class FileDigest:
    """The chunk digests of one file, added by any thread in any order; `hexdigest` once all
    chunk_count(size) are in. `stat`: the file's stat_key before the first byte was read."""

    def __init__(self, size: int, stat: dict | None = None):
        self.size, self.stat = size, stat
        self._chunks: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def add(self, index: int, digest: bytes) -> None:
        if not 0 <= index < chunk_count(self.size):
            raise ValueError(f"chunk {index} outside a file of {self.size} bytes")
        with self._lock:
            self._chunks[index] = digest

    def hexdigest(self) -> str:
        n = chunk_count(self.size)
        missing = [i for i in range(n) if i not in self._chunks]
        if missing:
            raise ValueError(f"chunks {missing[:4]} of {n} not hashed")
        top = xxhash.xxh3_128(f"{DIGEST_VERSION}\0{self.size}\0".encode())
        for i in range(n):
            top.update(self._chunks[i])
        return top.hexdigest()


def digest_bytes(data: bytes) -> str:
    """The digest of `data` as a file's bytes (tests, and the definition in one place)."""
    fd = FileDigest(len(data))
    view = memoryview(data)
    for i in range(chunk_count(len(data))):
        fd.add(i, xxhash.xxh3_128(view[i * DIGEST_CHUNK:(i + 1) * DIGEST_CHUNK]).digest())
    return fd.hexdigest()


def _hash_chunk(path: Path, index: int, size: int, acc: FileDigest) -> None:
    start, end = index * DIGEST_CHUNK, min(size, (index + 1) * DIGEST_CHUNK)
    h, buf = chunk_hasher(), bytearray(min(_READ, end - start))
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end:
            n = os.preadv(fd, [view[:min(len(buf), end - pos)]], pos)
            if n == 0:
                raise OSError(f"{path} ended at byte {pos} while being hashed (size {size})")
            h.update(view[:n])
            pos += n
    finally:
        os.close(fd)
    acc.add(index, h.digest())


def hash_file(path: str | Path, *, threads: int = 4) -> tuple[str, dict]:
    """(digest, stat before the read) of a file, its chunks hashed by `threads` readers."""
    path = Path(path)
    stat = stat_key(path)
    acc = FileDigest(stat["size"], stat)
    n = chunk_count(stat["size"])
    if n <= 1 or threads <= 1:
        for i in range(n):
            _hash_chunk(path, i, stat["size"], acc)
    else:
        with ThreadPoolExecutor(max_workers=min(threads, n)) as pool:
            list(pool.map(lambda i: _hash_chunk(path, i, stat["size"], acc), range(n)))
    return acc.hexdigest(), stat


# ---- the memo ------------------------------------------------------------

def memoised_digest(path: str | Path) -> str | None:
    """The memoised digest of a file whose stat is unchanged and whose memo passes its checks,
    else None (a few hundred KiB of the file are read for the spot check, never the whole)."""
    path = Path(path)
    return memo.lookup(cache_root(), path, stat_key(path), DIGEST_VERSION)


def prime_digest(path: str | Path, stat: dict, digest: str) -> bool:
    """Memoise `digest`, computed by someone else over the file's bytes while its stat was
    `stat` (e.g. the weight loader, which reads every byte anyway); refused (False) when the
    file changed meanwhile, so a digest of other bytes is never recorded. A memo under the
    same stat holding another digest is replaced, with a note."""
    path = Path(path)
    if stat_key(path) != stat:
        return False
    return memo.write(cache_root(), path, stat, DIGEST_VERSION, digest)


def file_digest(path: str | Path, *, threads: int = 4) -> str:
    """The file's digest, from the memo when the file's stat is unchanged."""
    path = Path(path)
    saved = memoised_digest(path)
    if saved is not None:
        return saved
    digest, stat = hash_file(path, threads=threads)
    prime_digest(path, stat, digest)                 # refused if it changed while we read it
    return digest


def drain_notes() -> list[str]:
    """Why memoised digests were not believed since the last call (for the report's notes)."""
    return memo.drain_notes()


def counted_files(directory: Path) -> list[Path]:
    return sorted(p for p in Path(directory).iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix in _COUNTED)


def is_memoised(directory: str | Path) -> bool:
    """True when every counted file's digest is in the memo: computing the identity reads
    no file whole. False on a first run (or after a file changed)."""
    return all(memoised_digest(f) is not None for f in counted_files(Path(directory)))


def checkpoint_identity(directory: str | Path, *, threads: int = 8) -> str:
    """sha256 over (file name, file digest) of every counted file, in name order."""
    files = counted_files(Path(directory))
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(files)))) as pool:
        digests = list(pool.map(file_digest, files))
    h = hashlib.sha256(f"{DIGEST_VERSION}\0".encode())
    for f, d in zip(files, digests):
        h.update(f"{f.name}\0{d}\0".encode())
    return h.hexdigest()
