"""A /metrics scrape (Prometheus text format) taken twice: the counters of one probe as the
difference of the two, and the models the samples name.

Delta rule: a sample of a counter family (`# TYPE x counter`, samples `x_total`) or of a
histogram/summary (`_bucket`, `_count`, `_sum`) is written as after - before for the same
name and labels (a series new in `after` counts from 0); every other line (gauges, `_created`
timestamps, comments) is copied from `after`. The result is a scrape in the same format, so
diag.engines.vllm.metrics reads it as it reads any saved /metrics.
Worked example: before `vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0`,
after `... 598.0` -> the delta scrape says `... 558.0`.

Traffic from other clients during the probe lands in the same counters; `finished_requests`
counts the requests that finished meanwhile, so the caller can say so.

This module knows the text format; nothing about HTTP or engines' meanings (diag.probe takes the
scrapes; the engines read them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)(?P<rest>.*)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_TYPE = re.compile(r'^#\s*TYPE\s+(\S+)\s+(\S+)')
CUMULATIVE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                       "summary": ("_count", "_sum")}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: str          # the label block as written, "" or '{engine="0",...}'
    value: float


def _types(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for line in text.splitlines() if (m := _TYPE.match(line.strip()))}


def _cumulative(name: str, types: dict[str, str]) -> bool:
    """By the family's # TYPE; a sample no TYPE line covers counts when it ends in _total."""
    for family, kind in types.items():
        if name == family:
            return kind == "counter" and name.endswith("_total")
        for suffix in ("_total", "_bucket", "_count", "_sum", "_created", "_info", "_gsum", "_gcount"):
            if name == family + suffix:
                return suffix in CUMULATIVE_SUFFIXES.get(kind, ())
    return name.endswith("_total")


def samples(text: str) -> list[Sample]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None or line.lstrip().startswith("#"):
            continue
        try:
            out.append(Sample(m.group("name"), m.group("labels") or "", float(m.group("value"))))
        except ValueError:
            continue
    return out


def delta(before: str, after: str) -> str:
    """`after` with every cumulative sample replaced by after - before (module docstring)."""
    types = {**_types(before), **_types(after)}
    old = {(s.name, s.labels): s.value for s in samples(before)}
    lines = ["# diag probe: cumulative samples are (after - before) of this probe's scrapes"]
    for line in after.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None or line.lstrip().startswith("#") or not _cumulative(m.group("name"), types):
            lines.append(line)
            continue
        key = (m.group("name"), m.group("labels") or "")
        try:
            value = float(m.group("value")) - old.get(key, 0.0)
        except ValueError:
            lines.append(line)
            continue
        lines.append(f"{key[0]}{key[1]} {value!r}")
    return "\n".join(lines) + "\n"


def label_values(text: str, label: str, prefix: str) -> set[str]:
    """Every value of `label` on samples whose name starts with `prefix` ('vllm:', 'sglang:')."""
    return {v for s in samples(text) if s.name.startswith(prefix)
            for k, v in _LABEL.findall(s.labels) if k == label}


def total(text: str, name: str) -> float | None:
    """The sum of `name` over its series; None when absent."""
    hits = [s.value for s in samples(text) if s.name == name]
    return sum(hits) if hits else None


def names(text: str) -> set[str]:
    return {s.name for s in samples(text)}
