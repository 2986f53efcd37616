"""User-facing errors. Every failure a user can cause names where, what was
expected and what was found; and diag's environment variables, read here so that a value a user
mistyped is such an error (env_switch, env_count). This module knows nothing else."""

from __future__ import annotations

import os


class DiagError(Exception):
    """An error the user caused and can fix.

    Example: DiagError("drafter fc width does not match the layout",
    file="drafter/model.safetensors", field="fc.weight",
    expected="[128, 384] (3 capture points x hidden 128)", found="[128, 256]")
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 expected: object = None, found: object = None, hint: str | None = None):
        self.message, self.file, self.field = message, file, field
        self.expected, self.found, self.hint = expected, found, hint
        super().__init__(self.render())

    def render(self) -> str:
        parts = [self.message]
        if self.file is not None:
            parts.append(f"  file:     {self.file}")
        if self.field is not None:
            parts.append(f"  field:    {self.field}")
        if self.expected is not None:
            parts.append(f"  expected: {self.expected}")
        if self.found is not None:
            parts.append(f"  found:    {self.found}")
        if self.hint is not None:
            parts.append(f"  hint:     {self.hint}")
        return "\n".join(parts)


def env_switch(name: str) -> bool | None:
    """A 0/1 switch in the environment: None when unset or empty (the caller's default), else
    "1" -> True, "0" -> False. Example: DIAG_MIX_TREES=yes -> DiagError naming DIAG_MIX_TREES."""
    value = os.environ.get(name, "").strip()
    if value in ("0", "1"):
        return value == "1"
    if value:
        raise DiagError(f"{name} is a switch", field=f"environment variable {name}",
                        expected='"0" or "1" (unset: the default)', found=repr(os.environ[name]))
    return None


def env_count(name: str) -> int | None:
    """A count in the environment: None when unset or empty, else a whole number >= 0.
    Example: DIAG_LOAD_THREADS=eight -> DiagError naming DIAG_LOAD_THREADS."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise DiagError(f"{name} is a count", field=f"environment variable {name}",
                        expected="a whole number (unset: the default)", found=repr(os.environ[name]))
    return int(value)


ENVIRONMENT = {"DIAG_MIX_TREES": env_switch, "DIAG_VERIFY_GRAPHS": env_switch, "DIAG_MLA_LATENT": env_switch,
               "DIAG_LOAD_THREADS": env_count}


def check_environment() -> None:
    """Every diag environment variable a run reads as a switch or a count, checked at once (a run
    checks them before it loads anything)."""
    for name, read in ENVIRONMENT.items():
        read(name)
