"""The serving engines diag knows, by name and version, and what each decides per target.

An engine is named "sglang-0.5.23" (case `[serving] engine`, `--engine` on run / lint /
effective / explain). Every rule that depends on the engine is reached through an Engine,
so a report can say which version's rules it applied. Versions compare as release tuples:
"0.5.10.post1" -> (0, 5, 10, 1) < "0.5.11" -> (0, 5, 11, 0).

This module knows names and versions; the rules themselves live in the modules beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.errors import DiagError

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$")


def release(text: str) -> tuple[int, int, int, int]:
    """"0.5.10.post1" -> (0, 5, 10, 1); "0.5.23" -> (0, 5, 23, 0)."""
    m = _VERSION.match(text)
    if not m:
        raise DiagError("not a release version", field="engine", expected="e.g. 0.5.23 or 0.5.10.post1",
                        found=repr(text))
    return tuple(int(g or 0) for g in m.groups())


@dataclass(frozen=True)
class Engine:
    """One engine release. `capture_conventions`: which layer-id convention its capture code
    applies for each target capture model (see architectures.capture_model)."""

    name: str                                   # "sglang-0.5.23"
    version: str                                # "0.5.23"
    capture_conventions: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        return f"SGLang {self.version}"

    @property
    def release(self) -> tuple[int, int, int, int]:
        return release(self.version)

    def convention_for(self, capture_model: str) -> str:
        return dict(self.capture_conventions)[capture_model]


def _sglang(version: str, **conventions: str) -> Engine:
    return Engine(f"sglang-{version}", version, tuple(sorted(conventions.items())))


ENGINES: dict[str, Engine] = {
    e.name: e for e in (
        _sglang("0.5.23", llama="sglang-llama", deepseek="sglang-deepseek"),
    )
}
DEFAULT_ENGINE = "sglang-0.5.23"


def engine(name: str | None = None) -> Engine:
    """The named engine (default: the newest known), or a DiagError listing the known ones."""
    key = name or DEFAULT_ENGINE
    if key not in ENGINES:
        raise DiagError("unknown serving engine version", field="engine",
                        expected="one of " + ", ".join(ENGINES), found=repr(name))
    return ENGINES[key]
