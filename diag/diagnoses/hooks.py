"""The registered diagnoses (diag/diagnoses/__init__.py) run as one step of each stage: the
pipeline computes their sections, the envelope writes them, the verdicts gather theirs, the
report renders their Markdown and plots, and the report's JSON Schema gains a definition per
section generated from its dataclass.

Sections travel as {name: Section or None}; a name the run did not compute (a RunResult built
by hand) reads as None. This module knows the registry and the protocol; it knows no diagnosis.
"""

from __future__ import annotations

import copy
from pathlib import Path

from diag.diagnoses import DIAGNOSES
from diag.diagnoses.protocol import Context


def needed() -> frozenset[str]:
    """What the registered diagnoses ask of the target pass (protocol.NEEDS_*): run/inputs.py
    cuts the long-prompt ladder only when one asks for it."""
    return frozenset().union(*(d.needs for d in DIAGNOSES))


def compute_all(ctx: Context) -> dict:
    """{name: Section or None} in registry order."""
    return {d.name: d.compute(ctx) for d in DIAGNOSES}


def sections_json(sections: dict) -> dict:
    """{name: report.json value} in registry order (null for a section not computed)."""
    return {d.name: d.to_json(sections.get(d.name)) for d in DIAGNOSES}


def verdicts_all(sections: dict) -> list:
    return [v for d in DIAGNOSES if (sec := sections.get(d.name)) is not None for v in d.verdicts(sec)]


def markdown_all(rep: dict) -> list[str]:
    """report.md lines of every diagnosis whose section the report holds, read back typed."""
    return [line for d in DIAGNOSES if (sec := d.read(rep)) is not None for line in d.markdown(sec, rep)]


def plots_all(rep: dict, folder: Path) -> list[dict]:
    return [p for d in DIAGNOSES if (sec := d.read(rep)) is not None for p in d.plots(sec, rep, Path(folder))]


def report_schema(base: dict) -> dict:
    """diag/schema/report.schema.json (`base`) with every registered section added: a
    `$defs/<name>` generated from its dataclass, a top-level property (null or that), required."""
    schema = copy.deepcopy(base)
    for d in DIAGNOSES:
        schema["$defs"][d.name] = d.schema()
        schema["properties"][d.name] = {"oneOf": [{"type": "null"}, {"$ref": f"#/$defs/{d.name}"}]}
        if d.name not in schema["required"]:
            schema["required"].append(d.name)
    return schema
