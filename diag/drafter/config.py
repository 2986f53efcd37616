"""A drafter's config.json -> the DrafterConfig its arithmetic needs, read the way the engine
reads it: through the transformers config class of its `model_type` (SGLang builds drafter
configs with AutoConfig; `kimi_k2` is registered there as DeepSeek-V3's config), so a key the
file omits takes that class's default. Examples: an MLA config without
max_position_embeddings gets DeepseekV3Config's 4096; a speculators qwen3 layer without
head_dim gets Qwen3Config's 128; `rope_scaling` {"type": "yarn", ...} and transformers 5's
`rope_parameters` both arrive as one rope dict.

Inputs: the flat config (checkpoint.drafter_format.flat_config), the detected format, and the
width of fc's input from the safetensors header (fc.weight [H, k * H_target] -> k).
This module knows config keys and their defaults; nothing about files or tensors' values.
"""

from __future__ import annotations

from diag.checkpoint.drafter_format import DrafterFormat
from diag.drafter.mla import MlaShape
from diag.drafter.model import DrafterConfig
from diag.errors import DiagError

CONFIG_TYPES = {"kimi_k2": "deepseek_v3"}      # SGLang's _KimiK2ConfigAlias(DeepseekV3Config)
_DROP = ("architectures", "auto_map", "quantization_config", "transformers_version")


def hf_config(flat: dict, fmt: DrafterFormat, *, file: str | None = None):
    """The transformers config object the engine would build from this drafter config."""
    from transformers import CONFIG_MAPPING

    model_type = flat.get("model_type") or ("deepseek_v3" if fmt.attention == "mla" else "llama")
    model_type = CONFIG_TYPES.get(model_type, model_type)
    if model_type not in CONFIG_MAPPING:
        raise DiagError("drafter model_type unknown to transformers (remote code is never run)", file=file,
                        field="model_type", expected="e.g. llama, qwen3, deepseek_v3, kimi_k2", found=model_type)
    from huggingface_hub.errors import StrictDataclassError

    kwargs = {k: v for k, v in flat.items() if k not in _DROP and k != "model_type"}
    try:
        return CONFIG_MAPPING[model_type](**kwargs)
    except (TypeError, ValueError, KeyError, StrictDataclassError) as err:   # transformers 5 validates shapes
        found = str(err).splitlines()
        found = next((line.strip() for line in found[1:] if line.strip()), found[0]) if found else repr(err)
        raise DiagError("transformers (and so the server, which builds the same config) rejects the drafter "
                        "config", file=file, field="model_type", expected=f"a valid {model_type} config",
                        found=found) from err


def _rope(hf) -> tuple[float, dict | None]:
    """(theta, scaling or None) from transformers 5's rope_parameters."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    theta = float(params.pop("rope_theta", getattr(hf, "rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    return theta, (params if kind != "default" else None)


_REQUIRED = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def _positive(hf, key: str, file: str | None) -> int:
    value = getattr(hf, key, None)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DiagError("drafter config lacks a required key", file=file, field=key,
                        expected="a positive integer", found=value)
    return value


def _mla(hf, file: str | None) -> MlaShape:
    keys = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    return MlaShape(*(_positive(hf, k, file) for k in keys),
                    rope_interleave=bool(getattr(hf, "rope_interleave", True)))


def check_servable(hf, heads: int, scaling: dict | None, file: str | None) -> None:
    """What the server's attention and rope need: query heads a multiple of the KV heads (each KV
    head serves heads / kv_heads query heads: 32 / 8 = 4), and a rope type the engine's rope
    table knows (transformers' ROPE_INIT_FUNCTIONS, which SGLang's get_rope mirrors), checked
    before any weight so that neither fails deep inside the drafter's load."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kv = getattr(hf, "num_key_value_heads", None) or heads
    if not isinstance(kv, int) or kv < 1 or heads % kv:
        raise DiagError("the server cannot run this drafter: its query heads are not a multiple of its "
                        "KV heads", file=file, field="num_key_value_heads",
                        expected=f"a divisor of num_attention_heads = {heads}", found=kv)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind != "default" and kind not in ROPE_INIT_FUNCTIONS:
        raise DiagError("the server cannot run this drafter: unknown rope scaling type", file=file,
                        field="rope_scaling.rope_type", expected=f"one of {sorted(ROPE_INIT_FUNCTIONS)}",
                        found=kind)


def num_aux_from_fc(fc_shape: tuple[int, ...], hidden: int, target_hidden: int, *, file: str | None) -> int:
    """fc.weight [H, k * H_target] -> k. Example: [7168, 21504], H_target 7168 -> 3."""
    if len(fc_shape) != 2 or fc_shape[0] != hidden or fc_shape[1] % target_hidden:
        raise DiagError("fc input width is not a multiple of the target hidden size", file=file,
                        field="fc.weight", expected=f"[{hidden}, k*{target_hidden}]", found=list(fc_shape))
    return fc_shape[1] // target_hidden


def drafter_config(flat: dict, fmt: DrafterFormat, fc_shape: tuple[int, ...] | None, *,
                   file: str | None = None) -> DrafterConfig:
    """The DrafterConfig of this drafter; fc_shape None (no weights): 3 capture points."""
    for key in _REQUIRED:                 # transformers' config classes would default them silently
        if flat.get(key) is None:
            raise DiagError("drafter config lacks a required key", file=file, field=key,
                            expected="a positive integer", found="missing")
    hf = hf_config(flat, fmt, file=file)
    hidden, heads = _positive(hf, "hidden_size", file), _positive(hf, "num_attention_heads", file)
    if getattr(hf, "hidden_act", "silu") != "silu":
        raise DiagError("unsupported drafter activation", file=file, field="hidden_act",
                        expected="silu", found=getattr(hf, "hidden_act", None))
    target_hidden = int(flat.get("target_hidden_size") or hidden)
    vocab = _positive(hf, "vocab_size", file)
    theta, scaling = _rope(hf)
    check_servable(hf, heads, scaling, file)
    o = fmt.options
    return DrafterConfig(
        hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=int(getattr(hf, "num_key_value_heads", None) or heads),
        intermediate_size=_positive(hf, "intermediate_size", file), vocab_size=vocab,
        draft_vocab_size=vocab if o.lm_head == "target" else _positive(hf, "draft_vocab_size", file),
        target_hidden_size=target_hidden,
        num_aux=3 if fc_shape is None else num_aux_from_fc(fc_shape, hidden, target_hidden, file=file),
        head_dim=getattr(hf, "head_dim", None) if fmt.attention == "llama" else None,
        rms_norm_eps=float(getattr(hf, "rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(getattr(hf, "max_position_embeddings", 2048)),
        norm_output=o.norm_output, attention=fmt.attention,
        mla=_mla(hf, file) if fmt.attention == "mla" else None, fc_norm=o.fc_norm,
        norm_before_fc=o.norm_before_fc, norm_before_residual=o.norm_before_residual,
        qk_norm=o.qk_norm, lm_head_from_target=o.lm_head == "target")
