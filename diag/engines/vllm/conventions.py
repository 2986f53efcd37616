"""vLLM's layer-id convention, registered with the neutral machinery (diag/engines/conventions.py:
resolve, to_ids, readings). One rule for every covered release (capture.py says which models
capture at all).

Worked example (Kimi-K2.5, N = 61 layers): vllm [2, 30, 58] -> r = ids -> L2+L30+L58;
default (no ids) -> [2, 61//2, 61-3] -> L2+L30+L58.
This module holds data; the readings live in the neutral module.
"""

from __future__ import annotations

from diag.engines.conventions import DEFAULT_TERMS, Convention, register

CONVENTIONS: dict[str, Convention] = {
    # vllm/model_executor/models/llama.py: aux_hidden_state_layers = ids; the
    # forward appends the residual stream before layer idx -> L{id};
    # default (2, N//2, N-3) from get_eagle3_aux_hidden_state_layers.
    "vllm": Convention(
        "vllm", "vLLM v1", "vllm/model_executor/models/llama.py",
        "id i captures the input of layer i, L{i}", 0, False, False,
        0, -1, DEFAULT_TERMS, True),
}

register("vllm", CONVENTIONS)
