"""Which layouts a run evaluates, and why each is there (DESIGN.md §2, §3).

Sources, in order: the case's named layouts; what the engine will serve (EngineRules.serving_plan); what
the drafter's config declares it was trained on, read under every convention; and, when the
case asks for a scan (or names no layout at all), the neighbours of each: every point moved
by ±1, the whole layout moved by ±1, `embed` swapped for L1 and the first point swapped for
`embed`. Each candidate carries every role that produced it, so the report can say "this is
the serving layout AND the sglang-llama reading of the declared ids".
Worked example, N = 6, declared embed+L2+L4: shifts give L1+L2+L4, embed+L1+L4,
embed+L3+L4, embed+L2+L3, embed+L2+L5, L1+L3+L5 (whole +1), ...

This module knows layouts, conventions and configs; nothing about models or tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diag.engines import Release, engine, rules
from diag.engines.common import ServingError, ServingPlan
from diag.engines import conventions
from diag.run.case import Case
from diag.checkpoint.headers import tensor_infos
from diag.errors import DiagError
from diag.layouts import Layout, layout, point
from diag.engines.drafter_ids import declared_layouts, nested_ids, top_level_ids
from diag.target.load import TargetInfo, read_target_config

EAGLE_LABEL = "final (EAGLE)"


@dataclass
class Candidate:
    label: str
    layout: Layout
    mode: str                          # "eagle3" | "eagle"
    roles: list[str]
    rules: list[str]

    def to_dict(self) -> dict:
        return {"label": self.label, "layout": str(self.layout), "mode": self.mode,
                "roles": list(self.roles), "rules": list(self.rules)}


def config_reads(roles) -> bool:
    """Whether the drafter's config names a candidate with these roles: declared, or its ids
    read by a convention (DESIGN.md §10: adjacent layers can tie, and the config breaks the tie)."""
    return any(r.startswith(("declared", "reading")) for r in roles)


def read_by_config(candidates) -> frozenset[str]:
    """The labels of the candidates the drafter's config names (config_reads)."""
    return frozenset(c.label for c in candidates if config_reads(c.roles))


class _Book:
    def __init__(self, k: int, n: int):
        self.items: dict[str, Candidate] = {}
        self.k, self.n = k, n
        self.notes: list[str] = []
        self.serving_error: ServingError | None = None

    def add(self, lay: Layout, role: str, rule: str = "", mode: str = "eagle3") -> None:
        final_only = str(lay) == "final"       # eagle3 without aux capture (use_aux_hidden_state false)
        if mode == "eagle3" and not final_only and (len(lay) != self.k or any(
                not p.is_final and p.index > self.n for p in lay.points)):
            return
        label = EAGLE_LABEL if mode == "eagle" else str(lay)
        c = self.items.setdefault(label, Candidate(label, lay, mode, [], []))
        if role not in c.roles:
            c.roles.append(role)
        if rule and rule not in c.rules:
            c.rules.append(rule)


def neighbours(lay: Layout, n: int) -> list[tuple[Layout, str]]:
    """The scan's neighbours of one layout, each with how it was made."""
    out = []
    idx = [0 if p.name == "embed" else (None if p.is_final else p.index) for p in lay.points]
    if None in idx:
        return out
    for i in range(len(idx)):
        for d in (-1, 1):
            moved = idx[:i] + [idx[i] + d] + idx[i + 1:]
            if 0 <= moved[i] <= n and len(set(moved)) == len(moved):
                out.append((_from_indices(moved), f"{lay.points[i]} {'+' if d > 0 else '-'}1"))
    for d in (-1, 1):
        whole = lay.shifted(d, n)
        if whole is not None:
            out.append((whole, f"whole layout {'+' if d > 0 else '-'}1"))
    if 0 not in idx and 0 < min(idx):
        swapped = [0] + idx[1:]
        if len(set(swapped)) == len(swapped):
            out.append((_from_indices(swapped), "first point -> embed"))
    return out


def served_by(name: str) -> str:
    """The candidate role of an engine's served layout when a run compares engines."""
    return f"served by {name}"


def engine_plan(case: Case, name: str, dcfg: dict, tcfg: dict) -> tuple[Release, ServingPlan | ServingError]:
    """What one engine release feeds this drafter; the case's launch line is read for the served
    (first) engine only, the command of one engine's program."""
    rel = engine(name)
    eng = rules(rel)
    launch = case.serving.launch if name == case.serving.engine else None
    graphs = not (launch and eng.parse_launch(launch, release=rel).disable_cuda_graph)
    return rel, eng.serving_plan(dcfg, tcfg, release=rel, algorithm=case.serving.algorithm, cuda_graph=graphs)


def _compared(case: Case, dcfg: dict, tcfg: dict, book: "_Book") -> None:
    """Every engine a run compares (`[serving] engines`): its served layout evaluated from the same
    target pass, tagged with the engine; one it cannot serve is a note (the comparison's table says why)."""
    for name in case.serving.engines:
        rel, plan = engine_plan(case, name, dcfg, tcfg)
        if isinstance(plan, ServingError):
            book.notes.append(f"{rel.label} cannot serve this drafter: {plan}")
        else:
            book.add(plan.layout, served_by(rel.name), plan.rule, plan.mode)


def _serving(case: Case, dcfg: dict, tcfg: dict, book: "_Book"):
    """What the engine will feed; ids it cannot capture become a serving error (a verdict),
    and the run goes on to find what the drafter was trained on."""
    plan = engine_plan(case, case.serving.engine, dcfg, tcfg)[1]
    if isinstance(plan, ServingError):
        book.serving_error = plan
        return None
    if plan.crash:
        book.serving_error = ServingError(plan.crash)
    book.notes += [f"{plan.engine}: {w}" for w in plan.warnings]
    return plan


def _declared(dcfg: dict, n: int, where: str, book: "_Book") -> list:
    """The drafter's declared layouts; ids its trainer's convention cannot read become a
    note (the run goes on with the other candidates), never a silent skip."""
    try:
        return declared_layouts(dcfg, n, file=where)
    except DiagError as err:
        book.notes.append(f"declared layer ids not readable under the trainer's convention: "
                          f"{err.message} ({err.found}); evaluated under every convention that reads them")
        return []


def _from_indices(idx: list[int]) -> Layout:
    return Layout(tuple(point(f"L{i}") for i in idx))


def candidates_for(case: Case, tinfo: TargetInfo, dcfg: dict,
                   dpath: Path) -> tuple[list[Candidate], list[str], ServingError | None]:
    n = tinfo.num_layers
    tcfg = read_target_config(tinfo.path)
    k = _num_aux(dpath, tinfo)
    book = _Book(k, n)
    for text in case.evaluate.layouts:
        lay = layout(text, field="evaluate.layouts").check_against(n, field="evaluate.layouts")
        if len(lay) != k:
            raise DiagError("layout width does not match the drafter's fc", file=case.source,
                            field="evaluate.layouts", expected=f"{k} capture points (fc.weight is "
                            f"[H, {k}x{tinfo.hidden_size}] in {dpath})", found=f"{text} ({len(lay)} points)")
        book.add(lay, "case")
    plan = _serving(case, dcfg, tcfg, book)
    if case.serving.layout:
        book.add(layout(case.serving.layout, field="serving.layout"), "serving", "given in the case")
    elif plan is not None:
        book.add(plan.layout, "serving", plan.rule, plan.mode)
    _compared(case, dcfg, tcfg, book)
    if "eagle" in case.evaluate.modes or (plan is not None and plan.mode == "eagle"):
        book.add(layout("final"), "serving mode eagle", "--speculative-algorithm EAGLE: final-normed last "
                 "hidden state, fc bypassed when widths match, target lm_head, no d2t", "eagle")
    where = str(dpath / "config.json")
    for d in _declared(dcfg, n, where, book):
        book.add(d.layout, f"declared ({d.source})", d.rule)
    ids = nested_ids(dcfg, file=where) or top_level_ids(dcfg, file=where)
    if ids is not None:
        for res in conventions.readings(list(ids), n):
            book.add(res.layout, "reading: " + ", ".join(res.conventions or (res.convention,)), res.rule)
    if case.evaluate.scan or not case.evaluate.layouts:
        for base in [c for c in list(book.items.values()) if c.mode == "eagle3"]:
            for lay, how in neighbours(base.layout, n):
                book.add(lay, f"scan: {how} of {base.label}")
    if not any(c.mode == "eagle3" for c in book.items.values()):
        _no_candidate(dcfg, where, ids, k, n, book)
    return list(book.items.values()), book.notes, book.serving_error


def _no_candidate(dcfg: dict, where: str, ids, k: int, n: int, book: "_Book") -> None:
    """Nothing to evaluate: an error now, before any weight is loaded (it used to be
    `max() arg is an empty sequence` after the whole target pass)."""
    why = [f"layer ids {list(ids)} fit no {k}-point layout of a {n}-layer target under any convention"
           if ids is not None else "the drafter config names no layer ids"]
    if book.serving_error is not None:
        why.append(f"the engine cannot serve them: {book.serving_error}")
    raise DiagError("no candidate layout to evaluate for this drafter", file=where,
                    field="eagle_config.eagle_aux_hidden_state_layer_ids",
                    expected=f"ids the engine can capture on a {n}-layer target, or layouts given with "
                             f"--layout / evaluate.layouts ({k} points each: the drafter's fc width)",
                    found="; ".join(why))


def _num_aux(dpath: Path, tinfo: TargetInfo) -> int:
    """Points per layout the drafter's fc takes, from fc.weight's width in the safetensors
    header: [H, k*Ht] -> k. Example: [128, 384] with target hidden 128 -> 3."""
    shapes = {k.removeprefix("model."): list(v.shape) for k, v in tensor_infos(dpath).items()}
    if "fc.weight" not in shapes:
        raise DiagError("drafter checkpoint has no fc.weight", file=str(dpath), field="fc.weight",
                        expected=f"[H, k*{tinfo.hidden_size}]", found="missing")
    width = shapes["fc.weight"][1]
    if width % tinfo.hidden_size:
        raise DiagError("drafter fc input width is not a multiple of the target's hidden size",
                        file=str(dpath), field="fc.weight",
                        expected=f"[H, k*{tinfo.hidden_size}] (k capture points of the target)",
                        found=shapes["fc.weight"])
    k = width // tinfo.hidden_size
    if not 1 <= k <= tinfo.num_layers + 2:
        raise DiagError("drafter fc input width fits no layout of this target", file=str(dpath),
                        field="fc.weight", expected=f"[H, k*{tinfo.hidden_size}] with 1 <= k <= "
                        f"{tinfo.num_layers + 2} (embed, L1..L{tinfo.num_layers}, final)",
                        found=f"{shapes['fc.weight']}: k = {k}")
    return k
