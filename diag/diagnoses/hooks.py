"""The registered diagnoses (diag/diagnoses/__init__.py) run as one step of each stage: the
pipeline computes their sections, the envelope writes them, the verdicts gather theirs, the
report renders their Markdown and plots, and the report's JSON Schema gains a definition per
section generated from its dataclass.

Sections travel as {name: Section or None}; a name the run did not compute (a RunResult built
by hand) reads as None. report.json writes them in registry order; report.md, the plots and the
verdict list show each at its `place` (protocol.PLACES) among the core's sections, in registry
order within a place unless the registry's ORDER lists another for that output (those listed
first, in its order; ORDER lists report keys), e.g. with registry (A: serving, B: prompt side, C: serving) and
ORDER = {"verdicts": ("C", "A")}:

    report.json  ..., "A", "B", "C", ...
    report.md    ... acceptance by dataset, B, A, C, candidates ...
    verdicts     ... engines', C's, A's, decoding's, B's (then sorted by severity, stably)

This module knows the registry and the protocol; it knows no diagnosis.
"""

from __future__ import annotations

import copy
from pathlib import Path

from diag.diagnoses import DIAGNOSES, ORDER
from diag.diagnoses.protocol import PLACES, PROMPT_SIDE, Context, Loaded, Offered


def needed() -> frozenset[str]:
    """What the registered diagnoses ask of the target pass (protocol.NEEDS_*): run/inputs.py
    cuts the long-prompt ladder only when one asks for it."""
    return frozenset().union(*(d.needs for d in DIAGNOSES))


OUTPUTS = ("markdown", "plots", "verdicts")


def placed(place: str, output: str) -> list:
    """The diagnoses at `place`, in the order `output` shows them."""
    if place not in PLACES or output not in OUTPUTS:
        raise ValueError(f"unknown place {place!r} or output {output!r}; one of {PLACES}, {OUTPUTS}")
    listed = ORDER.get(output, ())
    here = [d for d in DIAGNOSES if d.place == place]
    return sorted(here, key=lambda d: listed.index(d.name) if d.name in listed else len(listed))


def prepare_all(inp) -> tuple:
    """(inputs, {name: state}): every diagnosis's prepare() in registry order, before any weight
    is loaded; each sees the inputs the one before it returned."""
    states = {}
    for d in DIAGNOSES:
        inp, states[d.name] = d.prepare(inp)
    return inp, states


def validate_lines_all(case, prompt_ids: list[str], target_config: dict | None = None) -> list[str]:
    """`diag validate`'s lines of every diagnosis's own inputs, in registry order."""
    return [line for d in DIAGNOSES for line in d.validate_lines(case, prompt_ids, target_config)]


def with_model_all(states: dict, regime: str, model, loaded: Loaded) -> None:
    for d in DIAGNOSES:
        d.with_model(states.get(d.name), regime, model, loaded)


def compute_all(ctx: Context) -> dict:
    """{name: Section or None} in registry order."""
    return {d.name: d.compute(ctx) for d in DIAGNOSES}


def sections_json(sections: dict) -> dict:
    """{key: report.json value} in registry order (null for a section not computed)."""
    return {d.key: d.to_json(sections.get(d.name)) for d in DIAGNOSES}


def verdicts_all(sections: dict, place: str = PROMPT_SIDE) -> list:
    """The verdicts of the diagnoses at `place`; each may read what the others' sections offer."""
    others = Offered(sections)
    return [v for d in placed(place, "verdicts")
            if (sec := sections.get(d.name)) is not None for v in d.verdicts(sec, others)]


def leading_all(sections: dict) -> list:
    """The verdicts that lead their severity in the whole list, wherever their diagnosis sits."""
    return [v for d in DIAGNOSES if (sec := sections.get(d.name)) is not None for v in d.leading(sec)]


def markdown_all(rep: dict, place: str = PROMPT_SIDE) -> list[str]:
    """report.md lines of every diagnosis at `place` whose section the report holds, read back typed."""
    return [line for d in placed(place, "markdown")
            if (sec := d.read(rep)) is not None for line in d.markdown(sec, rep)]


def plots_all(rep: dict, folder: Path, place: str = PROMPT_SIDE, draw=None) -> list[dict]:
    """The PNGs of the diagnoses at `place` whose section the report holds; `draw(d, sec, rep,
    folder)` draws one diagnosis's (report/plot_cache.py passes its cached drawing)."""
    draw = draw or (lambda d, sec, rep, folder: d.plots(sec, rep, folder))
    return [p for d in placed(place, "plots")
            if (sec := d.read(rep)) is not None for p in draw(d, sec, rep, Path(folder))]


def report_schema(base: dict) -> dict:
    """diag/schema/report.schema.json (`base`) with every registered section added: a
    `$defs/<key>` generated from its dataclass, a top-level property (null or that), required."""
    schema = copy.deepcopy(base)
    for d in DIAGNOSES:
        schema["$defs"][d.key] = d.schema()
        schema["properties"][d.key] = {"oneOf": [{"type": "null"}, {"$ref": f"#/$defs/{d.key}"}]}
        if d.key not in schema["required"]:
            schema["required"].append(d.key)
    return schema
