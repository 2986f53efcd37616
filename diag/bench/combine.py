"""`diag bench combine A.json B.json --out C.json`: one GPU bench result from the sections of
several runs on the same kind of GPU, with the 61-layer extrapolation computed over them.

Why: a device lease runs one command for at most 10 minutes, and `--sections load,e2e,grown
--e2e-sampled` needs more; run `--sections load` in one call and `--sections e2e,grown` in the
next, then combine. Rules:
  - every input is a bench result (bench_version, kind "gpu") of this bench version, on a GPU of
    the same name (machine.gpu): a section's rates are that device's, and the extrapolation
    multiplies them together;
  - a section comes from the first input that measured it whole (no error, not "incomplete":
    a call stopped at its time limit); `combined_from`
    says which file, commit and start time gave each, `combined_git` the code that combined;
  - the figures derived from measured rows are computed again with this version's code (the
    grown section's decode-loop fit from its probe rows, round_slope.fit), then the
    extrapolation (gpu._finish).
Worked example: load.json (ceilings, checkpoint, load), e2e.json (ceilings, checkpoint, e2e,
grown) -> ceilings, checkpoint from load.json, e2e and grown from e2e.json, extrapolation new.
This module knows bench result files; nothing about measuring.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from diag.errors import DiagError

DERIVED = ("extrapolation", "decode_bandwidth")      # computed over the others by gpu._finish, never taken


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DiagError("cannot read a bench result to combine", file=str(path), expected="a bench JSON",
                        found=repr(err)) from err
    if not isinstance(data, dict) or not isinstance(data.get("sections"), dict) or "bench_version" not in data:
        raise DiagError("not a bench result", file=str(path), field="bench_version / sections",
                        expected="a `diag bench gpu` JSON", found=sorted(data)[:8] if isinstance(data, dict) else type(data).__name__)
    return data


def combine(paths: list[Path]) -> dict:
    """The combined result (module docstring); nothing written."""
    from diag.bench.common import BENCH_VERSION, git_hash

    if len(paths) < 2:
        raise DiagError("combine takes at least two bench results", field="inputs", expected="2 or more JSON files",
                        found=[str(p) for p in paths])
    runs = [(Path(p), _read(Path(p))) for p in paths]
    first_path, first = runs[0]
    gpu = first.get("machine", {}).get("gpu")
    for path, data in runs:
        checks = (("kind", data.get("kind"), "gpu"), ("bench_version", data.get("bench_version"), BENCH_VERSION),
                  ("machine.gpu", data.get("machine", {}).get("gpu"), gpu))
        for field, found, expected in checks:
            if found != expected or found is None:
                raise DiagError("bench results from different benches or devices cannot be combined", file=str(path),
                                field=field, expected=f"{expected!r} (as {first_path.name})", found=repr(found))
    sections: dict = {}
    taken: dict[str, list[str]] = {}
    for path, data in runs:
        for name, sec in data["sections"].items():
            if name in DERIVED or name in sections or "error" in sec or "incomplete" in sec:
                continue
            sections[name] = sec
            taken.setdefault(str(path), []).append(name)
    if "grown" in sections and "sampled_round_probe" in sections["grown"]:
        from diag.bench.round_slope import fit, split_fit
        g = dict(sections["grown"])
        probe = g["sampled_round_probe"]
        g["sampled_round_slope"] = fit(probe.get("base", {"error": "no base probe"}),
                                       probe.get("grown", {"error": "no grown probe"}),
                                       g["layers"] - g["base_layers"])
        if "split_round_probe" in g:
            g["split_round_slope"] = split_fit(g["split_round_probe"].get("base"), g["split_round_probe"].get("grown"),
                                               g["layers"] - g["base_layers"])
        sections["grown"] = g
    return {**{k: v for k, v in first.items() if k != "sections"}, "sections": sections,
            "combined": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "combined_git": git_hash(),
            "combined_from": [{"file": Path(p).name, "git": d.get("git"), "started": d.get("started"),
                               "sections": taken.get(str(p), [])} for p, d in runs]}


def write(paths: list[Path], out: Path) -> dict:
    """combine, then the extrapolation over its sections (gpu._finish writes `out`)."""
    from diag.bench.gpu import _finish

    return _finish(combine(paths), out)
