"""vLLM releases by name, and how a rule's release range is looked up.

An engine is named "vllm-0.32.0" (`--engine vllm-0.32.0`, `[serving] engine = "vllm-0.32.0"`);
"vllm-0.9.0.1" and "vllm-0.8.5.post1" too. diag knows every vLLM release on PyPI from the first
with EAGLE-3 (0.8.5: vllm/model_executor/models/llama_eagle3.py appears) to the newest it read
(table.py, RELEASES, written by rules_gen from the wheels).

Versions compare as tuples (major, minor, patch, fourth, post):
    "0.9.0.1"     -> (0, 9, 0, 1, 0)  > "0.9.0"  -> (0, 9, 0, 0, 0)
    "0.8.5.post1" -> (0, 8, 5, 0, 1)  < "0.9.0"
A rule is a row (name, first, last, value): it holds for every known release r with
first <= r <= last. `rule("aux_default.llama", "vllm-0.32.0")` -> the value for 0.32.0.

This module knows names, versions and ranges; the rules themselves are table.py's data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.engines.vllm.table import RELEASES, ROWS, Rule
from diag.errors import DiagError

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.(\d+))?(?:\.post(\d+))?$")
PREFIX = "vllm-"


def release(text: str) -> tuple[int, int, int, int, int]:
    """"0.9.0.1" -> (0, 9, 0, 1, 0); "0.8.5.post1" -> (0, 8, 5, 0, 1)."""
    m = _VERSION.match(text)
    if not m:
        raise DiagError("not a vLLM release version", field="engine",
                        expected="e.g. vllm-0.32.0, vllm-0.9.0.1 or vllm-0.8.5.post1", found=repr(text))
    return tuple(int(g or 0) for g in m.groups())


@dataclass(frozen=True)
class VllmRelease:
    """One vLLM release: name "vllm-0.32.0", version "0.32.0", label "vLLM 0.32.0"."""

    version: str

    @property
    def name(self) -> str:
        return PREFIX + self.version

    @property
    def label(self) -> str:
        return f"vLLM {self.version}"

    @property
    def key(self) -> tuple[int, int, int, int, int]:
        return release(self.version)


NEWEST = RELEASES[-1]


def is_vllm(name: str | None) -> bool:
    """True for "vllm-..." names (and "vllm" alone, meaning the newest)."""
    return bool(name) and (name == "vllm" or name.startswith(PREFIX))


def vllm_release(name: str | VllmRelease | None = None) -> VllmRelease:
    """"vllm-0.32.0" / "0.32.0" / "vllm" / None (newest) -> VllmRelease, or a DiagError that lists
    the releases diag knows and says which ones have no EAGLE-3."""
    if isinstance(name, VllmRelease):
        return name
    text = name or "vllm"
    version = NEWEST if text == "vllm" else text[len(PREFIX):] if text.startswith(PREFIX) else text
    key = release(version)
    if version in RELEASES:
        return VllmRelease(version)
    if key < release(RELEASES[0]):
        why = f"vLLM {version} predates EAGLE-3 (first in vLLM {RELEASES[0]})"
    elif key > release(NEWEST):
        why = f"diag has read vLLM's rules up to {NEWEST}; regenerate them with " \
              "`python -m diag.engines.vllm.rules_gen` once vllm " + version + " is on PyPI"
    else:
        why = "no such vLLM release on PyPI"
    raise DiagError("unknown vLLM release", field="engine",
                    expected=f"vllm-X.Y.Z with X.Y.Z one of {RELEASES[0]} .. {NEWEST} "
                             f"({len(RELEASES)} releases)", found=repr(name), hint=why)


def rule_row(name: str, eng: str | VllmRelease | None) -> Rule:
    """The row of rule `name` whose range holds this release."""
    r = vllm_release(eng)
    rows = [row for row in ROWS if row.name == name]
    if not rows:
        raise KeyError(f"no vLLM rule named {name!r}")
    for row in rows:
        if release(row.first) <= r.key <= release(row.last):
            return row
    raise KeyError(f"vLLM rule {name!r} has no row for {r.version}")


def rule(name: str, eng: str | VllmRelease | None):
    """The value of rule `name` at this release."""
    return rule_row(name, eng).value


def span(row: Rule) -> str:
    """"0.8.5–0.10.2", or "0.34.0" for a one-release range."""
    return row.first if row.first == row.last else f"{row.first}–{row.last}"


# Rules that are data diag compares, not behaviour it executes: a release where only these change
# needs no differential run (SpeculativeConfig gains a key in most releases; generation_config.json
# keys vLLM forwards only grow).
DATA_ONLY = ("spec_config_keys", "request_defaults")


def rule_change_releases(*, executed: bool = False) -> tuple[str, ...]:
    """The first release of every rule's every range, and the newest; with executed=True only the
    rules whose functions the differential tests run (the set CI executes)."""
    rows = [row for row in ROWS if not (executed and row.name in DATA_ONLY)]
    firsts = {row.first for row in rows} | {NEWEST}
    return tuple(v for v in RELEASES if v in firsts)
