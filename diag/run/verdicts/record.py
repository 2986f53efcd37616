"""A verdict: a sentence a ticket can quote, its severity, and the evidence behind it.

Severities, most severe first: error (the deployment is wrong), warning (it loses
acceptance or speed), ok (checked and fine), info (what was measured). This module is the
record only; the producers live beside it, one per subject.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("error", "warning", "ok", "info")


@dataclass(frozen=True)
class Verdict:
    kind: str                   # e.g. "layout-mismatch", "serving-error", "eagle-algorithm"
    severity: str               # one of SEVERITIES
    text: str
    evidence: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"verdict severity {self.severity!r} is not one of {SEVERITIES}")

    def to_json(self) -> dict:
        return {"kind": self.kind, "severity": self.severity, "text": self.text, "evidence": self.evidence}


def fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"
