"""Reading and writing EAGLE-3 drafter checkpoints (DESIGN.md §3).

Formats:
  SGLang / SpecForge `LlamaForCausalLMEagle3`: keys `midlayer.*`, `fc.weight` [H, k*Ht],
    `norm.weight`, `lm_head.weight` [Vd, H], `d2t` int64 [Vd], `t2d` bool [V], optional
    `embed_tokens.weight`; layer ids in `eagle_config.eagle_aux_hidden_state_layer_ids`.
  speculators `Eagle3Speculator`: the same tensors under `layers.0.*` instead of `midlayer.*`,
    `speculators_config` in config.json (read here; ids resolved elsewhere).

Every tensor the module needs must be present with the shape the config implies; anything
else is an error naming the file, the key, what was expected and what was found. This module
knows files and names; the arithmetic lives in model.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from diag.drafter.model import DrafterConfig, Eagle3Drafter
from diag.checkpoint.config import read_config_json
from diag.checkpoint.finite import check_finite
from diag.errors import DiagError

_IGNORED_KEYS = ("rope.", "rotary_emb.")


@dataclass(frozen=True)
class DrafterCheckpoint:
    path: Path
    config: dict          # config.json as read
    format: str           # "sglang-eagle3" | "speculators"
    weight_files: tuple[str, ...]


def read_config(path: Path) -> dict:
    return read_config_json(path, "drafter")


def _need(cfg: dict, key: str, file: Path, default=None):
    if key in cfg:
        return cfg[key]
    if default is not None:
        return default
    raise DiagError("drafter config lacks a required key", file=str(file / "config.json"),
                    field=key, expected="present", found="missing")


def _read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise DiagError("drafter checkpoint holds no weights", file=str(path),
                        expected="*.safetensors (or pytorch_model.bin converted to safetensors)",
                        found="no .safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                shard = {k: fh.get_tensor(k) for k in fh.keys()}
        except Exception as err:  # safetensors raises several types for corrupt files
            raise DiagError("cannot read safetensors file", file=str(f),
                            expected="a valid safetensors file", found=str(err)) from err
        for k, t in shard.items():
            check_finite(k, t, str(f))
        tensors.update(shard)
    return tensors, tuple(f.name for f in files)


def drafter_config(cfg: dict, tensors: dict[str, torch.Tensor], path: Path) -> DrafterConfig:
    hidden = int(_need(cfg, "hidden_size", path))
    heads = int(_need(cfg, "num_attention_heads", path))
    target_hidden = int(cfg.get("target_hidden_size") or hidden)
    fc = tensors.get("fc.weight")
    fc_in = fc.shape[1] if fc is not None else 3 * target_hidden
    if fc_in % target_hidden:
        raise DiagError("fc input width is not a multiple of the target hidden size",
                        file=str(path), field="fc.weight",
                        expected=f"[{hidden}, k*{target_hidden}]", found=list(fc.shape))
    return DrafterConfig(
        hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        intermediate_size=int(_need(cfg, "intermediate_size", path)),
        vocab_size=int(_need(cfg, "vocab_size", path)),
        draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
        target_hidden_size=target_hidden, num_aux=fc_in // target_hidden,
        head_dim=cfg.get("head_dim"), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(cfg.get("rope_theta", 10000.0)), rope_scaling=cfg.get("rope_scaling"),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        norm_output=bool(cfg.get("norm_output", False)))


def _canonical(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str]:
    """speculators' `layers.0.` -> SGLang's `midlayer.`; drop a `model.` prefix."""
    fmt = "speculators" if any(k.startswith("layers.0.") for k in tensors) else "sglang-eagle3"
    out = {}
    for k, v in tensors.items():
        k = k.removeprefix("model.")
        if k.startswith("layers.0."):
            k = "midlayer." + k[len("layers.0."):]
        out[k] = v
    return out, fmt


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Eagle3Drafter, DrafterCheckpoint]:
    """Load a drafter strictly: every parameter present, every shape as the config implies."""
    path = Path(path)
    cfg = read_config(path)
    raw, files = _read_tensors(path)
    tensors, fmt = _canonical(raw)
    dcfg = drafter_config(cfg, tensors, path)
    model = Eagle3Drafter(dcfg)
    if "embed_tokens.weight" in tensors:
        emb = tensors.pop("embed_tokens.weight")
        model.embed_tokens = torch.nn.Embedding(emb.shape[0], emb.shape[1])
    expected = {k: v for k, v in model.state_dict().items() if not k.startswith(_IGNORED_KEYS)}
    if "d2t" not in tensors and dcfg.draft_vocab_size == dcfg.vocab_size:
        tensors["d2t"] = torch.zeros(dcfg.draft_vocab_size, dtype=torch.long)  # identity map
        tensors["t2d"] = torch.ones(dcfg.vocab_size, dtype=torch.bool)
    _check_tensors(expected, tensors, path, files)
    model.load_state_dict({**tensors, **_rope_buffers(model)}, strict=False)
    if model.embed_tokens is not None:
        model.embed_tokens.weight.data.copy_(emb)
    return model.to(dtype).eval(), DrafterCheckpoint(path, cfg, fmt, files)


def _rope_buffers(model: Eagle3Drafter) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if k.startswith(_IGNORED_KEYS)}


def _check_tensors(expected: dict, found: dict, path: Path, files: tuple[str, ...]) -> None:
    where = str(path / files[0]) if len(files) == 1 else f"{path}/{{{','.join(files)}}}"
    for key, ref in expected.items():
        if key not in found:
            raise DiagError("drafter checkpoint is missing a weight (it would stay randomly initialised)",
                            file=where, field=key, expected=f"tensor {list(ref.shape)}", found="missing")
        if tuple(found[key].shape) != tuple(ref.shape):
            raise DiagError("drafter weight has the wrong shape for its config", file=where, field=key,
                            expected=list(ref.shape), found=list(found[key].shape))
    extra = sorted(set(found) - set(expected))
    if extra:
        raise DiagError("drafter checkpoint holds weights this drafter format does not use",
                        file=where, field=", ".join(extra[:5]),
                        expected="only midlayer.*, fc, norm, lm_head, d2t, t2d, embed_tokens",
                        found=f"{len(extra)} unexpected tensor(s)")
    d2t, t2d = found["d2t"], found["t2d"]
    mapped = torch.arange(len(d2t)) + d2t.long()
    if mapped.min() < 0 or mapped.max() >= len(t2d):
        raise DiagError("d2t maps draft ids outside the target vocabulary", file=where, field="d2t",
                        expected=f"0 <= d + d2t[d] < {len(t2d)}",
                        found=f"range [{int(mapped.min())}, {int(mapped.max())}]")
    if not bool(t2d.bool()[mapped].all()) or int(t2d.sum()) != len(d2t):
        raise DiagError("d2t and t2d disagree about the hot vocabulary", file=where, field="t2d",
                        expected=f"t2d true exactly at d + d2t[d] ({len(d2t)} ids)",
                        found=f"{int(t2d.sum())} true entries")


def save_drafter(model: Eagle3Drafter, out_dir: str | Path, *, aux_layer_ids: list[int] | None,
                 trained_layout: str | None = None, extra_config: dict | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write config.json + model.safetensors in SGLang/SpecForge LlamaForCausalLMEagle3 format."""
    c = model.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
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
    if aux_layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
                                  "use_aux_hidden_state": True}
    if trained_layout is not None:
        config["diag_trained_layout"] = trained_layout
    config.update(extra_config or {})
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not k.startswith(_IGNORED_KEYS)}
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out

