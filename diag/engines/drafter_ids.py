"""Where a drafter's config.json writes its EAGLE-3 layer ids, and which layouts it declares it was
trained on. Engine-neutral: it reads the keys as written; what a serving engine then feeds is
that engine's rule (EngineRules.serving_plan).

Keys: `eagle_config.eagle_aux_hidden_state_layer_ids` (nested: what SGLang reads),
`eagle_aux_hidden_state_layer_ids` (top level: speculators / vLLM style) and diag's own
`diag_trained_layout`. Declared layouts read the ids under the trainer's convention
(diag.engines.conventions): the one `diag_layer_id_convention` names when the config carries it
(the zoo writes it; a convention name such as "vllm" or "specforge"), else SpecForge unless the
config carries speculators' or TorchSpec's marks.
Worked example (N = 61): {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]}}
-> declared L2+L30+L58 (specforge: id i is the output of layer i). The same ids with
"diag_layer_id_convention": "vllm" -> declared L1+L29+L57 (vllm: id i is the input of layer i).
This module reads dicts; it knows nothing about files, weights or tensors.
"""

from __future__ import annotations

from diag.engines import conventions
from diag.engines.common import DeclaredLayout
from diag.errors import DiagError
from diag.layouts import layout

IDS_FIELD = "eagle_config.eagle_aux_hidden_state_layer_ids"
TOP_IDS_FIELD = "eagle_aux_hidden_state_layer_ids"
TRAINED_LAYOUT_FIELD = "diag_trained_layout"
CONVENTION_FIELD = "diag_layer_id_convention"


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


def _trainer_convention(drafter_config: dict, file: str | None = None) -> str | None:
    """The convention the config names in diag_layer_id_convention, when it does. Else:
    speculators configs carry speculators_config / speculators_model_type; TorchSpec's
    (checkpoint.drafter_format) write the serving engine's own ids (it trains on states an
    SGLang / vLLM engine captured, and its vLLM export shifts them by +1), so they declare no
    layout apart from what the engine serves: None. Everything else is read as SpecForge ids."""
    from diag.checkpoint.drafter_format import is_speculators, trainer_marks

    named = drafter_config.get(CONVENTION_FIELD)
    if named is not None:
        known = conventions.all_conventions()
        if not isinstance(named, str) or named not in known:
            raise DiagError("unknown layer-id convention", file=file, field=CONVENTION_FIELD,
                            expected="one of " + ", ".join(known), found=repr(named))
        return named
    if is_speculators(drafter_config):
        return "speculators"
    return None if trainer_marks(drafter_config) == "torchspec" else "specforge"


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
    trainer = _trainer_convention(drafter_config, file)
    for field, ids in () if trainer is None else ((IDS_FIELD, nested_ids(drafter_config, file=file)),
                       (TOP_IDS_FIELD, top_level_ids(drafter_config, file=file))):
        if ids is None:
            continue
        res = conventions.resolve(ids, trainer, num_hidden_layers)
        if all(d.layout != res.layout for d in out):
            out.append(DeclaredLayout(res.layout, field, res.rule))
    return out
