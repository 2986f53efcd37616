"""Target models of the zoo: their transformers configs and their on-disk format.

Files written per target (what a real Llama / Qwen3 / DeepSeek-V3 checkpoint holds):
  config.json             transformers config, `dtype` = the saved dtype
  generation_config.json  bos/eos/pad ids, greedy
  model.safetensors       weights in the save dtype; DeepSeek routed experts one
                          module each: model.layers.{l}.mlp.experts.{e}.gate_proj.weight
                          [I, H], .up_proj.weight [I, H], .down_proj.weight [H, I];
                          router `mlp.gate.weight` in the save dtype and
                          `mlp.gate.e_score_correction_bias` float32, as DeepSeek-V3 ships them
  tokenizer.json, tokenizer_config.json

transformers 5 holds experts fused in memory (`experts.gate_up_proj` [E, 2I, H],
`experts.down_proj` [E, H, I]); `per_expert_state` splits them so the file
does not depend on the transformers version that wrote it.

This module knows configs and tensor names; it knows nothing about training.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from diag.zoo.recipes import DeepseekShape, LlamaShape, Qwen3Shape, TargetRecipe

_FUSED = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)$")
_KEEP_FP32 = ("e_score_correction_bias",)


def hf_config(recipe: TargetRecipe, vocab_size: int, ids: dict[str, int]):
    """A LlamaConfig / Qwen3Config / DeepseekV3Config for the recipe's shape and the tokenizer's ids."""
    s = recipe.shape
    common = dict(vocab_size=vocab_size, hidden_size=s.hidden_size, num_hidden_layers=s.num_hidden_layers,
                  num_attention_heads=s.num_attention_heads, intermediate_size=s.intermediate_size,
                  max_position_embeddings=s.max_position_embeddings, rms_norm_eps=s.rms_norm_eps,
                  rope_theta=s.rope_theta, tie_word_embeddings=False, bos_token_id=ids["<|bos|>"],
                  eos_token_id=ids["<|eos|>"], pad_token_id=ids["<|pad|>"])
    if isinstance(s, LlamaShape):
        return LlamaConfig(num_key_value_heads=s.num_key_value_heads,
                           head_dim=s.hidden_size // s.num_attention_heads, **common)
    if isinstance(s, Qwen3Shape):
        return Qwen3Config(num_key_value_heads=s.num_key_value_heads, head_dim=s.head_dim, **common)
    if isinstance(s, DeepseekShape):
        return DeepseekV3Config(
            num_key_value_heads=s.num_attention_heads, q_lora_rank=s.q_lora_rank,
            kv_lora_rank=s.kv_lora_rank, qk_nope_head_dim=s.qk_nope_head_dim,
            qk_rope_head_dim=s.qk_rope_head_dim, v_head_dim=s.v_head_dim,
            moe_intermediate_size=s.moe_intermediate_size, n_routed_experts=s.n_routed_experts,
            num_experts_per_tok=s.num_experts_per_tok, n_shared_experts=s.n_shared_experts,
            first_k_dense_replace=s.first_k_dense_replace, n_group=s.n_group, topk_group=s.topk_group,
            routed_scaling_factor=s.routed_scaling_factor, norm_topk_prob=True,
            num_nextn_predict_layers=0, **common)
    raise TypeError(f"unknown target shape {type(s).__name__}")


def new_model(recipe: TargetRecipe, vocab_size: int, ids: dict[str, int]) -> torch.nn.Module:
    """Randomly initialised float32 model; the caller seeds torch first."""
    cfg = hf_config(recipe, vocab_size, ids)
    cls = {LlamaShape: LlamaForCausalLM, Qwen3Shape: Qwen3ForCausalLM}.get(type(recipe.shape), DeepseekV3ForCausalLM)
    return cls(cfg).float()


def per_expert_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Split fused expert tensors into DeepSeek's per-expert keys; other keys pass.
    gate_up_proj [E, 2I, H] -> experts.{e}.gate_proj.weight = [e, :I], up_proj = [e, I:]
    down_proj    [E, H, I]  -> experts.{e}.down_proj.weight = [e]
    Example: E=8, I=128, H=128: one fused [8, 256, 128] -> 16 tensors of [128, 128]."""
    out: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        m = _FUSED.match(key)
        if m is None:
            out[key] = t
            continue
        for e in range(t.shape[0]):
            base = f"{m['prefix']}.{e}"
            if m["kind"] == "down_proj":
                out[f"{base}.down_proj.weight"] = t[e]
            else:
                half = t.shape[1] // 2
                out[f"{base}.gate_proj.weight"], out[f"{base}.up_proj.weight"] = t[e, :half], t[e, half:]
    return out


def _cast(key: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not t.is_floating_point() or key.endswith(_KEEP_FP32):
        return t.float() if t.is_floating_point() else t
    return t.to(dtype)


def save_target(model: torch.nn.Module, out_dir: Path, save_dtype: str, eos_ids: list[int]) -> None:
    """config.json, generation_config.json and model.safetensors (see module docstring)."""
    dtype = getattr(torch, save_dtype)
    state = per_expert_state({k: v.detach() for k, v in model.state_dict().items()})
    state = {k: _cast(k, v, dtype).contiguous().clone() for k, v in sorted(state.items())}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["architectures"] = [type(model).__name__]          # what save_pretrained records
    cfg["dtype"] = save_dtype
    cfg.pop("torch_dtype", None)
    cfg.pop("_name_or_path", None)     # a model loaded from a directory names it: not this file's content
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen = GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=eos_ids,
                           pad_token_id=model.config.pad_token_id, do_sample=False)
    gen.save_pretrained(str(out_dir))
