"""Lint checks of the hidden-state layout: the algorithm, fc's width, where the layer ids sit,
how the engine reads them, and whether that is the layout the drafter declares.

Each check takes the Pair (pair.py) and returns Findings; none reads a weight value.
"""

from __future__ import annotations

from diag.checkpoint.config import hidden_size, num_layers
from diag.checkpoint.drafter_format import is_speculators, trainer_marks
from diag.checks.lint.pair import Finding, Pair, find, is_eagle3_drafter, algorithm, under_eagle3
from diag.engines import conventions
from diag.engines import drafter_ids
from diag.engines import engine, rules
from diag.engines.common import ServingError
from diag.errors import DiagError


def eagle3_plan(p: Pair):
    """The EAGLE3 plan, or None when the engine cannot serve the pair (check_serving says why)."""
    return None if isinstance(p.plan, ServingError) else p.plan


def _declared_fix(p: Pair) -> str | None:
    """The fix for the layout the drafter config declares, on this engine version."""
    try:
        declared = drafter_ids.declared_layouts(p.drafter, num_layers(p.target), file=p.drafter_file)
    except DiagError:
        return None
    if not declared:
        return None
    return f"the drafter declares {declared[0].layout} ({declared[0].source}): " + \
        rules(p.engine).fix_for(declared[0].layout, p.target, release=engine(p.engine)).text


def check_serving(p: Pair) -> list[Finding]:
    if not isinstance(p.plan, ServingError):
        return []
    e = p.plan
    own = f"set {e.field}: {e.expected}" if e.field == "draft_vocab_size" else None   # not a layout fix
    fix = own or _declared_fix(p) or (f"expected: {e.expected}" if e.expected is not None else
                                      "see the message")
    return [Finding("error", "CONFIG", e.message, f"{rules(p.engine).display} fails on or misreads this field",
                    fix, p.drafter_file, e.field)]


def check_algorithm(p: Pair) -> list[Finding]:
    if p.flags is None:
        return [Finding("info", "NO_LAUNCH", "no launch command given: algorithm, tree flags and "
                        "max_running_requests not checked; assuming EAGLE3",
                        "n/a", f"pass --launch with the command that starts the {engine(p.engine).label} server")]
    if algorithm(p) != "EAGLE" or not is_eagle3_drafter(p):
        return []
    plan, base = p.eagle_plan, eagle3_plan(p)
    h_t = hidden_size(p.target)
    k = len(base.layout) if base is not None else 3
    what = str(plan) if isinstance(plan, ServingError) else ("the drafter gets the final-normed last hidden state "
                          f"({h_t} wide instead of {k}x{h_t} = {k * h_t}); fc is skipped, the "
                          "target's lm_head replaces the drafter's, d2t is ignored; no warning "
                          "is logged and accept length falls to about 1.00")
    return [Finding("error", "EAGLE_ALGORITHM",
                    f"--speculative-algorithm {p.flags.algorithm} with an EAGLE-3 drafter",
                    what, "launch with --speculative-algorithm EAGLE3", None,
                    "--speculative-algorithm")]


def check_fc_width(p: Pair) -> list[Finding]:
    hit = find(p.tensors, "fc.weight")
    if hit is None:
        return []
    name, info = hit
    plan = eagle3_plan(p)
    if plan is None:
        return []
    h_t, h = hidden_size(p.target), hidden_size(p.drafter)
    k = len(plan.layout)
    built = plan.fc_inputs or k
    rows, cols = info.shape[0], info.shape[-1]
    out = []
    if cols != built * h_t:
        out.append(Finding(
            "error", "FC_WIDTH", f"fc input width {cols} != the {built} x target hidden {h_t} = "
            f"{built * h_t} columns {p.engine} builds fc for (serving {plan.layout}){under_eagle3(p)}",
            f"{rules(p.engine).display} concatenates {k} states ({plan.rule}); llama_eagle3.py sizes fc from "
            "num_aux_hidden_states, else the nested ids, else 3 (always 3 up to 0.5.11): loading "
            "or the first draft forward fails on the fc shape",
            f"give eagle_config.eagle_aux_hidden_state_layer_ids with {cols // h_t if h_t else '?'} "
            "ids matching training, or retrain fc", info.file, name))
    if rows != h:
        out.append(Finding("error", "FC_ROWS", f"fc output {rows} != drafter hidden_size {h}",
                           f"{rules(p.engine).display} builds fc with hidden_size outputs; weight loading fails",
                           "fix hidden_size in the drafter config.json", info.file, name))
    return out


def check_top_level_ids(p: Pair) -> list[Finding]:
    top = drafter_ids.top_level_ids(p.drafter, file=p.drafter_file)
    if top is None or drafter_ids.nested_ids(p.drafter) is not None or is_speculators(p.drafter):
        return []                   # speculators' own (top-level) ids: declared_layouts reads them
    plan = eagle3_plan(p)
    if plan is None or plan.convention is None:
        return []
    meant = conventions.resolve(top, plan.convention, num_layers(p.target)).layout
    sev = "error" if meant != plan.layout else "warning"
    return [Finding(sev, "TOP_LEVEL_IDS", f"eagle_aux_hidden_state_layer_ids={top} is at the top "
                    "level of the drafter config", f"{rules(p.engine).display} reads only eagle_config."
                    f"eagle_aux_hidden_state_layer_ids and falls back to its defaults: serves "
                    f"{plan.layout} (the top-level ids would give {meant})",
                    f'move them: "eagle_config": {{"eagle_aux_hidden_state_layer_ids": {top}}}',
                    p.drafter_file, drafter_ids.TOP_IDS_FIELD)]


def _reading(ids: list[int], convention: str, n: int):
    """The layout `convention` reads, or None when it cannot read these ids."""
    try:
        return conventions.resolve(ids, convention, n).layout
    except DiagError:
        return None


def check_deepseek_first_id(p: Pair) -> list[Finding]:
    """The first-id rule (a convention with first_one_shift: SGLang >= 0.5.13 on DeepSeek-family
    targets, its capture.py): which layout the ids mean depends on whether the first is 1."""
    ids = drafter_ids.nested_ids(p.drafter)
    if ids is None or eagle3_plan(p) is None \
            or trainer_marks(p.drafter) == "torchspec":    # TorchSpec ids: drafter.check_torchspec_ids
        return []
    name = rules(p.engine).capture_convention(p.target, release=engine(p.engine))
    if name not in conventions.all_conventions() or not conventions.get(name).first_one_shift:
        return []
    n = num_layers(p.target)
    served = conventions.resolve(ids, name, n).layout
    trained = _reading(ids, "specforge", n) or served
    shifted = ids[0] == 1
    sev = "info" if served == trained else "warning"
    rule = ("the first id is 1, so every id is shifted by +1" if shifted else
            "the first id is not 1, so ids are used as layer inputs without the +1 shift")
    return [Finding(sev, "DEEPSEEK_FIRST_ID", f"DeepSeek-family target: {p.engine} reads "
                    f"{ids} as {served}; SpecForge-style output-of-layer ids mean {trained}",
                    f"deepseek_v2.py set_eagle3_layers_to_capture: {rule}",
                    "check which layout the drafter was trained on (diag scan) and write ids "
                    f"that {rules(p.engine).display} reads as that layout", p.drafter_file, drafter_ids.IDS_FIELD)]


def check_layout(p: Pair) -> list[Finding]:
    n = num_layers(p.target)
    declared = drafter_ids.declared_layouts(p.drafter, n, file=p.drafter_file)
    if not declared:
        return []
    plan, trained = eagle3_plan(p), declared[0]
    if plan is None or plan.layout == trained.layout:
        return []
    fix = rules(p.engine).fix_for(trained.layout, p.target, release=engine(p.engine)).text
    rule = plan.rule + "".join(f"; {note}" for note in plan.notes if "CUDA graph" in note)
    return [Finding("error", "LAYOUT_MISMATCH", f"drafter trained on {trained.layout} "
                    f"({trained.source}), {p.engine} serves {plan.layout}{under_eagle3(p)}",
                    rule, fix, p.drafter_file, trained.source)]
