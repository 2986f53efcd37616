"""From a checkpoint's config.json to an empty transformers text model, and
the checkpoint names of its Linear layers.

Config shapes handled:
  plain          {"model_type": "deepseek_v3" | "llama" | ..., "quantization_config": {...}}
  kimi_k2        {"model_type": "kimi_k2", "auto_map": {...}}: the weights are
                 DeepSeek-V3's, so the text model is built as deepseek_v3
  K2.5 wrapper   {"model_type": "kimi_k25", "quantization_config": {...}, "text_config":
                 {"model_type": "kimi_k2", "quantization_config": {...}, "rope_scaling":
                 {"type": "yarn", ...}}, "vision_config": {...}}: text weights are
                 prefixed "language_model.", everything else is not text; the two
                 quantization_config copies must agree; their targets / ignore entries
                 name the text model's modules ("lm_head" = language_model.lm_head)
`auto_map` (remote code) is never imported or executed: only model types that
transformers ships are built.

Checkpoint names vs module names: transformers 5.x fuses routed experts into
one module with 3-D parameters ([E, 2I, H] gate_up_proj, [E, H, I] down_proj);
on disk each expert is three Linear layers:
  model.layers.3.mlp.experts.gate_up_proj[e, :I]   <- ...experts.{e}.gate_proj.weight
  model.layers.3.mlp.experts.gate_up_proj[e, I:]   <- ...experts.{e}.up_proj.weight
  model.layers.3.mlp.experts.down_proj[e]          <- ...experts.{e}.down_proj.weight

This module knows configs and module trees; it reads no tensors.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from diag.checkpoint.config import text_config
from diag.errors import DiagError

WRAPPER_PREFIX = "language_model."
MODEL_TYPE_ALIASES = {"kimi_k2": "deepseek_v3"}  # same weights, same modules
EXPERT_PROJ = ("gate_proj", "up_proj", "down_proj")
_DROP_KEYS = ("auto_map", "quantization_config", "architectures", "transformers_version")


@dataclass(frozen=True)
class TextModel:
    """What diag builds from a config: the text model's config dict (model
    type already mapped), the prefix of its weights, and the raw
    quantization_config (None if the checkpoint is not quantized)."""

    config: dict
    prefix: str
    quantization: dict | None
    notes: tuple[str, ...] = field(default=())


def resolve_config(cfg: dict, *, file: str = "config.json") -> TextModel:
    """Find the text model inside a config (wrapper or not), map model types."""
    notes: list[str] = []
    if text_config(cfg) is not cfg:
        text = copy.deepcopy(text_config(cfg))
        prefix = WRAPPER_PREFIX
        quant = _one_quantization(cfg, text, file)
        notes.append(f"multimodal wrapper {cfg.get('model_type')!r}: loading the text model only "
                     f"(weights under {WRAPPER_PREFIX!r})")
    else:
        text, prefix, quant = copy.deepcopy(cfg), "", cfg.get("quantization_config")
    mt = text.get("model_type")
    if mt in MODEL_TYPE_ALIASES:
        notes.append(f"model_type {mt!r} built as {MODEL_TYPE_ALIASES[mt]!r} (same weights)")
        text["model_type"] = MODEL_TYPE_ALIASES[mt]
    if "auto_map" in text or "auto_map" in cfg:
        notes.append("auto_map (remote code) ignored: only transformers' own classes are built")
    _check_model_type(text.get("model_type"), file)
    return TextModel({k: v for k, v in text.items() if k not in _DROP_KEYS}, prefix, quant,
                     tuple(notes))


def _one_quantization(cfg: dict, text: dict, file: str) -> dict | None:
    """A wrapper's quantization_config: Kimi-K2.5 writes it twice, at the top level and inside
    text_config, identical. One copy is enough; two that disagree describe no checkpoint."""
    top, inner = cfg.get("quantization_config"), text.get("quantization_config")
    if top is not None and inner is not None and top != inner:
        differ = sorted(k for k in set(top) | set(inner) if top.get(k) != inner.get(k))
        raise DiagError("the two quantization_config copies of the wrapper disagree", file=file,
                        field=f"quantization_config.{differ[0]} vs text_config.quantization_config.{differ[0]}",
                        expected="identical copies (or only one)",
                        found=f"{top.get(differ[0])!r} vs {inner.get(differ[0])!r}")
    return inner if inner is not None else top


def _check_model_type(model_type, file: str) -> None:
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise DiagError("model type unknown to transformers (remote code is never run)", file=file,
                        field="model_type", expected="a model type transformers ships, e.g. "
                        "deepseek_v3, llama, kimi_k2 (mapped to deepseek_v3)", found=model_type)


def build_config(text: TextModel):
    """The transformers config object of the text model."""
    from transformers import AutoConfig

    d = dict(text.config)
    return AutoConfig.for_model(d.pop("model_type"), **d)


def build_meta(text: TextModel) -> nn.Module:
    """An empty causal-LM skeleton: parameters on the meta device, buffers real
    (rotary tables are computed, persistent buffers still need loading)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    config = build_config(text)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    return model.eval()


def is_fused_experts(module: nn.Module) -> bool:
    """transformers' fused routed experts: 3-D gate_up_proj and down_proj."""
    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (isinstance(gu, torch.Tensor) and isinstance(down, torch.Tensor)
            and gu.dim() == 3 and down.dim() == 3)


def expert_linears(name: str, module: nn.Module) -> dict[str, tuple[int, int]]:
    """Checkpoint Linear names of fused experts with their [out, in] shapes.
    Example: E=8, I=64, H=128 -> {"...experts.0.gate_proj": (64, 128),
    "...experts.0.up_proj": (64, 128), "...experts.0.down_proj": (128, 64), ...}."""
    num, two_i, hidden = module.gate_up_proj.shape
    inter = two_i // 2
    shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    return {f"{name}.{e}.{p}": shapes[p] for e in range(num) for p in EXPERT_PROJ}


def checkpoint_linears(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Every Linear layer as the checkpoint names it -> [out, in]: nn.Linear
    modules plus each expert's three projections."""
    out: dict[str, tuple[int, int]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            out[name] = (module.out_features, module.in_features)
        elif is_fused_experts(module):
            out.update(expert_linears(name, module))
    return out


def targeted_linears(model: nn.Module, prefix: str, targets, ignore) -> dict[str, tuple[int, int]]:
    """The Linear layers a quantization config packs, as the checkpoint names them
    (`prefix` + module name) -> [out, in]. Matching is on the text model's own names, so in
    the K2.5 wrapper "lm_head" ignores the key `language_model.lm_head` (scheme.py)."""
    from diag.int4.scheme import LINEAR_CLASSES, is_targeted

    return {prefix + n: s for n, s in checkpoint_linears(model).items()
            if is_targeted(n, LINEAR_CLASSES, targets, ignore)}


def fp32_names(model: nn.Module) -> tuple[str, ...]:
    """Name fragments transformers keeps in fp32 when loading in bf16/fp16
    (`_keep_in_fp32_modules_strict`, e.g. DeepSeek-V3's router)."""
    return tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ())


def ignorable_unexpected(model: nn.Module) -> tuple[str, ...]:
    """Regexes of checkpoint keys the model class declares it never loads
    (`_keys_to_ignore_on_load_unexpected`, e.g. DeepSeek-V3's MTP layer 61)."""
    return tuple(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
