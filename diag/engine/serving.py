"""What the serving engine will feed the drafter, derived from config dicts.

Given the drafter's config dict, the target's config dict, the engine and the
`--speculative-algorithm`, this module says which capture points the engine
concatenates, whether the drafter's `fc` runs, whose `lm_head` scores the
draft, and whether `d2t` maps draft ids to target ids (DESIGN.md §2-§3).
It also lists the layouts a drafter config *declares* it was trained on.

Facts (SGLang 0.5.23):
- ids are read only from the drafter's nested
  `eagle_config.eagle_aux_hidden_state_layer_ids`; a top-level key is ignored
  and the target's defaults apply (model_runner: `eagle_config.get(...)`).
- EAGLE3: the drafter's own `lm_head` and `d2t` (`hot_token_id = d2t + arange`),
  target embeddings (`set_embed`) (speculative/eagle_worker.py, init_lm_head).
- EAGLE (and NEXTN, an alias): no auxiliary capture
  (`set_eagle3_layers_to_capture` is only called for EAGLE3); the draft input
  is the target's final-normed last hidden state; `set_embed_and_head` swaps
  in the target's embedding *and* lm_head; `d2t` is never read.
- The drafter runs `fc` only when `hidden_states.shape[-1] !=
  embeds.shape[-1]` (models/llama_eagle3.py, LlamaModel.forward).

This module reads dicts; it knows nothing about files, weights or tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.checkpoint.config import hidden_size, num_layers
from diag.engine import conventions
from diag.engine.algorithms import mode_of
from diag.engine.architectures import capture_model
from diag.engine.versions import DEFAULT_ENGINE, Engine, engine
from diag.errors import DiagError
from diag.layouts import Layout, layout, point

IDS_FIELD = "eagle_config.eagle_aux_hidden_state_layer_ids"
TOP_IDS_FIELD = "eagle_aux_hidden_state_layer_ids"
TRAINED_LAYOUT_FIELD = "diag_trained_layout"


@dataclass(frozen=True)
class ServingPlan:
    """What the engine runs. mode "eagle3" or "eagle"; layout = what the fc
    input (or the bypassed hidden state) is made of; lm_head "drafter" or
    "target"; crash: why the engine would fail at the first draft step, or None."""

    mode: str
    layout: Layout
    rule: str
    convention: str | None
    uses_fc: bool
    lm_head: str
    uses_d2t: bool
    notes: tuple[str, ...]
    crash: str | None = None


@dataclass(frozen=True)
class DeclaredLayout:
    """A layout a drafter config says it was trained on, and where it says so."""

    layout: Layout
    source: str
    rule: str


def _ids_at(value: object, field: str, file: str | None) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        raise DiagError("layer ids must be a list of integers", file=file, field=field,
                        expected="e.g. [2, 30, 58]", found=repr(value))
    return list(value)


def nested_ids(drafter_config: dict, *, file: str | None = None) -> list[int] | None:
    """The ids SGLang reads: eagle_config.eagle_aux_hidden_state_layer_ids."""
    eagle = drafter_config.get("eagle_config")
    if not isinstance(eagle, dict):
        return None
    return _ids_at(eagle.get(TOP_IDS_FIELD), IDS_FIELD, file)


def top_level_ids(drafter_config: dict, *, file: str | None = None) -> list[int] | None:
    """A top-level eagle_aux_hidden_state_layer_ids (speculators/vLLM style)."""
    return _ids_at(drafter_config.get(TOP_IDS_FIELD), TOP_IDS_FIELD, file)


def _id_notes(drafter_config: dict, ids: list[int] | None) -> list[str]:
    top = top_level_ids(drafter_config)
    if top is not None and ids is None:
        return [f"top-level {TOP_IDS_FIELD}={top} is ignored by SGLang (it reads only "
                f"{IDS_FIELD}); the target's default capture applies"]
    if top is not None and top != ids:
        return [f"top-level {TOP_IDS_FIELD}={top} differs from {IDS_FIELD}={ids}; "
                "SGLang uses the nested one"]
    return []


def _eagle3_plan(drafter_config: dict, target_config: dict, eng: Engine,
                 has_d2t: bool) -> ServingPlan:
    n, h_t, h = num_layers(target_config), hidden_size(target_config), hidden_size(drafter_config)
    ids = nested_ids(drafter_config)
    name = eng.convention_for(capture_model(target_config))
    try:
        res = conventions.resolve(ids, name, n)
    except DiagError as err:                 # name the key SGLang read the ids from
        raise DiagError(err.message, field=IDS_FIELD if ids is not None else err.field,
                        expected=err.expected, found=err.found, hint=err.hint) from err
    width = len(res.layout) * h_t  # fc input: k capture points x target hidden
    notes = _id_notes(drafter_config, ids)
    lm_head = "drafter"
    if drafter_config.get("draft_vocab_size") is None:
        lm_head = "target"
        notes.append("no draft_vocab_size: SGLang sets load_lm_head_from_target and scores "
                     "drafts with the target's lm_head")
    if width == h:
        notes.append(f"fc input width {width} equals drafter hidden {h}: fc is skipped")
    return ServingPlan("eagle3", res.layout, res.rule, name, width != h, lm_head,
                       has_d2t, tuple(notes))


def _eagle_plan(drafter_config: dict, target_config: dict, eng: Engine) -> ServingPlan:
    h_t, h = hidden_size(target_config), hidden_size(drafter_config)
    rule = (f"{eng.label} EAGLE/NEXTN: no auxiliary capture (set_eagle3_layers_to_capture "
            "runs only for EAGLE3); the drafter gets the target's final-normed last hidden state")
    notes = ["target embedding and lm_head swapped in (set_embed_and_head); d2t is not read, "
             "draft ids are target ids"]
    crash = None
    if h_t != h:
        crash = (f"target hidden {h_t} != drafter hidden {h}: the {h_t}-wide state reaches fc "
                 f"(which expects k x {h_t} columns) or the decoder layer (which expects {h}); "
                 "SGLang fails with a shape error at the first draft forward")
    else:
        notes.append(f"state width {h_t} equals the embedding width: fc is bypassed")
    return ServingPlan("eagle", Layout((point("final"),)), rule, None, h_t != h, "target",
                       False, tuple(notes), crash)


def serving_plan(drafter_config: dict, target_config: dict, *, engine_name: str = DEFAULT_ENGINE,
                 algorithm: str = "EAGLE3", has_d2t: bool = True) -> ServingPlan:
    """What `engine_name` runs for this drafter/target pair under `algorithm`.
    has_d2t: whether the drafter checkpoint carries a d2t tensor."""
    eng = engine(engine_name)
    if mode_of(algorithm) == "eagle":
        return _eagle_plan(drafter_config, target_config, eng)
    return _eagle3_plan(drafter_config, target_config, eng, has_d2t)


@dataclass(frozen=True)
class ServingError:
    """The engine cannot serve the drafter as configured (ids it cannot capture, a shape
    that crashes the first draft forward). A value, not an exception: the run goes on to
    find what the drafter was trained on, and a verdict proposes the fix."""

    message: str
    field: str | None = None
    expected: object = None
    found: object = None

    def __str__(self) -> str:
        where = f" ({self.field}: {self.found}; expected {self.expected})" if self.field else ""
        return self.message + where


def try_serving_plan(drafter_config: dict, target_config: dict, *, engine_name: str = DEFAULT_ENGINE,
                     algorithm: str = "EAGLE3") -> ServingPlan | ServingError:
    """serving_plan, with "the engine cannot serve this" as a ServingError value."""
    try:
        plan = serving_plan(drafter_config, target_config, engine_name=engine_name, algorithm=algorithm)
    except DiagError as err:
        return ServingError(err.message, err.field, err.expected, err.found)
    return ServingError(plan.crash) if plan.crash else plan


def serving_ids(lay: Layout, target_config: dict, *, engine_name: str = DEFAULT_ENGINE) -> list[int] | None:
    """The eagle_config ids that make this engine feed exactly `lay` to the drafter, or None
    when no ids can (the drafter must be retrained on a layout the engine can capture).
    Example, SGLang 0.5.23 on a 6-layer Llama: embed+L2+L4 -> [-1, 1, 3]."""
    eng = engine(engine_name)
    convention = eng.convention_for(capture_model(target_config))
    return conventions.to_ids(lay, convention, num_layers(target_config))


def capture_convention(target_config: dict, *, engine_name: str = DEFAULT_ENGINE) -> str:
    """The layer-id convention this engine applies to this target's drafter ids."""
    return engine(engine_name).convention_for(capture_model(target_config))


def _trainer_convention(drafter_config: dict) -> str:
    """speculators configs carry speculators_config / speculators_model_type;
    everything else is read as SpecForge ids."""
    if "speculators_config" in drafter_config or "speculators_model_type" in drafter_config:
        return "speculators"
    return "specforge"


def declared_layouts(drafter_config: dict, num_hidden_layers: int, *,
                     file: str | None = None) -> list[DeclaredLayout]:
    """Layouts the drafter config declares it was trained on, most explicit
    first: diag_trained_layout (e.g. "embed+L3+L31"), then the nested ids, then
    top-level ids, each read under the trainer's convention."""
    out: list[DeclaredLayout] = []
    text = drafter_config.get(TRAINED_LAYOUT_FIELD)
    if text is not None:
        lay = layout(str(text), field=TRAINED_LAYOUT_FIELD).check_against(
            num_hidden_layers, field=TRAINED_LAYOUT_FIELD)
        out.append(DeclaredLayout(lay, TRAINED_LAYOUT_FIELD, f"{TRAINED_LAYOUT_FIELD} = {text!r}"))
    trainer = _trainer_convention(drafter_config)
    for field, ids in ((IDS_FIELD, nested_ids(drafter_config, file=file)),
                       (TOP_IDS_FIELD, top_level_ids(drafter_config, file=file))):
        if ids is None:
            continue
        res = conventions.resolve(ids, trainer, num_hidden_layers)
        if all(d.layout != res.layout for d in out):
            out.append(DeclaredLayout(res.layout, field, res.rule))
    return out
