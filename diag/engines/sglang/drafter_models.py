"""Which EAGLE-3 drafter architectures an engine release can build at all.

SGLang picks the draft model's class from the drafter config's `architectures[0]`; its
EAGLE-3 classes are the `EntryClass` of srt/models/llama_eagle3.py (LlamaForCausalLMEagle3,
every release 0.5.6-0.5.23) and of srt/models/kimi_k25_eagle3.py (Eagle3DeepseekV2ForCausalLM,
first shipped in 0.5.12; the 0.5.6-0.5.11 wheels have no such file). No module of any wheel
reads speculators' config (no `transformer_layer_config`, `speculators_config` or
Eagle3Speculator anywhere in srt/): a speculators checkpoint is refused at startup
("architectures ... not supported"); vLLM serves it.

Worked example: Eagle3DeepseekV2ForCausalLM -> sglang-0.5.11 False, sglang-0.5.12 True;
Eagle3Speculator -> False on every release.

This module knows class names per release; nothing about files or tensors.
"""

from __future__ import annotations

from diag.engines.sglang.versions import DEFAULT_ENGINE, Since, since

DRAFTER_CLASSES: Since = (
    ("0.5.6", frozenset({"LlamaForCausalLMEagle3"})),
    ("0.5.12", frozenset({"LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM"})),
)


def drafter_classes(*, engine_name: str = DEFAULT_ENGINE) -> frozenset[str]:
    """The EAGLE-3 drafter classes this release registers."""
    return since(DRAFTER_CLASSES, engine_name)


def class_fix(architecture: str, classes: frozenset[str]) -> str:
    """How to serve a drafter whose class the release lacks, in SGLang's terms.
    Example: Eagle3DeepseekV2ForCausalLM on 0.5.11 -> "upgrade to SGLang 0.5.12 or newer (...)"."""
    if architecture == "Eagle3DeepseekV2ForCausalLM":
        return "upgrade to SGLang 0.5.12 or newer (srt/models/kimi_k25_eagle3.py serves MLA drafters)"
    return (f"convert it to {sorted(classes)[0]} (keys midlayer.*, ids in eagle_config), or serve it with an "
            "engine that reads speculators configs")


def builds_drafter(architecture: str, *, engine_name: str = DEFAULT_ENGINE) -> bool:
    """Whether the engine has a model class for this drafter architecture.
    Example: sglang-0.5.23, "Eagle3Speculator" -> False."""
    return architecture in drafter_classes(engine_name=engine_name)
