"""SGLang's layer-id conventions, one per version range in which its capture rule held,
registered with the neutral machinery (diag/engines/conventions.py: resolve, to_ids, readings).
Which one a release applies to which target is capture.py's table.

Worked examples (Kimi-K2.5, N = 61 layers):
  sglang-llama    [2, 30, 58] -> r = [3, 31, 59]  -> L3+L31+L59
  sglang-llama    [-1, 2, 30] -> r = [0, 3, 31]   -> embed+L3+L31 (0.5.22+; before: TypeError)
  sglang-deepseek [2, 30, 58] -> first id != 1, r = ids -> L2+L30+L58
  sglang-deepseek [1, 29, 57] -> first id == 1, r = ids+1 -> L2+L30+L58
  sglang-deepseek [0, 3, 31]  -> first id != 1, r = ids -> embed+L3+L31 (0.5.14+)
  sglang-deepseek-pre-0.5.13 [2, 30, 58] -> r = ids+1 -> L3+L31+L59 (always +1, as Llama)
  sglang default  (no ids)    -> r = [2, 61//2, 61-3] -> L2+L30+L58
This module holds data; the readings live in the neutral module.
"""

from __future__ import annotations

from diag.engines.conventions import DEFAULT_TERMS, Convention, register

_SGL_DEFAULT = DEFAULT_TERMS
_LLAMA_PY = "python/sglang/srt/models/llama.py"
_DEEPSEEK_PY = "python/sglang/srt/models/deepseek_v2.py"

CONVENTIONS: dict[str, Convention] = {
    # llama.py set_eagle3_layers_to_capture (identical 0.5.6-0.5.23): layers_to_capture =
    # [id + 1 for id in layer_ids], default [2, N//2, N-3]; LlamaModel.forward captures the
    # residual stream entering layer i for i in layers_to_capture, i over range(N): ascending
    # order, r <= N-1. Since 0.5.22 the capture runs in the layer boundary
    # (layers/layer_boundary/stage.py), which at layer 0 captures the embeddings: id -1 = embed.
    "sglang-llama": Convention(
        "sglang-llama", "SGLang 0.5.22–0.5.23", _LLAMA_PY,
        "id i captures the output of layer i, L{i+1}; id -1 the embeddings; ascending layer order",
        1, False, True, 0, -1, _SGL_DEFAULT, False),
    # 0.5.6-0.5.21: LlamaModel.forward appends `hidden_states + residual` before layer i, and
    # residual is None before layer 0: id -1 (layers_to_capture 0) raises a TypeError at the
    # first forward, so r >= 1.
    "sglang-llama-pre-0.5.22": Convention(
        "sglang-llama-pre-0.5.22", "SGLang 0.5.6–0.5.21", _LLAMA_PY,
        "id i captures the output of layer i, L{i+1}; ascending layer order; no embeddings "
        "(`hidden_states + residual` with residual None at layer 0)",
        1, False, True, 1, -1, _SGL_DEFAULT, False),
    # deepseek_v2.py set_eagle3_layers_to_capture since 0.5.13: [id + 1 ...] only
    # `if layer_ids and layer_ids[0] == 1`, else list(layer_ids); default [2, N//2, N-3].
    # Since 0.5.14 the capture runs in the layer communicator
    # (prepare_attn_and_capture_last_layer_outputs), which at layer 0 captures the
    # embeddings (residual = hidden_states): id 0 = embed.
    "sglang-deepseek": Convention(
        "sglang-deepseek", "SGLang 0.5.14–0.5.23", _DEEPSEEK_PY,
        "id i captures L{i+1} if the first id is 1, else L{i} (id 0 = the embeddings); "
        "ascending layer order", 0, True, True, 0, -1, _SGL_DEFAULT, False),
    # 0.5.13, 0.5.13.post1: the first-id rule, but DeepseekV2Model.forward still appends
    # `hidden_states + residual` before layer i (residual None at layer 0), so r >= 1.
    "sglang-deepseek-0.5.13": Convention(
        "sglang-deepseek-0.5.13", "SGLang 0.5.13–0.5.13.post1", _DEEPSEEK_PY,
        "id i captures L{i+1} if the first id is 1, else L{i}; ascending layer order; no "
        "embeddings (`hidden_states + residual` with residual None at layer 0)",
        0, True, True, 1, -1, _SGL_DEFAULT, False),
    # 0.5.6-0.5.12.post1: deepseek_v2.py's set_eagle3_layers_to_capture is llama.py's, always
    # [id + 1 ...]; no embeddings either.
    "sglang-deepseek-pre-0.5.13": Convention(
        "sglang-deepseek-pre-0.5.13", "SGLang 0.5.6–0.5.12.post1", _DEEPSEEK_PY,
        "id i captures the output of layer i, L{i+1}; ascending layer order; no embeddings "
        "(`hidden_states + residual` with residual None at layer 0)",
        1, False, True, 1, -1, _SGL_DEFAULT, False),
    # SGLang reads ids only from the drafter's nested
    # eagle_config.eagle_aux_hidden_state_layer_ids; without them both llama.py
    # and deepseek_v2.py capture layers_to_capture = [2, N//2, N-3] directly
    # (identical default in both families and every version 0.5.6-0.5.23).
    "sglang-default": Convention(
        "sglang-default", "SGLang 0.5.6–0.5.23", "python/sglang/srt/models/{llama,deepseek_v2}.py",
        "no ids in eagle_config: L2, L{N//2}, L{N-3} whatever else the config says", 0, False,
        True, 0, -1, _SGL_DEFAULT, False, reads_ids=False),
}

register("sglang", CONVENTIONS)
