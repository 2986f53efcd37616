"""The registry of serving engines: which families diag knows and how a release is named.

A release is "<family>-<version>" ("sglang-0.5.23", "vllm-0.32.0"); a bare version
("0.5.23") names the first family listed, the one diag has always defaulted to. `rules(name)`
gives the family's EngineRules (protocol.py); `engine(name)` the Release. The families are
imported lazily, by module path, so that an engine package may import diag.engines.common
without a cycle. Adding a family is one line in FAMILIES.

Worked example: engine("vllm-0.32.0") -> Release("vllm", "0.32.0", "vLLM");
engine("0.5.23") -> Release("sglang", "0.5.23", "SGLang"); engine(None) -> DEFAULT_ENGINE's.
This module is the only place outside the engine packages that names a family.
"""

from __future__ import annotations

from importlib import import_module

from diag.engines.protocol import EngineRules, Release
from diag.errors import DiagError

# family -> the module whose RULES object implements EngineRules
FAMILIES: dict[str, str] = {
    "sglang": "diag.engines.sglang.rules",
    "vllm": "diag.engines.vllm.rules",
}
DEFAULT_FAMILY = "sglang"
DEFAULT_ENGINE = "sglang-0.5.23"


def families() -> tuple[str, ...]:
    """The registered family names, default first: ("sglang", ...)."""
    return tuple(FAMILIES)


def family_rules(family: str) -> EngineRules:
    """The EngineRules of a registered family, or a DiagError listing them."""
    if family not in FAMILIES:
        raise DiagError("unknown serving engine", field="engine", expected="one of " + ", ".join(FAMILIES),
                        found=repr(family))
    return import_module(FAMILIES[family]).RULES


def split(name: str | Release | None) -> tuple[str, str]:
    """("sglang", "0.5.23") for "sglang-0.5.23", "0.5.23" or None (the default)."""
    if isinstance(name, Release):
        return name.family, name.version
    key = name or DEFAULT_ENGINE
    family, sep, version = key.partition("-")
    if sep and family in FAMILIES:
        return family, version
    return DEFAULT_FAMILY, key


def engine(name: str | Release | None = None) -> Release:
    """The named release (default: DEFAULT_ENGINE), or a DiagError naming the covered ones."""
    if isinstance(name, Release):
        return name
    family, version = split(name)
    try:
        return family_rules(family).release(version)
    except DiagError as err:        # name the release as the user wrote it: "sglang-9.9.9", not "9.9.9"
        raise DiagError(err.message, file=err.file, field=err.field, expected=err.expected,
                        found=repr(name) if name else err.found, hint=err.hint) from None


def rules(name: str | Release | None = None) -> EngineRules:
    """The EngineRules of the family a release name belongs to."""
    return family_rules(split(name)[0])


def report_rates() -> tuple:
    """Every family's ReportRates, in registry order: the accept rates reports carry beside the
    accept length (("sglang_accept_rate", draft_accept_rate, "sglang rate"), ...)."""
    return tuple(r for family in FAMILIES for r in family_rules(family).report_rates)


def report_rates_texts() -> tuple[str, ...]:
    """What report.md says of those rates, one sentence a family that has some."""
    return tuple(t for family in FAMILIES if (t := family_rules(family).report_rates_text))


__all__ = ["DEFAULT_ENGINE", "EngineRules", "Release", "engine", "families", "family_rules", "report_rates",
           "report_rates_texts", "rules", "split"]
