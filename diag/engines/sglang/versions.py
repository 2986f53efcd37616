"""The serving engines diag knows, by name and version, and how a versioned rule is looked up.

An engine is named "sglang-0.5.23" (case `[serving] engine`, `--engine` on run / lint /
effective / explain); the default is the newest known release. diag knows every SGLang
release from 0.5.6 to 0.5.23: each one's wheel was read (`pip download --no-deps
sglang==X`) and the differential tests (tests/test_sglang_*.py) run its own code.

A versioned rule is a `Since` table: ((first version, value), ...) in release order, the
value holding from its version until the next entry. One lookup, `since(table, engine)`, and
one way to name the range a value holds for, `span(table, i)`.
Worked example, the accept-rate formula (accept_rate.py):
    table = (("0.5.6", "legacy"), ("0.5.11", "drafts-only"))
    since(table, engine("sglang-0.5.10.post1")) -> "legacy"
    since(table, engine("sglang-0.5.11"))       -> "drafts-only"
    span(table, 0) -> "0.5.6–0.5.10.post1";  span(table, 1) -> "0.5.11–0.5.23"
Versions compare as release tuples: "0.5.10.post1" -> (0, 5, 10, 1) < "0.5.11" -> (0, 5, 11, 0).

This module knows names and versions; the rules themselves live in the modules beside it.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

from diag.engines.protocol import Release, release_tuple
from diag.errors import DiagError

T = TypeVar("T")

# Every release on PyPI from 0.5.6 to 0.5.23, in release order.
RELEASES: tuple[str, ...] = (
    "0.5.6", "0.5.6.post1", "0.5.6.post2", "0.5.7", "0.5.8", "0.5.8.post1", "0.5.9",
    "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1",
    "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20",
    "0.5.21", "0.5.22", "0.5.23",
)


release = release_tuple
Engine = Release          # one SGLang release: Release("sglang", "0.5.23", "SGLang")


ENGINES: dict[str, Engine] = {f"sglang-{v}": Release("sglang", v, "SGLang") for v in RELEASES}
DEFAULT_ENGINE = f"sglang-{RELEASES[-1]}"


def engine(name: str | Engine | None = None) -> Engine:
    """The named engine (default: the newest known), or a DiagError listing the known ones.
    "0.5.23" and "sglang-0.5.23" both name SGLang 0.5.23."""
    if isinstance(name, Engine):
        return name
    key = name or DEFAULT_ENGINE
    if not key.startswith("sglang-"):
        key = f"sglang-{key}"
    if key not in ENGINES:
        raise DiagError("unknown serving engine version", field="engine",
                        expected="one of " + ", ".join(ENGINES), found=repr(name),
                        hint="diag knows every SGLang release from 0.5.6 to 0.5.23; name the one "
                             "your server runs (pip show sglang on the server)")
    return ENGINES[key]


Since = Sequence[tuple[str, T]]


def since(table: Since, eng: Engine | str | None) -> T:
    """The value `table` gives at this engine's version (see the module docstring)."""
    rel = engine(eng).release
    hits = [value for first, value in table if release(first) <= rel]
    if not hits:
        raise DiagError(f"no rule for {engine(eng).label}", field="engine",
                        expected=f">= {table[0][0]}", found=engine(eng).version)
    return hits[-1]


def span(table: Since, i: int) -> str:
    """The releases entry i of `table` holds for: "0.5.6–0.5.10.post1", or "0.5.14–0.5.23"."""
    first = table[i][0]
    if i + 1 < len(table):
        nxt = release(table[i + 1][0])
        last = [v for v in RELEASES if release(v) < nxt][-1]
    else:
        last = RELEASES[-1]
    return first if last == first else f"{first}–{last}"


def span_of(table: Since, eng: Engine | str | None) -> str:
    """The range of releases that share this engine's value: span of its entry."""
    rel = engine(eng).release
    i = max(j for j, (first, _) in enumerate(table) if release(first) <= rel)
    return span(table, i)
