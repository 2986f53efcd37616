"""report.md: the verdicts and one table first, then what was run, then the details; rendered
from report.json only.

A reader who never ran diag must see what is wrong in the first lines, and exactly what was
run below it. SECTIONS is the reading order: each entry is a function `rep -> lines`
(diag/report/sections/, no lines when the report lacks its data). A new section is one
function there and one entry here. This module reads the report dict; it computes nothing new.
"""

from __future__ import annotations

from typing import Callable

from diag.diagnoses.hooks import markdown_all
from diag.diagnoses.protocol import SERVING
from diag.report.decoding_section import decoding_lines
from diag.report.prompt_side_md import prompt_side
from diag.report.sections import acceptance, engines, head, provenance

Section = Callable[[dict], list[str]]


def serving_diagnoses(rep: dict) -> list[str]:
    """The registered diagnoses placed on the serving side (diag/diagnoses/, protocol.SERVING)."""
    return markdown_all(rep, SERVING)


SECTIONS: tuple[Section, ...] = (
    head.title,
    head.verdicts,
    head.primary_table,
    engines.engines,
    provenance.what_ran,
    acceptance.by_tree,
    decoding_lines,
    acceptance.by_position,
    prompt_side,
    serving_diagnoses,
    provenance.candidates,
    provenance.notes,
)


def render(rep: dict, sections: tuple[Section, ...] = SECTIONS) -> str:
    return "\n".join(line for section in sections for line in section(rep)) + "\n"
