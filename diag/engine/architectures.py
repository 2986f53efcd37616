"""Which of SGLang's code paths a target config selects. Two different questions, two names:

capture_model(config): whose `set_eagle3_layers_to_capture` runs, i.e. which layer-id rule
  the engine applies to the drafter's ids. "deepseek" for DeepSeek-V2/V3 and the Kimi
  targets (deepseek_v2.py, which kimi_k25.py delegates to), "llama" for every other target
  (llama.py's `id + 1`, which qwen3.py and the other dense models share).
  Worked example: KimiK25ForConditionalGeneration (text_config.model_type kimi_k2) -> "deepseek".

auto_defaults_key(config): what SGLang's auto tree defaults are keyed on: architectures[0]
  as written, never the text model inside a wrapper. Kimi-K2.5 -> "KimiK25ForConditionalGeneration".

This module reads config dicts; it knows nothing about files or versions.
"""

from __future__ import annotations

from diag.checkpoint.config import architecture, text_config

DEEPSEEK_ARCHITECTURES = frozenset({
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
    "KimiK25ForConditionalGeneration", "KimiVLForConditionalGeneration",
})
DEEPSEEK_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25"})


def capture_model(target_config: dict) -> str:
    """"deepseek" or "llama": the capture rule the engine's model class applies."""
    archs = set(target_config.get("architectures") or ())
    types = {target_config.get("model_type"), text_config(target_config).get("model_type")}
    if archs & DEEPSEEK_ARCHITECTURES or types & DEEPSEEK_MODEL_TYPES:
        return "deepseek"
    return "llama"


def auto_defaults_key(target_config: dict | None) -> str:
    """architectures[0] of the target ("Unknown" when there is no config)."""
    return architecture(target_config or {}) or "Unknown"
