"""Where zoo entries live on disk, and how one is published atomically.

Layout: $DIAG_CACHE_DIR (else ~/.cache/diag) / zoo / v{BUILDER_VERSION} / {name}/
An entry directory exists only when complete: it is built in a sibling temp
directory and renamed into place; an exclusive file lock (fcntl) per entry
makes a second process wait instead of building the same entry again.

This module knows paths, locks and renames; it knows nothing about models.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from diag.zoo.recipes import BUILDER_VERSION


def cache_root() -> Path:
    """zoo/v{BUILDER_VERSION} under $DIAG_CACHE_DIR, else ~/.cache/diag."""
    base = os.environ.get("DIAG_CACHE_DIR")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "diag"
    return root / "zoo" / f"v{BUILDER_VERSION}"


def entry_dir(name: str) -> Path:
    return cache_root() / name


def is_built(name: str) -> bool:
    return entry_dir(name).is_dir()


@contextmanager
def entry_lock(name: str) -> Iterator[None]:
    """Exclusive lock on zoo/v{N}/.{name}.lock; blocks while another process holds it."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def publish(name: str, build: Callable[[Path], None],
            keep: Callable[[Path], bool] = lambda _path: True) -> tuple[Path, bool]:
    """Run build(tmp_dir) and rename tmp_dir to entry_dir(name), unless the
    entry already exists (possibly built by another process while we waited
    for the lock) and keep(entry) says it may be served; one it may not is
    deleted first, under the same lock. Returns (path, built_now)."""
    final = entry_dir(name)
    with entry_lock(name):
        if final.is_dir() and keep(final):
            return final, False
        shutil.rmtree(final, ignore_errors=True)
        for stale in final.parent.glob(f".{name}.tmp-*"):   # a killed build's leftovers
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=final.parent))
        try:
            build(tmp)
            _share(tmp)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final, True


def _share(folder: Path) -> None:
    """mkdtemp makes 0700 and safetensors writes 0600; a cache is read by others too."""
    folder.chmod(0o755)
    for f in folder.rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)


def remove(name: str) -> bool:
    """Delete a built entry (under its lock). True if something was removed."""
    final = entry_dir(name)
    with entry_lock(name):
        if not final.is_dir():
            return False
        shutil.rmtree(final)
    return True
