"""Loading a target checkpoint (any local transformers causal LM) with clear failures.

Plain checkpoints go through transformers' from_pretrained with remote code refused and
every missing weight an error (transformers itself only warns and leaves it random).
compressed-tensors `pack-quantized` checkpoints go to diag.int4.load, which keeps the
packed weights packed. This module knows files and configs; it knows nothing about
capture points, drafters or reports.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from diag.checkpoint.config import positive_int, read_config_json, text_config
from diag.checkpoint.finite import check_finite
from diag.errors import DiagError


@dataclass(frozen=True)
class TargetInfo:
    path: str
    architecture: str          # architectures[0] as written (a wrapper names itself)
    num_layers: int
    hidden_size: int
    vocab_size: int
    config_hash: str           # sha256 of config.json bytes, first 16 hex digits
    quantization: str | None   # "pack-quantized" or None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def read_target_config(path: str | Path) -> dict:
    return read_config_json(path, "target")


def quantization_format(cfg: dict, *, file: str | None = None) -> str | None:
    """"pack-quantized" (compressed-tensors INT4, Kimi's), another compressed-tensors format
    (refused by load_target), or None; any other quant_method is refused here, from the config
    alone: DeepSeek-V3's and Kimi-K2-Instruct's block FP8 (quant_method "fp8",
    weight_scale_inv) would otherwise reach transformers' own FP8 path."""
    q = cfg.get("quantization_config") or text_config(cfg).get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method")
    if method != "compressed-tensors":
        raise DiagError("unsupported quantization format", file=file,
                        field="quantization_config.quant_method",
                        expected="compressed-tensors pack-quantized (INT4), or an unquantized checkpoint",
                        found=f"{method!r} ({q.get('fmt') or q.get('format') or 'no format'})",
                        hint="dequantize it to bf16 first (DeepSeek's fp8_cast_bf16.py for block FP8)")
    return q.get("format")


def target_info(path: str | Path) -> TargetInfo:
    """Everything diag needs to know about a target without loading weights."""
    cfg = read_target_config(path)
    tcfg = text_config(cfg)
    arch = (cfg.get("architectures") or ["?"])[0]
    where = str(Path(path) / "config.json")
    for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
        if key not in tcfg:
            raise DiagError("target config lacks a required key", file=where,
                            field=key, expected="an integer", found="missing")
        positive_int(cfg, key, file=where, what="target config")      # "6" (a string) is refused here
    digest = hashlib.sha256((Path(path) / "config.json").read_bytes()).hexdigest()[:16]
    return TargetInfo(str(path), arch, int(tcfg["num_hidden_layers"]), int(tcfg["hidden_size"]),
                      int(tcfg["vocab_size"]), digest,
                      quantization_format(cfg, file=str(Path(path) / "config.json")))


def load_target(path: str | Path, *, dtype: torch.dtype | None = None, device_map=None):
    """Load weights; returns (model in eval mode, TargetInfo)."""
    info = target_info(path)
    if info.quantization == "pack-quantized":
        from diag.int4.load import load_packed_target
        model = load_packed_target(path, dtype=dtype or torch.bfloat16,
                                   device=device_map if device_map is not None else "cpu")
        if any(p.is_cuda for p in model.parameters()):
            from diag.int4.fast import accelerate
            accelerate(model)          # fused dequant + grouped GEMM for the routed experts
        return model.eval(), info
    if info.quantization is not None:
        raise DiagError("unsupported quantization format", file=str(Path(path) / "config.json"),
                        field="quantization_config.format", expected="pack-quantized or none",
                        found=info.quantization)
    return _load_plain(path, info, dtype, device_map).eval(), info


def plain_config(cfg: dict, file: str):
    """The transformers config to build an unquantized target with, when config.json alone
    would not do (None: let from_pretrained read it). `kimi_k2` is DeepSeek-V3 under another
    model_type that only remote code knows: built as deepseek_v3, the same weights (the INT4
    loader does the same). A multimodal wrapper (Kimi-K2.5's `text_config`) is loaded text-only
    by the INT4 loader alone; unquantized it is an error here, before any weight is read."""
    q = cfg.get("quantization_config") or text_config(cfg).get("quantization_config")
    if q:
        if isinstance(q, dict) and q.get("format") == "pack-quantized":
            return None
        raise DiagError("unsupported quantization format", file=file, field="quantization_config",
                        expected="compressed-tensors pack-quantized (INT4), or no quantization_config",
                        found=(q.get("format") or q.get("quant_method")) if isinstance(q, dict) else q)
    from diag.int4.skeleton import MODEL_TYPE_ALIASES, build_config, resolve_config
    if text_config(cfg) is not cfg:
        raise DiagError("an unquantized multimodal wrapper cannot be loaded as a target", file=file,
                        field="text_config", expected="a plain causal-LM config, or the wrapper as a "
                        "compressed-tensors pack-quantized checkpoint (loaded text-only)",
                        found=f"model_type {cfg.get('model_type')!r} wrapping "
                              f"{text_config(cfg).get('model_type')!r} without quantization_config")
    if cfg.get("model_type") in MODEL_TYPE_ALIASES:
        return build_config(resolve_config(cfg, file=file))
    return None


def _load_plain(path, info: TargetInfo, dtype, device_map):
    from transformers import AutoModelForCausalLM

    if not list(Path(path).glob("*.safetensors")):
        raise DiagError("target checkpoint holds no safetensors weights", file=str(path),
                        expected="model.safetensors or sharded *.safetensors", found="none")
    from safetensors import SafetensorError
    config = plain_config(read_target_config(path), str(Path(path) / "config.json"))
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype or "auto", trust_remote_code=False, device_map=device_map,
            output_loading_info=True, **({"config": config} if config is not None else {}))
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as err:
        raise DiagError("transformers could not load the target", file=str(path),
                        expected="a transformers causal-LM checkpoint",
                        found=f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}") from err
    _check_loading(loading, path)
    _check_finite_params(model, Path(path))
    return model


def _check_loading(loading: dict, path) -> None:
    """Missing, unexpected (e.g. layers beyond num_hidden_layers) or misshapen weights are errors;
    transformers itself only reports them."""
    unexpected = sorted(k for k in loading.get("unexpected_keys", []) if "rotary_emb" not in k)
    if unexpected:
        raise DiagError("target checkpoint holds weights the model built from config.json has no place "
                        "for (transformers would drop them silently)", file=str(path),
                        field=", ".join(unexpected[:5]), expected="every weight used by the model",
                        found=f"{len(unexpected)} unexpected tensor(s)")
    missing = [k for k in loading.get("missing_keys", []) if "rotary_emb" not in k]
    if missing:
        raise DiagError("target checkpoint is missing weights (transformers would leave them random)",
                        file=str(path), field=", ".join(sorted(missing)[:5]),
                        expected="every parameter present in the safetensors files",
                        found=f"{len(missing)} missing")
    mismatched = loading.get("mismatched_keys", [])
    if mismatched:
        raise DiagError("target weights have shapes that disagree with config.json", file=str(path),
                        field=str(mismatched[0]), expected="shapes implied by config.json",
                        found=f"{len(mismatched)} mismatched tensor(s)")


def _check_finite_params(model, path: Path) -> None:
    """NaN / Inf in any loaded weight, tensor by tensor where it lives (no second read of the
    files: transformers has just placed each one), named with its shard."""
    where = _tensor_locations(path)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type != "meta":                # offloaded by a device map: not in memory
            check_finite(name, t.detach(), str(where.get(name, path)))


_EMBED_KEYS = ("model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
               "model.language_model.embed_tokens.weight")
_HEAD_KEYS = ("lm_head.weight", "language_model.lm_head.weight")


def _tensor_locations(path: Path) -> dict[str, Path]:
    """Tensor name -> shard file, from model.safetensors.index.json or the files' headers."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return {k: path / v for k, v in weight_map.items()}
    from safetensors import safe_open
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            out.update({k: f for k in fh.keys()})
    return out


def load_embed_and_head(path: str | Path) -> tuple[torch.nn.Embedding, torch.nn.Linear]:
    """Only the input embedding and lm_head of a target, read straight from its shards: what
    the drafter needs when the target pass itself comes from the cache."""
    from safetensors import safe_open
    path = Path(path)
    where = _tensor_locations(path)
    tcfg = text_config(read_target_config(path))

    def read(keys, what):
        for k in keys:
            if k in where:
                with safe_open(str(where[k]), framework="pt") as fh:
                    t = fh.get_tensor(k)
                check_finite(k, t, str(where[k]))
                return t
        return None

    emb = read(_EMBED_KEYS, "embed")
    if emb is None:
        raise DiagError("target checkpoint has no input embedding", file=str(path), field=" | ".join(_EMBED_KEYS),
                        expected="one of these tensors", found="none")
    head = read(_HEAD_KEYS, "head")
    if head is None:
        if not tcfg.get("tie_word_embeddings", False):
            raise DiagError("target checkpoint has no lm_head and does not tie it to the embedding",
                            file=str(path), field="lm_head.weight", expected="present or tie_word_embeddings",
                            found="missing")
        head = emb
    lin = torch.nn.Linear(head.shape[1], head.shape[0], bias=False, dtype=head.dtype)
    lin.weight.data = head
    return torch.nn.Embedding.from_pretrained(emb, freeze=True), lin
