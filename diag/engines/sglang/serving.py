"""What the serving engine will feed the drafter, derived from config dicts.

Given the drafter's config dict, the target's config dict, the engine version and the
`--speculative-algorithm`, this module says which capture points the engine
concatenates, whether the drafter's `fc` runs (and for how many states SGLang built it),
whose embedding and `lm_head` the draft uses, whether `d2t` maps draft ids to target ids,
and what crashes (DESIGN.md §2-§3). It also lists the layouts a drafter config *declares*
it was trained on, and the ids that serve a layout on a given version.

Facts (every release 0.5.6-0.5.23 unless a version is named; the versioned rules live in
capture.py, drafter_keys.py, draft_tables.py):
- ids are read only from the drafter's nested
  `eagle_config.eagle_aux_hidden_state_layer_ids`; a top-level key is ignored
  and the target's defaults apply (model_runner: `eagle_config[...]` in a try).
- EAGLE (and NEXTN, an alias): no auxiliary capture (`set_eagle3_layers_to_capture` is
  only called for EAGLE3); the draft input is the target's final-normed last hidden state.
- The drafter runs `fc` only when `hidden_states.shape[-1] != embeds.shape[-1]`
  (models/llama_eagle3.py, LlamaModel.forward).
- Up to 0.5.10.post1, CUDA-graph decode rounds capture the default layers (capture.py).
Worked example (Kimi-K2.5 target, drafter trained on embed+L3+L31, ids [0, 3, 31]):
  0.5.23 -> serves embed+L3+L31;  0.5.13 -> crash (no embeddings at layer 0);
  0.5.12.post1 -> serves L1+L4+L32 (always +1).

This module reads dicts; it knows nothing about files, weights or tensors.
"""

from __future__ import annotations


from diag.checkpoint.config import hidden_size, num_layers
from diag.engines.common import Fix, ServingError, ServingPlan
from diag.engines.drafter_ids import IDS_FIELD, TOP_IDS_FIELD, nested_ids, top_level_ids
from diag.engines import conventions
from diag.engines.sglang.algorithms import mode_of
from diag.engines.sglang.architectures import capture_model
from diag.engines.sglang.capture import NoCapture, capture_rule, graph_replays_capture_defaults, graph_rule_span
from diag.engines.sglang.draft_tables import draft_tables_for
from diag.engines.sglang.drafter_keys import draft_vocab_crash, fc_inputs, uses_aux_hidden_state
from diag.engines.sglang.versions import DEFAULT_ENGINE, RELEASES, Engine, engine, release
from diag.errors import DiagError
from diag.layouts import Layout, point

def _id_notes(drafter_config: dict, ids: list[int] | None) -> list[str]:
    top = top_level_ids(drafter_config)
    if top is not None and ids is None:
        return [f"top-level {TOP_IDS_FIELD}={top} is ignored by SGLang (it reads only "
                f"{IDS_FIELD}); the target's default capture applies"]
    if top is not None and top != ids:
        return [f"top-level {TOP_IDS_FIELD}={top} differs from {IDS_FIELD}={ids}; "
                "SGLang uses the nested one"]
    return []


def convention_of(target_config: dict, eng: Engine) -> str:
    """The convention name this engine applies to this target, or a DiagError saying why
    the engine cannot capture for it at all (capture.py)."""
    rule = capture_rule(eng, capture_model(target_config))
    if isinstance(rule, NoCapture):
        arch = (target_config.get("architectures") or ["?"])[0]
        raise DiagError(f"{eng.label} cannot serve an EAGLE3 drafter on this target: {rule.reason}",
                        field="architectures", expected="a target whose model class captures "
                        "auxiliary hidden states on this version", found=arch)
    return rule


def _resolve(ids, name: str, n: int) -> conventions.Resolution:
    try:
        return conventions.resolve(ids, name, n)
    except DiagError as err:                 # name the key SGLang read the ids from
        raise DiagError(err.message, field=IDS_FIELD if ids is not None else err.field,
                        expected=err.expected, found=err.found, hint=err.hint) from err


def _graph_layout(res, name: str, n: int, eng: Engine, cuda_graph: bool):
    """(decode layout, prefill layout or None, note): 0.5.6-0.5.10.post1 graph replays
    capture the defaults. Example (N=61, 0.5.10, ids [0, 3, 31] on Llama): prefill
    L1+L4+L32, decode rounds L2+L30+L58."""
    if not (cuda_graph and res.ids is not None and graph_replays_capture_defaults(eng)):
        return res.layout, None, None
    default = conventions.resolve(None, name, n).layout
    if default == res.layout:
        return res.layout, None, None
    note = (f"SGLang {graph_rule_span(eng)} captures the CUDA graphs before setting the ids: "
            f"every CUDA-graph decode round feeds the default layout {default}, only prefill "
            f"feeds {res.layout}; launch with --disable-cuda-graph, or use SGLang >= 0.5.11")
    return default, res.layout, note


def _fc_crash(layouts, k_fc: int, why: str, h_t: int, h: int) -> str | None:
    for lay in layouts:
        k = len(lay)
        if k * h_t != h and k != k_fc:
            return (f"{why}, but the engine concatenates {k} states ({lay}): fc expects "
                    f"{k_fc} x {h_t} = {k_fc * h_t} columns and gets {k * h_t}; the first "
                    "draft forward fails with a shape error")
    return None


def _final_plan(drafter_config: dict, target_config: dict, eng: Engine, has_d2t: bool,
                note: str) -> ServingPlan:
    """eagle_config.use_aux_hidden_state = false: EAGLE3 worker, no aux capture."""
    h_t, h = hidden_size(target_config), hidden_size(drafter_config)
    tables = draft_tables_for(drafter_config, "eagle3")
    crash = None if h_t == h else (f"use_aux_hidden_state is false: the {h_t}-wide final state "
                                   f"reaches fc, which expects k x {h_t} columns; shape error")
    return ServingPlan("eagle3", Layout((point("final"),)), note, None, h_t != h, tables.lm_head,
                       has_d2t and tables.uses_d2t, (note, tables.why), crash, eng.name,
                       tables.embed, tables.vocab_limit, None, None, (note,))


def _eagle3_plan(drafter_config: dict, target_config: dict, eng: Engine,
                 has_d2t: bool, cuda_graph: bool) -> ServingPlan:
    n, h_t, h = num_layers(target_config), hidden_size(target_config), hidden_size(drafter_config)
    name = convention_of(target_config, eng)
    aux, aux_note = uses_aux_hidden_state(drafter_config, eng)
    if not aux:
        return _final_plan(drafter_config, target_config, eng, has_d2t, aux_note)
    ids = nested_ids(drafter_config)
    res = _resolve(ids, name, n)
    lay, prefill, graph_note = _graph_layout(res, name, n, eng, cuda_graph)
    warnings = tuple(x for x in (aux_note, graph_note) if x)
    notes = _id_notes(drafter_config, ids) + list(warnings)
    k_fc, fc_why = fc_inputs(drafter_config, eng)
    crash = _fc_crash([lay] + ([prefill] if prefill else []), k_fc, fc_why, h_t, h)
    tables = draft_tables_for(drafter_config, "eagle3")
    notes.append(tables.why)
    width = len(lay) * h_t  # fc input: k capture points x target hidden
    if width == h:
        notes.append(f"fc input width {width} equals drafter hidden {h}: fc is skipped")
    return ServingPlan("eagle3", lay, res.rule, name, width != h, tables.lm_head,
                       has_d2t and tables.uses_d2t, tuple(notes), crash, eng.name, tables.embed,
                       tables.vocab_limit, k_fc, prefill, warnings)


def _eagle_plan(drafter_config: dict, target_config: dict, eng: Engine) -> ServingPlan:
    h_t, h = hidden_size(target_config), hidden_size(drafter_config)
    rule = (f"{eng.label} EAGLE/NEXTN: no auxiliary capture (set_eagle3_layers_to_capture "
            "runs only for EAGLE3); the drafter gets the target's final-normed last hidden state")
    tables = draft_tables_for(drafter_config, "eagle")
    notes = [tables.why, "d2t is not read, draft ids are target ids"]
    crash = None
    if h_t != h:
        crash = (f"target hidden {h_t} != drafter hidden {h}: the {h_t}-wide state reaches fc "
                 f"(which expects k x {h_t} columns) or the decoder layer (which expects {h}); "
                 "SGLang fails with a shape error at the first draft forward")
    else:
        notes.append(f"state width {h_t} equals the embedding width: fc is bypassed")
    return ServingPlan("eagle", Layout((point("final"),)), rule, None, h_t != h, "target",
                       False, tuple(notes), crash, eng.name, "target", tables.vocab_limit)


def _check_draft_vocab(drafter_config: dict, eng: Engine) -> None:
    """The drafter class fails to build without a draft_vocab_size key (drafter_keys)."""
    why = draft_vocab_crash(drafter_config, eng)
    if why:
        raise DiagError(why, field="draft_vocab_size", found="no such key",
                        expected="a number (the drafter's lm_head rows, draft ids mapped by d2t) or null "
                                 "(score with the target's lm_head)")


def serving_plan(drafter_config: dict, target_config: dict, *, engine_name: str = DEFAULT_ENGINE,
                 algorithm: str = "EAGLE3", has_d2t: bool = True,
                 cuda_graph: bool = True) -> ServingPlan:
    """What `engine_name` runs for this drafter/target pair under `algorithm`.
    has_d2t: whether the drafter checkpoint carries a d2t tensor; cuda_graph: False when the
    server runs with --disable-cuda-graph."""
    eng = engine(engine_name)
    _check_draft_vocab(drafter_config, eng)              # whatever the algorithm: the class is built
    if mode_of(algorithm) == "eagle":
        return _eagle_plan(drafter_config, target_config, eng)
    return _eagle3_plan(drafter_config, target_config, eng, has_d2t, cuda_graph)


def try_serving_plan(drafter_config: dict, target_config: dict, *, engine_name: str = DEFAULT_ENGINE,
                     algorithm: str = "EAGLE3", cuda_graph: bool = True) -> ServingPlan | ServingError:
    """serving_plan, with "the engine cannot serve this" as a ServingError value."""
    try:
        plan = serving_plan(drafter_config, target_config, engine_name=engine_name, algorithm=algorithm,
                            cuda_graph=cuda_graph)
    except DiagError as err:
        return ServingError(err.message, err.field, err.expected, err.found)
    return ServingError(plan.crash) if plan.crash else plan


def serving_ids(lay: Layout, target_config: dict, *, engine_name: str = DEFAULT_ENGINE) -> list[int] | None:
    """The eagle_config ids that make this engine feed exactly `lay` to the drafter, or None
    when no ids can (on this version). Examples: SGLang 0.5.23 on a 6-layer Llama:
    embed+L2+L4 -> [-1, 1, 3]; Kimi-K2.5 (61 layers) embed+L3+L31 -> 0.5.23 [0, 3, 31],
    0.5.13 None, 0.5.12.post1 None."""
    eng = engine(engine_name)
    rule = capture_rule(eng, capture_model(target_config))
    if isinstance(rule, NoCapture):
        return None
    return conventions.to_ids(lay, rule, num_layers(target_config))


def later_serving(lay: Layout, target_config: dict, *,
                  engine_name: str = DEFAULT_ENGINE) -> tuple[str, list[int]] | None:
    """The first release after `engine_name` whose ids can serve `lay`, with those ids, or None.
    Example: Kimi-K2.5 embed+L3+L31 after 0.5.13 -> ("0.5.14", [0, 3, 31])."""
    mine = engine(engine_name).release
    for v in RELEASES:
        if release(v) > mine:
            ids = serving_ids(lay, target_config, engine_name=f"sglang-{v}")
            if ids is not None:
                return v, ids
    return None


def fix_for(lay: Layout, target_config: dict, *, engine_name: str = DEFAULT_ENGINE) -> Fix:
    """The fix a finding or verdict proposes for serving `lay`; retraining only when no ids
    can serve it. Example (Kimi-K2.5, embed+L3+L31): 0.5.23 -> "write
    eagle_config.eagle_aux_hidden_state_layer_ids = [0, 3, 31] (SGLang 0.5.23, sglang-deepseek)";
    0.5.13 -> no ids; upgrade to 0.5.14 ([0, 3, 31]) or retrain."""
    eng = engine(engine_name)
    rule = capture_convention(target_config, engine_name=eng.name)
    ids = serving_ids(lay, target_config, engine_name=eng.name)
    if ids is not None:
        return Fix(ids, None, f"write {IDS_FIELD} = {ids} ({eng.label}, {rule})")
    later = later_serving(lay, target_config, engine_name=eng.name)
    head = f"{eng.label} ({rule}) cannot capture {lay} with any ids"
    if later is None:
        return Fix(None, None, f"{head}: retrain the drafter on a layout it can serve")
    return Fix(None, later, f"{head}: upgrade to SGLang {later[0]} or newer, where {IDS_FIELD} = "
                            f"{later[1]} serves it, or retrain the drafter on a layout {eng.label} can serve")


def capture_convention(target_config: dict, *, engine_name: str = DEFAULT_ENGINE) -> str:
    """The layer-id convention this engine applies to this target's drafter ids
    ("no-capture" when its model class captures nothing on this version)."""
    rule = capture_rule(engine(engine_name), capture_model(target_config))
    return "no-capture" if isinstance(rule, NoCapture) else rule

