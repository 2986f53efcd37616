"""A checkpoint's identity is its content: the sha256 of every file that decides its numbers.

Files that count: weights (*.safetensors, *.bin, *.pt), configs and indexes (*.json),
tokenizer files (*.model, *.tiktoken, *.txt, *.jinja) and remote code (*.py), in the
checkpoint directory itself. Prose (*.md) and dotfiles do not count.

Hashing 550 GB on every run would cost minutes, so each file's digest is memoised under
$DIAG_CACHE_DIR/digests, keyed by its resolved path and its stat: size, mtime_ns, ctime_ns,
inode and device. Any write to a file changes its ctime (which no user tool can set back),
so a rewritten, retrained or corrupted file is hashed again; an unchanged one is not read.
Worked example: model.safetensors rewritten in place with the same size and an mtime
restored by `touch -r` -> ctime differs -> memo miss -> re-hashed.

This module knows files and hashes; nothing about models.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_COUNTED = (".safetensors", ".bin", ".pt", ".json", ".model", ".tiktoken", ".txt", ".jinja", ".py")
_CHUNK = 8 << 20


def cache_root() -> Path:
    """$DIAG_CACHE_DIR, else ~/.cache/diag (an empty value counts as unset, never the cwd)."""
    base = os.environ.get("DIAG_CACHE_DIR")
    return Path(base).expanduser() if base else Path.home() / ".cache" / "diag"


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "ino": st.st_ino, "dev": st.st_dev}


def _memo_file(stat: dict) -> Path:
    return cache_root() / "digests" / (hashlib.sha256(stat["path"].encode()).hexdigest()[:32] + ".json")


def _hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    """sha256 of the file's bytes, from the memo when the file's stat is unchanged."""
    path = Path(path)
    stat = _stat_key(path)
    memo = _memo_file(stat)
    try:
        saved = json.loads(memo.read_text())
        if {k: saved.get(k) for k in stat} == stat and isinstance(saved.get("sha256"), str):
            return saved["sha256"]
    except (OSError, ValueError):
        pass
    digest = _hash(path)
    if _stat_key(path) == stat:                      # unchanged while we read it
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"{memo.name}.tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps({**stat, "sha256": digest}))
            os.replace(tmp, memo)
        except BaseException:         # an interrupt leaves no half-written memo
            tmp.unlink(missing_ok=True)
            raise
    return digest


def counted_files(directory: Path) -> list[Path]:
    return sorted(p for p in Path(directory).iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix in _COUNTED)


def checkpoint_identity(directory: str | Path, *, threads: int = 8) -> str:
    """sha256 over (file name, file digest) of every counted file, in name order."""
    files = counted_files(Path(directory))
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(files)))) as pool:
        digests = list(pool.map(file_digest, files))
    h = hashlib.sha256()
    for f, d in zip(files, digests):
        h.update(f"{f.name}\0{d}\0".encode())
    return h.hexdigest()
