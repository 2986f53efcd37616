"""The engines a run compares (`diag run --engine sglang-0.5.23 --engine vllm-0.32.0`, `[serving]
engines`): what each release feeds the drafter (EngineRules.serving_plan) and the accept length of
that layout, read from the evaluations of the ONE target pass every engine shares, against the
layout the drafter was trained on (the best layout at the reference axes).

Worked example (the demo pair: a drafter trained on embed+L2+L4 whose config writes vLLM's ids
[0, 2, 4], chain-3): SGLang 0.5.23 adds 1 to each id and feeds L1+L3+L5 (accept length 1.85, -0.91
against the trained 2.76); vLLM 0.32.0 reads the ids literally and feeds embed+L2+L4 (2.76, as
trained). Rows are taken at the reference tree, regime, rendering and decoding; the layouts are
replayed with the served engine's draft tables and verification, which the compared engines
share for greedy chains.

Pure: the case, the configs and the Evaluation records in, a frozen record out; names no engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.engines.common import ServingError
from diag.replay.evaluation import Axes, one
from diag.run.candidates import EAGLE_LABEL, engine_plan
from diag.run.case import Case


@dataclass(frozen=True)
class EngineRow:
    engine: str                        # "vllm-0.32.0"
    label: str                         # "vLLM 0.32.0"
    served: str | None                 # the candidate label it feeds: "embed+L2+L4", "final (EAGLE)"
    mode: str | None                   # "eagle3" | "eagle"
    rule: str                          # the engine's capture rule, or why it cannot serve
    accept_length: float | None
    accept_length_ci95: tuple[float, float] | None
    difference: float | None           # accept_length - the trained layout's
    as_trained: bool

    def to_json(self) -> dict:
        return {"engine": self.engine, "label": self.label, "served": self.served, "mode": self.mode,
                "rule": self.rule, "accept_length": self.accept_length,
                "accept_length_ci95": None if self.accept_length_ci95 is None else list(self.accept_length_ci95),
                "difference": self.difference, "as_trained": self.as_trained}


@dataclass(frozen=True)
class EnginesSection:
    tree: str
    trained: str | None
    trained_accept_length: float | None
    rows: tuple[EngineRow, ...]

    def to_json(self) -> dict:
        return {"tree": self.tree, "trained_layout": self.trained, "trained_accept_length": self.trained_accept_length,
                "rows": [r.to_json() for r in self.rows]}


def _row(case: Case, name: str, dcfg: dict, tcfg: dict, evaluations, reference: Axes, trained,
         trained_al: float | None) -> EngineRow:
    rel, plan = engine_plan(case, name, dcfg, tcfg)
    if isinstance(plan, ServingError):
        return EngineRow(rel.name, rel.label, None, None, f"cannot serve: {plan}", None, None, None, False)
    label = EAGLE_LABEL if plan.mode == "eagle" else str(plan.layout)
    e = one(evaluations, reference, layout=label, mode=plan.mode)
    if plan.crash:
        return EngineRow(rel.name, rel.label, label, plan.mode, f"crashes: {plan.crash}", None, None, None, False)
    al = None if e is None else e.accept_length
    diff = None if al is None or trained_al is None else al - trained_al
    return EngineRow(rel.name, rel.label, label, plan.mode, plan.rule, al,
                     None if e is None or al is None else tuple(e.accept_length_ci95), diff,
                     plan.mode == "eagle3" and label == trained)


def engines_section(case: Case, drafter_config: dict, target_config: dict, evaluations, reference: Axes,
                    trained: str | None) -> EnginesSection | None:
    """One row per compared engine; None for a single-engine run (its report is unchanged)."""
    if len(case.serving.engines) < 2:
        return None
    t = None if trained is None else one(evaluations, reference, layout=trained, mode="eagle3")
    trained_al = None if t is None else t.accept_length
    rows = tuple(_row(case, n, drafter_config, target_config, evaluations, reference, trained, trained_al)
                 for n in case.serving.engines)
    return EnginesSection(reference.tree, trained, trained_al, rows)
