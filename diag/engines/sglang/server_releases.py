"""Which SGLang releases diag can read server output from, and the version rules those readers
share: the accept-rate formula of the decode log line and the release ranges of formats.

Covered: every release from 0.5.6 to 0.5.23, each read from its wheel
(`pip download --no-deps sglang==X`). A server release is named like an engine
("sglang-0.5.8") or by its version ("0.5.8", what `/server_info` reports as `version`).

The accept-rate formula of the decode log line (where the metrics code divides):
  0.5.6 - 0.5.10.post1   spec_num_accepted_tokens / (rounds · D), bonus counted
                         -> sglang_accept_rate_legacy = metrics.bonus_accept_rate = Σ(a+1) / (rounds·D)
  0.5.11 - 0.5.23        (accept tokens - rounds) / (rounds · (D-1)), drafts only
                         -> sglang_accept_rate = metrics.draft_accept_rate = Σa / (rounds·(D-1))
Worked example: a depth-1 chain (D = 2) accepting its one draft 68% of the time logs
"accept len: 1.68, accept rate: 0.84" on 0.5.10 and "accept len: 1.68, accept rate: 0.68"
on 0.5.11.

This module knows release numbers; it reads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.engines.sglang.accept_rate import FORMULA
from diag.engines.sglang.versions import release
from diag.errors import DiagError

Release = tuple[int, int, int, int]

FIRST_COVERED: Release = (0, 5, 6, 0)
LAST_COVERED: Release = (0, 5, 23, 0)
NEW_RATE_SINCE: Release = release(FORMULA[-1][0])   # (0, 5, 11, 0): Σa / (rounds·(D-1)) from here on (accept_rate.py)


@dataclass(frozen=True)
class ReleaseRange:
    """Releases [lo, hi], both included. Example: ReleaseRange((0,5,6,0), (0,5,8,0)) = 0.5.6-0.5.8."""

    lo: Release = FIRST_COVERED
    hi: Release = LAST_COVERED

    def __and__(self, other: "ReleaseRange") -> "ReleaseRange | None":
        lo, hi = max(self.lo, other.lo), min(self.hi, other.hi)
        return ReleaseRange(lo, hi) if lo <= hi else None

    def __contains__(self, rel: Release) -> bool:
        return self.lo <= rel <= self.hi

    def __str__(self) -> str:
        lo, hi = show(self.lo), show(self.hi)
        return lo if lo == hi else f"{lo} - {hi}"


def show(rel: Release) -> str:
    """(0, 5, 10, 1) -> "0.5.10.post1"; (0, 5, 8, 0) -> "0.5.8"."""
    base = ".".join(str(x) for x in rel[:3])
    return base + (f".post{rel[3]}" if rel[3] else "")


def server_release(name: str, *, field: str = "server.engine", file: str | None = None) -> Release:
    """"sglang-0.5.8" or "0.5.8" -> (0, 5, 8, 0), checked against the covered releases."""
    text = name.strip()
    text = text[len("sglang-"):] if text.startswith("sglang-") else text
    try:
        rel = release(text)
    except DiagError:
        raise DiagError("not an SGLang release", file=file, field=field,
                        expected="e.g. sglang-0.5.8 or 0.5.10.post1", found=repr(name)) from None
    if rel not in ReleaseRange():
        raise DiagError("diag cannot read server output of this SGLang release", file=file, field=field,
                        expected=f"a release in {ReleaseRange()}", found=show(rel))
    return rel


def rate_formula(rel: Release) -> str:
    """The metrics.py name of the decode line's accept-rate formula at this release."""
    return "sglang_accept_rate" if rel >= NEW_RATE_SINCE else "sglang_accept_rate_legacy"
