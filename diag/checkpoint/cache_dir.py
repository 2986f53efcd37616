"""The cache directory can take what a run writes: checked before any weight is loaded.

A run writes target passes ($DIAG_CACHE_DIR/passes) and file digests ($DIAG_CACHE_DIR/digests)
under the cache root (diag.checkpoint.identity.cache_root, default ~/.cache/diag). An
unwritable root used to fail only when the finished pass was saved, losing the whole target
pass; now it fails first, naming the directory and the way out (--no-cache): the folders are
created and a probe file written in each before any work.
Worked example: DIAG_CACHE_DIR=/ro/cache on a read-only mount -> DiagError "the cache
directory cannot be written", file /ro/cache, expected "write permission on /ro".

This module knows paths and permissions; nothing about what is cached.
"""

from __future__ import annotations

import os
from pathlib import Path

from diag.checkpoint.identity import cache_root
from diag.errors import DiagError

_SUBDIRS = ("passes", "digests")


def _fail(path: Path, expected: str, found: str) -> None:
    raise DiagError("the cache directory cannot be written", file=str(path), field="$DIAG_CACHE_DIR",
                    expected=expected, found=found,
                    hint="point DIAG_CACHE_DIR at a writable directory, or run with --no-cache")


def check_cache_dir(root: Path | None = None) -> Path:
    """Fail now when the cache root (or its passes / digests folders) cannot be written."""
    root = Path(root or cache_root())
    for path in (root, *(root / s for s in _SUBDIRS)):
        if path.exists() and not path.is_dir():
            _fail(path, "a directory", "a file")
        if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
            _fail(path, f"write permission on {path}", "read-only")
    base = root
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        _fail(root, "a directory path", f"{base} is a file")
    if not os.access(base, os.W_OK | os.X_OK):
        _fail(root, f"write permission on {base}", "read-only")
    for path in (root, *(root / s for s in _SUBDIRS)):
        _probe(path)
    return root


def _probe(path: Path) -> None:
    """Create `path` and a file in it now: permission bits do not tell everything (root may
    write anywhere by mode, yet not under /proc or on a read-only mount, where the saved
    pass used to fail after the whole target pass). Example: DIAG_CACHE_DIR=/proc/diag-cache
    -> mkdir fails with ENOENT -> DiagError before any weight is read."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".diag-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        _fail(path, f"a directory diag can create and write ({path})", err.strerror or str(err))
