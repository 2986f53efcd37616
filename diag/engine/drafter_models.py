"""Which EAGLE-3 drafter architectures an engine release can build at all.

SGLang picks the draft model's class from the drafter config's `architectures[0]`; its
EAGLE-3 classes in 0.5.23 are the `EntryClass` of srt/models/llama_eagle3.py
(LlamaForCausalLMEagle3) and srt/models/kimi_k25_eagle3.py (Eagle3DeepseekV2ForCausalLM).
No module of that wheel reads speculators' config (no `transformer_layer_config`,
`speculators_config` or Eagle3Speculator anywhere in srt/): a speculators checkpoint is
refused at startup ("architectures ... not supported"); vLLM serves it.

This module knows class names per release; nothing about files or tensors.
"""

from __future__ import annotations

from diag.engine.versions import DEFAULT_ENGINE, engine

DRAFTER_CLASSES: dict[str, frozenset[str]] = {
    "sglang-0.5.23": frozenset({"LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM"}),
}


def builds_drafter(architecture: str, *, engine_name: str = DEFAULT_ENGINE) -> bool:
    """Whether the engine has a model class for this drafter architecture.
    Example: sglang-0.5.23, "Eagle3Speculator" -> False."""
    return architecture in DRAFTER_CLASSES[engine(engine_name).name]
