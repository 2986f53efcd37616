"""Which layer-id rule SGLang's capture code applies, per target model and version.

The target's model class owns `set_eagle3_layers_to_capture` (architectures.capture_model
says which class a config selects); the rule it applies changed over the releases:

  llama    0.5.6–0.5.21   sglang-llama-pre-0.5.22     id + 1; id -1 (embed) raises a TypeError
           0.5.22–0.5.23  sglang-llama                id + 1; id -1 = embed
  deepseek 0.5.6–0.5.12.post1 sglang-deepseek-pre-0.5.13  id + 1 always (llama.py's rule)
           0.5.13–0.5.13.post1 sglang-deepseek-0.5.13  +1 only when the first id is 1; no embed
           0.5.14–0.5.23  sglang-deepseek             +1 only when the first id is 1; id 0 = embed
  kimi_k25 0.5.6–0.5.8    no KimiK25ForConditionalGeneration model class at all
           0.5.9          the class has no set_eagle3_layers_to_capture: EAGLE3 cannot start
           0.5.10–0.5.23  delegates to its language_model (DeepseekV3): the deepseek rule
  kimi_vl  every version  KimiVLForConditionalGeneration has no set_eagle3_layers_to_capture

Worked example: ids [2, 30, 58] on Kimi-K2.5 (KimiK25ForConditionalGeneration, 61 layers)
  0.5.10.post1 -> sglang-deepseek-pre-0.5.13 -> L3+L31+L59
  0.5.23       -> sglang-deepseek            -> L2+L30+L58; and [0, 3, 31] -> embed+L3+L31.

Decode rounds under CUDA graphs (model_executor/cuda_graph_runner.py, model_runner.py):
up to 0.5.10.post1 the graph runner calls `set_eagle3_layers_to_capture()` with no ids
before capturing its graphs, and the drafter's ids are set only afterwards; every graph
replay (the target's verify forward of each decode round) therefore captures the default
layers [2, N//2, N-3], while the eager prefill captures the configured ids. 0.5.11 moved
`init_aux_hidden_state_capture` before `init_device_graphs` ("Must be called BEFORE
init_device_graphs() so CUDA graph capture runs with aux hidden state capture enabled").

This module knows names and versions; the readings of ids live in conventions.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.engines.sglang.versions import Engine, Since, engine, since, span_of


@dataclass(frozen=True)
class NoCapture:
    """The engine cannot run EAGLE3 aux capture on this target at this version, and why."""

    reason: str


_DEEPSEEK = "@deepseek"   # the value of the deepseek table at the same version

CAPTURE: dict[str, Since] = {
    # python/sglang/srt/models/llama.py (LlamaModel.forward, set_eagle3_layers_to_capture)
    "llama": (("0.5.6", "sglang-llama-pre-0.5.22"), ("0.5.22", "sglang-llama")),
    # python/sglang/srt/models/deepseek_v2.py (DeepseekV2Model.forward,
    # DeepseekV2ForCausalLM.set_eagle3_layers_to_capture)
    "deepseek": (("0.5.6", "sglang-deepseek-pre-0.5.13"), ("0.5.13", "sglang-deepseek-0.5.13"),
                 ("0.5.14", "sglang-deepseek")),
    # python/sglang/srt/models/kimi_k25.py
    "kimi_k25": (
        ("0.5.6", NoCapture("SGLang has no KimiK25ForConditionalGeneration model class before "
                            "0.5.9 (python/sglang/srt/models/kimi_k25.py)")),
        ("0.5.9", NoCapture("KimiK25ForConditionalGeneration has no set_eagle3_layers_to_capture "
                            "in 0.5.9 (python/sglang/srt/models/kimi_k25.py): EAGLE3 fails at "
                            "startup with an AttributeError in model_runner.py")),
        ("0.5.10", _DEEPSEEK)),
    # python/sglang/srt/models/kimi_vl.py
    "kimi_vl": (("0.5.6", NoCapture("KimiVLForConditionalGeneration has no "
                                    "set_eagle3_layers_to_capture (python/sglang/srt/models/"
                                    "kimi_vl.py): EAGLE3 fails at startup")),),
}

# True: CUDA-graph decode rounds capture the default layers whatever the ids (see above).
GRAPH_DEFAULTS: Since = (("0.5.6", True), ("0.5.11", False))


def capture_rule(eng: Engine | str | None, capture_model: str) -> str | NoCapture:
    """The convention name this engine applies to this capture model, or NoCapture.
    Example: ("sglang-0.5.12.post1", "kimi_k25") -> "sglang-deepseek-pre-0.5.13"."""
    value = since(CAPTURE[capture_model], eng)
    return since(CAPTURE["deepseek"], eng) if value == _DEEPSEEK else value


def graph_replays_capture_defaults(eng: Engine | str | None) -> bool:
    """Whether CUDA-graph decode rounds capture [2, N//2, N-3] whatever the ids.
    Example: "sglang-0.5.10.post1" -> True; "sglang-0.5.11" -> False."""
    return since(GRAPH_DEFAULTS, eng)


def graph_rule_span(eng: Engine | str | None) -> str:
    """The releases sharing this engine's CUDA-graph capture behaviour, e.g. "0.5.6–0.5.10.post1"."""
    return span_of(GRAPH_DEFAULTS, engine(eng))
