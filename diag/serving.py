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

from diag import conventions
from diag.errors import DiagError
from diag.layouts import Layout, layout, point

DEEPSEEK_ARCHITECTURES = frozenset({
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
    "KimiK25ForConditionalGeneration", "KimiVLForConditionalGeneration",
})
DEEPSEEK_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2",
                                  "kimi_k25"})


@dataclass(frozen=True)
class Engine:
    """An engine version and the layer-id convention it applies per family."""

    name: str
    version: str
    convention_by_family: dict[str, str]


ENGINES: dict[str, Engine] = {
    "sglang-0.5.23": Engine("sglang-0.5.23", "SGLang 0.5.23",
                            {"llama": "sglang-llama", "deepseek": "sglang-deepseek"}),
}

# server_args.py: NEXTN is rewritten to EAGLE before anything else reads it.
ALGORITHMS: dict[str, str] = {"EAGLE3": "eagle3", "EAGLE": "eagle", "NEXTN": "eagle"}

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


def text_config(config: dict) -> dict:
    """Multimodal wrappers (Kimi-K2.5) keep the language model under text_config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def num_layers(target_config: dict, *, file: str | None = None) -> int:
    value = text_config(target_config).get("num_hidden_layers")
    if not isinstance(value, int) or value < 1:
        raise DiagError("target config has no usable num_hidden_layers", file=file,
                        field="num_hidden_layers", expected="a positive integer", found=value)
    return value


def hidden_size(config: dict, *, file: str | None = None) -> int:
    value = text_config(config).get("hidden_size")
    if not isinstance(value, int) or value < 1:
        raise DiagError("config has no usable hidden_size", file=file, field="hidden_size",
                        expected="a positive integer", found=value)
    return value


def target_family(target_config: dict) -> str:
    """"deepseek" for DeepSeek-V2/V3 and Kimi targets (deepseek_v2.py rule),
    "llama" for every other target (the llama.py / qwen3.py `id + 1` rule)."""
    archs = set(target_config.get("architectures") or ())
    types = {target_config.get("model_type"), text_config(target_config).get("model_type")}
    if archs & DEEPSEEK_ARCHITECTURES or types & DEEPSEEK_MODEL_TYPES:
        return "deepseek"
    return "llama"


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


def engine(name: str) -> Engine:
    if name not in ENGINES:
        raise DiagError("unknown serving engine", field="engine",
                        expected=", ".join(ENGINES), found=repr(name))
    return ENGINES[name]


def mode_of(algorithm: str) -> str:
    """EAGLE3 -> "eagle3"; EAGLE, NEXTN -> "eagle" (case-insensitive)."""
    key = algorithm.strip().upper()
    if key not in ALGORITHMS:
        raise DiagError("speculative algorithm diag cannot emulate",
                        field="--speculative-algorithm",
                        expected=", ".join(ALGORITHMS), found=repr(algorithm))
    return ALGORITHMS[key]


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
    name = eng.convention_by_family[target_family(target_config)]
    res = conventions.resolve(ids, name, n)
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
    rule = (f"{eng.version} EAGLE/NEXTN: no auxiliary capture (set_eagle3_layers_to_capture "
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


def serving_plan(drafter_config: dict, target_config: dict, *, engine_name: str = "sglang-0.5.23",
                 algorithm: str = "EAGLE3", has_d2t: bool = True) -> ServingPlan:
    """What `engine_name` runs for this drafter/target pair under `algorithm`.
    has_d2t: whether the drafter checkpoint carries a d2t tensor."""
    eng = engine(engine_name)
    if mode_of(algorithm) == "eagle":
        return _eagle_plan(drafter_config, target_config, eng)
    return _eagle3_plan(drafter_config, target_config, eng, has_d2t)


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
