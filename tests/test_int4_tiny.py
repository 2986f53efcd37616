"""Tiny random checkpoints for the INT4 tests (a few hundred KB each), and a
check that they are what the other test files assume.

DeepSeek-V3: hidden 64, 3 layers (layer 0 dense), 8 routed experts top-2,
1 shared expert, moe_intermediate 32 (so group 32 divides every width).
Imported by the other tests/test_int4_*.py files as `test_int4_tiny`."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

TOKENIZER = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
             "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
             "decoder": None, "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1},
                                        "unk_token": "[UNK]"}}


def deepseek_config(**over):
    from transformers import DeepseekV3Config

    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
              n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
              first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=32,
              qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
              max_position_embeddings=128, tie_word_embeddings=False)
    kw.update(over)
    return DeepseekV3Config(**kw)


def save_model(model, directory: Path) -> Path:
    model.save_pretrained(str(directory))
    (directory / "tokenizer.json").write_text(json.dumps(TOKENIZER))
    return directory


def tiny_deepseek(directory: Path, seed: int = 0, **over) -> Path:
    """A random bf16 DeepSeek-V3 checkpoint saved by transformers (per-expert keys)."""
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(deepseek_config(**over)).to(torch.bfloat16)
    for p in model.parameters():  # larger weights so layers matter
        p.data.normal_(0, 0.08) if p.dim() > 1 else None
    return save_model(model, directory)


def tiny_llama(directory: Path, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False)
    return save_model(LlamaForCausalLM(cfg).to(torch.bfloat16), directory)


def edit_config(directory: Path, fn) -> None:
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(fn(cfg) or cfg))


def edit_tensors(directory: Path, fn, file: str = "model.safetensors") -> None:
    tensors = load_file(str(directory / file))
    save_file(fn(tensors) or tensors, str(directory / file), metadata={"format": "pt"})


def as_k25_wrapper(directory: Path, *, quantize_vision: bool = False) -> None:
    """Rewrite a DeepSeek-V3 checkpoint as Kimi-K2.5's multimodal wrapper:
    text weights under `language_model.`, quantization_config inside
    text_config, plus vision tower / projector weights."""
    def tensors(t):
        out = {f"language_model.{k}": v for k, v in t.items()}
        out["vision_tower.encoder.blocks.0.wqkv.weight"] = torch.randn(96, 32, dtype=torch.bfloat16)
        out["mm_projector.proj.0.weight"] = torch.randn(64, 32, dtype=torch.bfloat16)
        if quantize_vision:
            out["vision_tower.encoder.blocks.0.wo.weight_packed"] = torch.zeros(32, 4, dtype=torch.int32)
        return out

    def config(cfg):
        text = dict(cfg, model_type="kimi_k2")
        out = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "auto_map": {"AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
               "text_config": text, "vision_config": {"hidden_size": 32}}
        if "quantization_config" in cfg:      # K2.5 ships both copies (real-configs/kimi-k2.5)
            out["quantization_config"] = json.loads(json.dumps(cfg["quantization_config"]))
        return out

    edit_tensors(directory, tensors)
    edit_config(directory, config)


def test_tiny_deepseek_layout(tmp_path):
    d = tiny_deepseek(tmp_path / "ds")
    keys = load_file(str(d / "model.safetensors"))
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in keys
    assert keys["model.layers.1.mlp.experts.7.down_proj.weight"].shape == (64, 32)
    assert "model.layers.0.mlp.gate_proj.weight" in keys  # dense first layer
    assert "model.layers.1.mlp.shared_experts.up_proj.weight" in keys
    assert sum(f.stat().st_size for f in d.iterdir()) < 2_000_000
