"""SGLang's released wheels, whole, from the one wheel cache (diag.engines.wheels): the one place
diag and its tests get SGLang's source from (server_flags_gen reads the launch flags out of them;
the differential tests' tests/sglang_wheels.py loads capture rules, trees and metrics from the
same wheels).

    wheel("0.5.23") -> CACHE/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
    CACHE = $DIAG_SGLANG_WHEELS, else $DIAG_CACHE_DIR (or ~/.cache/diag) / sglang-wheels

Whole wheels (pure wheels up to 0.5.10.post1; every release ships for CPython 3.11 on x86_64
Linux), each kept (6 MB for 0.5.6, 39 MB for 0.5.23); fetched by diag.engines.wheels.download,
atomically, so fetches of several versions at once (the tests run four) never see half a wheel.
sglang itself is never imported (it needs its CUDA stack). This module knows where SGLang's
wheels are kept; nothing about what a wheel contains.
"""

from __future__ import annotations

import os
from pathlib import Path

from diag.engines.wheels import WheelError, cache_dir, download

__all__ = ["WheelError", "cached", "wheel", "wheel_dir"]


def wheel_dir() -> Path:
    """$DIAG_SGLANG_WHEELS, else $DIAG_CACHE_DIR/sglang-wheels."""
    return Path(os.environ.get("DIAG_SGLANG_WHEELS") or cache_dir("sglang"))


def cached(version: str) -> Path | None:
    """The version's wheel if it is in the cache."""
    found = sorted(wheel_dir().glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def wheel(version: str) -> Path:
    """The sglang==version wheel, downloaded once."""
    return download("sglang", version, wheel_dir())
