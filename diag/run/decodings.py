"""Which decodings a run evaluates, and which one the server runs (the reference axis).

Sources, most specific first (DESIGN.md §11; the engine's request defaults: EngineRules.request_defaults):
1. the case's [decoding] values or the --temperature / --top-p / --top-k flags: every
   combination is evaluated and the first is what the server runs; a dimension left out
   takes the server's request default;
2. otherwise the server's request default, when the target's generation_config.json sets
   temperature / top_p / top_k (SGLang's --sampling-defaults model, its default; the launch
   command's --sampling-defaults openai turns it off);
3. otherwise greedy.
`served = "greedy"` or a decoding name overrides the choice. Thresholds: the case or flags,
else the launch command's --speculative-accept-threshold-single / -acc, else 1.0. Greedy is
always evaluated (the teacher-forced replay); every sampled decoding runs the decode loop.
This module reads the target's generation_config.json; it knows nothing about models.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from diag.engines.decoding import GREEDY, Decoding, from_values, parse_decoding
from diag.engines import engine, rules
from diag.errors import DiagError
from diag.run.case import Case

CASE_NAMES = {k: f"decoding.{k}" for k in ("temperature", "top_p", "top_k", "threshold_single", "threshold_acc")}


@dataclass(frozen=True)
class DecodingPlan:
    served: Decoding                    # the reference axis: what the server's requests run
    sampled: tuple[Decoding, ...]       # decodings the decode loop evaluates (served first when sampled)
    seeds: tuple[int, ...]
    scope: str                          # "verdicts" | "all"
    source: str                         # where `served` came from
    notes: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"served": self.served.to_dict(), "sampled": [d.to_dict() for d in self.sampled],
                "seeds": list(self.seeds), "scope": self.scope, "source": self.source,
                "lossy": any(d.lossy for d in self.sampled)}


def generation_config(target_path: Path) -> dict | None:
    f = Path(target_path) / "generation_config.json"
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text())
    except json.JSONDecodeError as err:
        raise DiagError("generation_config.json is not valid JSON", file=str(f), expected="JSON",
                        found=str(err)) from err
    return data if isinstance(data, dict) else None


def _thresholds(case: Case, launch) -> tuple[float, float, str]:
    d = case.decoding
    ts = d.threshold_single if d.threshold_single is not None else getattr(launch, "accept_threshold_single", None)
    ta = d.threshold_acc if d.threshold_acc is not None else getattr(launch, "accept_threshold_acc", None)
    src = "case" if (d.threshold_single, d.threshold_acc) != (None, None) else \
        "launch command" if (ts, ta) != (None, None) else "default"
    return (1.0 if ts is None else ts), (1.0 if ta is None else ta), src


def _names(src: str) -> dict:
    if src == "launch command":
        return {"threshold_single": "--speculative-accept-threshold-single (launch command)",
                "threshold_acc": "--speculative-accept-threshold-acc (launch command)"}
    return CASE_NAMES


def _grid(case: Case, defaults: dict, ts: float, ta: float, where: str, names: dict) -> list[Decoding]:
    d = case.decoding
    if not (d.temperature or d.top_p or d.top_k):
        return []
    combos = itertools.product(d.temperature or (defaults["temperature"],), d.top_p or (defaults["top_p"],),
                               d.top_k or (defaults["top_k"],))
    return [from_values({"temperature": t, "top_p": p, "top_k": k}, ts, ta, names=names, file=where)
            for t, p, k in combos]


def plan(case: Case, target_path: Path, launch=None) -> DecodingPlan:
    """Resolve the case's decodings (see the module docstring). `launch`: parsed LaunchFlags or None."""
    d, notes = case.decoding, []
    sampling_defaults = getattr(launch, "sampling_defaults", None) or "model"
    gen_cfg = generation_config(target_path)
    eng = rules(case.serving.engine)
    req = eng.request_defaults(gen_cfg, sampling_defaults, release=engine(case.serving.engine))
    ts, ta, t_src = _thresholds(case, launch)
    names = {**CASE_NAMES, **_names(t_src)}
    grid = _grid(case, req.values, ts, ta, case.source, names)
    if grid:
        served, source = grid[0], "case [decoding] / flags"
    elif req.from_generation_config:
        served = from_values(req.values, ts, ta, names=names, file=str(Path(target_path) / "generation_config.json"))
        source = f"{target_path}/generation_config.json ({eng.display} --sampling-defaults {sampling_defaults})"
    else:
        served, source = GREEDY, "default (greedy)"
        if launch is not None:
            notes.append(f"a request that sends no temperature is sampled at temperature 1.0 by {eng.display}'s "
                         "defaults; diag evaluated greedy decoding: give --temperature / [decoding] to "
                         "evaluate what your clients send")
    if d.served != "auto":
        served = parse_decoding(d.served, field="decoding.served")
        source = "case decoding.served"
    sampled = list(dict.fromkeys(([served] if not served.greedy else []) + [g for g in grid if not g.greedy]))
    notes += _notes(sampled, req, launch, case, eng.display)
    return DecodingPlan(served, tuple(sampled), tuple(case.evaluate.seed + i for i in range(d.seeds)),
                        d.scope, source, tuple(notes))


def _notes(sampled: list[Decoding], req, launch, case: Case, display: str) -> list[str]:
    out = []
    for dec in sampled:
        if dec.lossy:
            out.append(f"decoding {dec.name}: accept thresholds below 1 (single {dec.threshold_single}, "
                       f"acc {dec.threshold_acc}) make verification lossy: the output no longer follows "
                       "the target's distribution")
    if sampled and req.unmodelled:
        out.append(f"generation_config.json sets {req.unmodelled}; {display} applies them, diag's sampled "
                   "verification does not model them")
    if sampled and getattr(launch, "use_rejection_sampling", False):
        out.append("--speculative-use-rejection-sampling: the server accepts with the draft distribution "
                   f"(coin * q < p); diag evaluated {display}'s default target-only rule")
    if sampled and case.prompts.recorded:
        out.append("sampled decodings generate their own continuations; the recorded ones are used for "
                   "greedy decoding only")
    return out
