"""Write a compressed-tensors `pack-quantized` INT4 checkpoint from a bf16 one.

For every targeted, non-ignored Linear `m` (matching: scheme.py), the shard
holding `m.weight` [out, in] instead holds
  m.weight_packed  int32 [out, in/8]       (format.pack_int4)
  m.weight_scale   bf16  [out, in/group]   (absmax / 7.5 per group)
  m.weight_shape   int64 [2] = [out, in]
exactly as compressed-tensors' PackedQuantizationCompressor writes them; every
other tensor is copied unchanged. Weights are cast to bf16 before quantizing,
so scales are bf16 as in Kimi's checkpoints. Fused 3-D expert tensors
(`...experts.gate_up_proj` [E, 2I, H], `...experts.down_proj` [E, H, I]) are
written per expert (`...experts.{e}.gate_proj.weight`), the on-disk layout of
Kimi. config.json gains the `quantization_config` block (a multimodal wrapper
gets it both at the top level and inside `text_config`, as Kimi-K2.5 ships it);
tokenizer and other files are copied.

This module knows the file layout of a quantized checkpoint; the numerics live
in format.py, name matching in scheme.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from diag.checkpoint.config import text_config
from diag.errors import DiagError
from diag.int4.format import check_group, pack_int4, quantize_rtn
from diag.int4.scheme import KIMI_IGNORE, quantization_config
from diag.checkpoint.headers import INDEX, load_shard, shard_files
from diag.int4.skeleton import build_meta, resolve_config, targeted_linears

_OWN_FILES = ("config.json", INDEX)


def quantize_checkpoint(src_dir, dst_dir, *, group_size: int = 32,
                        ignore=KIMI_IGNORE, targets=("Linear",)) -> Path:
    """bf16 safetensors checkpoint at src_dir -> INT4 pack-quantized at dst_dir."""
    src, dst = Path(src_dir), Path(dst_dir)
    if src.resolve() == dst.resolve():
        raise DiagError("quantize_checkpoint would overwrite its source", file=str(src),
                        expected="a different destination directory", found=str(dst))
    cfg = json.loads((src / "config.json").read_text())
    chosen = _chosen_linears(cfg, src, targets, ignore)
    dst.mkdir(parents=True, exist_ok=True)
    weight_map, quantized = _write_shards(src, dst, chosen, group_size)
    if not quantized:
        raise DiagError("no Linear weight matched the targets outside the ignore list",
                        file=str(src / "config.json"), field="targets/ignore",
                        expected="at least one quantized Linear",
                        found=f"targets={list(targets)}, ignore={list(ignore)}")
    if (src / INDEX).exists() or len(set(weight_map.values())) > 1:
        _write_index(dst, weight_map)
    _write_config(cfg, dst, quantization_config(group_size, targets=targets, ignore=ignore))
    _copy_other_files(src, dst)
    return dst


def _chosen_linears(cfg: dict, src: Path, targets, ignore) -> dict[str, tuple[int, int]]:
    """Checkpoint Linear names (with the wrapper prefix) to quantize -> [out, in]."""
    text = resolve_config(cfg, file=str(src / "config.json"))
    if text.quantization is not None:
        raise DiagError("the source checkpoint is already quantized", file=str(src / "config.json"),
                        field="quantization_config", expected="a bf16 checkpoint",
                        found=text.quantization.get("format"))
    return targeted_linears(build_meta(text), text.prefix, targets, ignore)


def split_fused_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fused 3-D expert tensors -> per-expert Linear weights; others unchanged.
    `L.experts.gate_up_proj` [E, 2I, H] -> `L.experts.{e}.gate_proj.weight` = [e, :I],
    `L.experts.{e}.up_proj.weight` = [e, I:]; `L.experts.down_proj` [E, H, I] ->
    `L.experts.{e}.down_proj.weight` = [e]."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        base, _, leaf = name.rpartition(".")
        if leaf == "gate_up_proj" and t.dim() == 3:
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}.{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{base}.{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif leaf == "down_proj" and t.dim() == 3:
            out.update({f"{base}.{e}.down_proj.weight": t[e].contiguous() for e in range(t.shape[0])})
        else:
            out[name] = t
    return out


def compress_weight(w: torch.Tensor, group_size: int, *, name: str,
                    file: str) -> dict[str, torch.Tensor]:
    """One Linear weight [out, in] -> its three compressed tensors (by suffix)."""
    if w.dim() != 2:
        raise DiagError("a targeted Linear weight is not 2-D", file=file, field=f"{name}.weight",
                        expected="[out, in]", found=list(w.shape))
    check_group(w.shape[1], group_size, field=f"{name}.weight", file=file)
    q, scale = quantize_rtn(w.to(torch.bfloat16), group_size)  # [out, in], [out, in/g]
    return {"weight_packed": pack_int4(q), "weight_scale": scale,
            "weight_shape": torch.tensor(list(w.shape), dtype=torch.int64)}


def _write_shards(src: Path, dst: Path, chosen: dict[str, tuple[int, int]],
                  group_size: int) -> tuple[dict[str, str], int]:
    weight_map: dict[str, str] = {}
    quantized = 0
    for shard in shard_files(src):
        out: dict[str, torch.Tensor] = {}
        for name, t in split_fused_experts(load_shard(shard)).items():
            module, _, leaf = name.rpartition(".")
            if leaf == "weight" and module in chosen:
                _check_shape(t, chosen[module], name, shard)
                parts = compress_weight(t, group_size, name=module, file=str(shard))
                out.update({f"{module}.{k}": v for k, v in parts.items()})
                quantized += 1
            else:
                out[name] = t.contiguous()
        save_file(out, str(dst / shard.name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(out, shard.name))
    return weight_map, quantized


def _check_shape(t: torch.Tensor, shape: tuple[int, int], name: str, shard: Path) -> None:
    if tuple(t.shape) != tuple(shape):
        raise DiagError("a Linear weight does not match the config", file=str(shard), field=name,
                        expected=list(shape), found=list(t.shape))


def _write_index(dst: Path, weight_map: dict[str, str]) -> None:
    total = sum((dst / f).stat().st_size for f in set(weight_map.values()))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (dst / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _write_config(cfg: dict, dst: Path, qc: dict) -> None:
    """A wrapper gets both copies, as Kimi-K2.5 ships them: top level and text_config."""
    out = json.loads(json.dumps(cfg))
    out["quantization_config"] = qc
    text_config(out)["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(out, indent=2) + "\n")


def _copy_other_files(src: Path, dst: Path) -> None:
    """Tokenizer, generation config, chat template...: everything that is not
    weights, the index or config.json."""
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in _OWN_FILES:
            shutil.copy2(f, dst / f.name)


__all__ = ["quantize_checkpoint", "split_fused_experts", "compress_weight"]
