"""Tiny checkpoints with the structure of the published ones in tests/fixtures/real-configs.

`shrink(config)` keeps every key of a real config.json (nesting, model_type spellings,
quantization_config copies and ignore list, rope_scaling / rope_parameters, auto_map,
tie_word_embeddings, optional fields) and replaces only widths, counts and token ids:
hidden 7168 -> 64, 61 layers -> 6, 384 experts -> 8, vocab 163840 -> 512 (bos 163584 ->
256: ids keep their distance from the top when it is small, else id mod 256),
draft_vocab_size 32000 -> 64 (a full-vocabulary one -> 512).

Tensors are named as the published checkpoints name them, written here from the formats'
facts, not from diag's modules: targets by transformers' own model for the text config
(routed experts per expert, the K2.5 wrapper's `language_model.` prefix, dense vision weights,
routed experts packed to compressed-tensors INT4); drafters by their format (SpecForge /
TorchSpec Llama: midlayer.*; TorchSpec MLA: layers.0.* with q_a_proj / kv_a_proj_with_mqa),
each shipping embed_tokens.weight, in the config's dtype.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

REAL = Path(__file__).parent / "fixtures" / "real-configs"
TINY_LAYERS = 6
VOCAB, DRAFT_VOCAB = 512, 64
WIDTHS = {"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_attention_heads": 4,
          "head_dim": 16, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
          "v_head_dim": 16, "n_routed_experts": 8, "num_experts": 8, "num_experts_per_tok": 2,
          "vt_hidden_size": 32, "text_hidden_size": 64, "mm_hidden_size": 32}
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
ROUTED = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj$")


def real(name: str) -> dict:
    return json.loads((REAL / name / "config.json").read_text())


def _token_id(value, real_vocab: int):
    if isinstance(value, list):
        return [_token_id(v, real_vocab) for v in value]
    if not isinstance(value, int) or value < VOCAB:
        return value
    top = real_vocab - value                      # Kimi: 163840 - 163584 = 256 from the top
    return VOCAB - top if 0 < top <= VOCAB // 2 else value % (VOCAB // 2)


def _shrink_level(cfg: dict, *, layers: int | None) -> None:
    real_vocab = cfg.get("vocab_size")
    for key, value in WIDTHS.items():
        if key in cfg:
            cfg[key] = value
    if "num_key_value_heads" in cfg:
        heads_equal = cfg.get("num_key_value_heads") == cfg.get("num_attention_heads", 0) or \
            cfg["num_key_value_heads"] >= 32
        cfg["num_key_value_heads"] = 4 if heads_equal else 2
    if isinstance(real_vocab, int):
        if cfg.get("draft_vocab_size") is not None:
            cfg["draft_vocab_size"] = VOCAB if cfg["draft_vocab_size"] == real_vocab else DRAFT_VOCAB
        cfg["vocab_size"] = VOCAB
        for key in ("bos_token_id", "eos_token_id", "pad_token_id", "media_placeholder_token_id"):
            if key in cfg:
                cfg[key] = _token_id(cfg[key], real_vocab)
    if "n_group" in cfg:                        # 8 experts: at most 4 groups of 2
        cfg["n_group"] = min(cfg["n_group"], 4)
        cfg["topk_group"] = min(cfg.get("topk_group", 1), cfg["n_group"])
    if layers is not None and cfg.get("num_hidden_layers", 1) > 1:
        cfg["num_hidden_layers"] = layers
    if "max_window_layers" in cfg:
        cfg["max_window_layers"] = layers or 1


def shrink(config: dict, *, layers: int = TINY_LAYERS) -> dict:
    out = copy.deepcopy(config)
    _shrink_level(out, layers=layers)
    if isinstance(out.get("text_config"), dict):
        _shrink_level(out["text_config"], layers=layers)
    if isinstance(out.get("transformer_layer_config"), dict):
        _shrink_level(out["transformer_layer_config"], layers=None)
    return out


def dtype_of(cfg: dict) -> torch.dtype:
    text = cfg.get("text_config") or cfg
    return _DTYPES.get(cfg.get("torch_dtype") or cfg.get("dtype") or text.get("torch_dtype") or
                       text.get("dtype") or "bfloat16", torch.bfloat16)


def _random(shape, dtype, gen, name: str) -> torch.Tensor:
    if len(shape) == 1:
        return torch.ones(shape, dtype=dtype) if "bias" not in name else torch.zeros(shape, dtype=torch.float32)
    return (torch.randn(shape, generator=gen) * shape[-1] ** -0.5).to(dtype)


# ---- targets ---------------------------------------------------------------------------------

def _text_state(config: dict) -> tuple[dict[str, tuple[int, ...]], str]:
    """transformers' own parameter names and shapes for the (shrunk) text model, experts per
    expert, and the wrapper's prefix ("language_model." for K2.5)."""
    from diag.int4.skeleton import build_meta, resolve_config
    from diag.int4.write import split_fused_experts

    text = resolve_config(config)
    model = build_meta(text)
    shapes = {n: t for n, t in model.state_dict().items()}
    flat = split_fused_experts({n: torch.empty(t.shape, device="meta") for n, t in shapes.items()})
    return {n: tuple(t.shape) for n, t in flat.items()}, text.prefix


def build_target(name: str, out: Path, *, seed: int = 0) -> Path:
    """config.json (the shrunk real one, verbatim otherwise), model.safetensors, a tokenizer."""
    from diag.int4.write import compress_weight
    from tiny import make_tokenizer

    config = shrink(real(name))
    shapes, prefix = _text_state(config)
    dtype, gen = dtype_of(config), torch.Generator().manual_seed(seed)
    quant = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    packs = quant is not None and quant.get("format") == "pack-quantized"
    tensors = {}
    for n, shape in shapes.items():
        t = _random(shape, torch.float32 if n.endswith("e_score_correction_bias") else dtype, gen, n)
        module = n.removesuffix(".weight")
        if packs and n.endswith(".weight") and ROUTED.search(module):
            tensors.update({f"{prefix}{module}.{k}": v for k, v in compress_weight(t, 32, name=module,
                                                                                    file=name).items()})
        else:
            tensors[prefix + n] = t
    if prefix:                                   # the wrapper's non-text weights, stored dense
        tensors["vision_tower.encoder.blocks.0.wqkv.weight"] = _random((96, 32), dtype, gen, "v")
        tensors["mm_projector.proj.0.weight"] = _random((64, 128), dtype, gen, "p")
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    make_tokenizer(out, VOCAB)
    return out


# ---- drafters --------------------------------------------------------------------------------

def _llama_layer(c: dict) -> dict[str, tuple[int, ...]]:
    h, nh, nkv = c["hidden_size"], c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    hd, i = c.get("head_dim") or h // nh, c["intermediate_size"]
    return {"self_attn.q_proj.weight": (nh * hd, 2 * h), "self_attn.k_proj.weight": (nkv * hd, 2 * h),
            "self_attn.v_proj.weight": (nkv * hd, 2 * h), "self_attn.o_proj.weight": (h, nh * hd),
            **_mlp_and_norms(h, i)}


def _mla_layer(c: dict) -> dict[str, tuple[int, ...]]:
    h, nh, i = c["hidden_size"], c["num_attention_heads"], c["intermediate_size"]
    q, kv, nope, rope, v = (c[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                           "qk_rope_head_dim", "v_head_dim"))
    return {"self_attn.q_a_proj.weight": (q, 2 * h), "self_attn.q_a_layernorm.weight": (q,),
            "self_attn.q_b_proj.weight": (nh * (nope + rope), q),
            "self_attn.kv_a_proj_with_mqa.weight": (kv + rope, 2 * h), "self_attn.kv_a_layernorm.weight": (kv,),
            "self_attn.kv_b_proj.weight": (nh * (nope + v), kv), "self_attn.o_proj.weight": (h, nh * v),
            **_mlp_and_norms(h, i)}


def _mlp_and_norms(h: int, i: int) -> dict[str, tuple[int, ...]]:
    return {"mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i),
            "input_layernorm.weight": (h,), "hidden_norm.weight": (h,), "post_attention_layernorm.weight": (h,)}


def drafter_tensors(config: dict, *, seed: int = 1) -> dict[str, torch.Tensor]:
    """The tensors a published drafter with this (shrunk) config ships."""
    mla = config["architectures"][0] == "Eagle3DeepseekV2ForCausalLM"
    c, dtype, gen = config, dtype_of(config), torch.Generator().manual_seed(seed)
    ids = (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0]
    h, vocab, draft = c["hidden_size"], c["vocab_size"], c.get("draft_vocab_size")
    prefix = "layers.0." if mla else "midlayer."
    shapes = {prefix + k: s for k, s in (_mla_layer(c) if mla else _llama_layer(c)).items()}
    shapes |= {"fc.weight": (h, len(ids) * h), "norm.weight": (h,), "embed_tokens.weight": (vocab, h)}
    if c.get("fc_norm"):
        shapes |= {f"fc_norm.{j}.weight": (h,) for j in range(len(ids))}
    if draft is not None:
        shapes["lm_head.weight"] = (draft, h)
    out = {n: _random(s, dtype, gen, n) for n, s in shapes.items()}
    if draft is not None and draft < vocab:
        hot = torch.randperm(vocab, generator=gen)[:draft].sort().values
        out["d2t"] = hot - torch.arange(draft)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[hot] = True
        out["t2d"] = t2d
    return out


def build_drafter(name: str, out: Path, *, ids: list[int] | None = None, weights: bool = True) -> Path:
    """The shrunk real config (ids replaced when given, for a tiny target) and its tensors."""
    config = shrink(real(name))
    if ids is not None:
        config.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = ids
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if weights:
        save_file(drafter_tensors(config), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def config_only(name: str, out: Path, *, edit=None) -> Path:
    """The real config.json alone, at real widths (what users lint before downloading)."""
    config = real(name)
    if edit is not None:
        edit(config)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
