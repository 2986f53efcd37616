"""SGLang's released wheels, fetched once into the cache: the one place diag and its tests get
SGLang's source from (server_flags_gen reads the launch flags out of them; the differential
tests' tests/sglang_wheels.py loads capture rules, trees and metrics from the same wheels).

    wheel("0.5.23") -> CACHE/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
    CACHE = $DIAG_SGLANG_WHEELS, else $DIAG_CACHE_DIR (or ~/.cache/diag) / sglang-wheels

`pip download --no-deps` for CPython 3.11 on x86_64 Linux (the platform every release ships
for; pure wheels up to 0.5.10.post1), into a temporary folder inside the cache, then renamed
into place: fetches of several versions at once (the tests run four) or of the same one never
see half a wheel. Each wheel is kept (6 MB for 0.5.6, 39 MB for 0.5.23). sglang itself is
never imported (it needs its CUDA stack). This module knows pip and files; nothing about what
a wheel contains.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from diag.checkpoint.identity import cache_root


class WheelError(RuntimeError):
    """pip could not fetch a release (no index, no such version)."""


def wheel_dir() -> Path:
    """$DIAG_SGLANG_WHEELS, else $DIAG_CACHE_DIR/sglang-wheels."""
    return Path(os.environ.get("DIAG_SGLANG_WHEELS") or cache_root() / "sglang-wheels")


def cached(version: str) -> Path | None:
    """The version's wheel if it is in the cache."""
    found = sorted(wheel_dir().glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def wheel(version: str) -> Path:
    """The sglang==version wheel, downloaded once."""
    have = cached(version)
    if have is not None:
        return have
    root = wheel_dir()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
               "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
               "--platform", "manylinux_2_34_x86_64", f"sglang=={version}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        got = sorted(Path(tmp).glob(f"sglang-{version}-*.whl"))
        if done.returncode != 0 or not got:
            raise WheelError(f"pip download --no-deps sglang=={version} failed (exit {done.returncode}); "
                             f"pip said:\n{done.stderr[-2000:]}")
        final = root / got[0].name
        os.replace(got[0], final)              # atomic: whoever looks sees no wheel or the whole one
    return final
