"""Writing an EAGLE-3 drafter checkpoint in SGLang's format: config.json + model.safetensors.

The Llama drafter is written as LlamaForCausalLMEagle3 (model_type llama), the MLA drafter as
Eagle3DeepseekV2ForCausalLM (model_type deepseek_v3, its q_lora_rank ... v_head_dim), each
with the EAGLE-3.1 flags it uses (fc_norm, norm_output) and, for a drafter scoring with the
target's lm_head, no draft_vocab_size and no lm_head tensor. Only the zoo and tests write
drafters; users bring theirs. This module knows files and names; nothing about training.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from diag.drafter.model import Eagle3Drafter


def drafter_json(model: Eagle3Drafter, dtype: torch.dtype) -> dict:
    """config.json of `model` (without the layer ids: save_drafter adds them)."""
    c = model.cfg
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.dim_head, "num_hidden_layers": 1, "hidden_act": c.hidden_act,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
        "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "tie_word_embeddings": False, "torch_dtype": str(dtype).removeprefix("torch."),
        "norm_output": c.norm_output,
    }
    if c.attention == "mla":
        m = c.mla
        config.update(architectures=["Eagle3DeepseekV2ForCausalLM"], model_type="deepseek_v3",
                      q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
                      qk_nope_head_dim=m.qk_nope_head_dim, qk_rope_head_dim=m.qk_rope_head_dim,
                      v_head_dim=m.v_head_dim)
        del config["head_dim"]
    if c.fc_norm:
        config["fc_norm"] = True
    if c.norm_before_fc:
        config["norm_before_fc"] = True
    if c.lm_head_from_target:
        del config["draft_vocab_size"]
    return config


def save_drafter(model: Eagle3Drafter, out_dir: str | Path, *, aux_layer_ids: list[int] | None,
                 trained_layout: str | None = None, extra_config: dict | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write config.json + model.safetensors; returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = drafter_json(model, dtype)
    if aux_layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
                                  "use_aux_hidden_state": True}
    if trained_layout is not None:
        config["diag_trained_layout"] = trained_layout
    config.update(extra_config or {})
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (model.cfg.lm_head_from_target and k.startswith("lm_head."))}
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
