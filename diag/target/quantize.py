"""Applying a quantization regime (regimes.py) to a loaded target, in place.

Fused expert tensors, plain Linears and diag's packed INT4 modules are all handled; the
notes say what was touched and what was a no-op. This module knows weights and names; it
knows nothing about files or replay.
"""

from __future__ import annotations

import torch
from torch import nn

from diag.errors import DiagError
from diag.int4.format import fake_quantize, pack_int4, quantize_rtn, dequantize
from diag.int4.packed import PackedExperts, PackedLinear
from diag.int4.sharded import checkpoint_owner
from diag.int4.scheme import is_targeted
from diag.target.regimes import FP8_MAX, Regime, regime


# ---- fp8 numerics --------------------------------------------------------

def fake_quantize_fp8_channel(w: torch.Tensor) -> torch.Tensor:
    """Per output channel FP8 E4M3 round trip in w's dtype.
    [out, in] -> [out, in]. Example: row absmax 896 -> scale 2.0; 3.3 -> 3.3/2 =
    1.65 -> e4m3 1.625 -> 3.25."""
    absmax = w.abs().amax(dim=-1, keepdim=True)  # [out, 1]
    scale = absmax / torch.tensor(FP8_MAX, dtype=w.dtype, device=w.device)
    eps = torch.tensor(torch.finfo(w.dtype).eps, dtype=w.dtype, device=w.device)
    scale = torch.where(scale == 0, eps, scale)
    q = torch.clamp(w / scale, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.to(w.dtype) * scale).to(w.dtype)


def _fake(reg: Regime, w: torch.Tensor) -> torch.Tensor:
    return fake_quantize(w, reg.group_size) if reg.kind == "w4a16" else fake_quantize_fp8_channel(w)


# ---- the plan: which tensors a regime touches ----------------------------

def _fused_experts(module: nn.Module) -> bool:
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(gu, nn.Parameter) and isinstance(dn, nn.Parameter) and gu.dim() == 3


def targeted_linears(model: nn.Module, reg: Regime) -> list[str]:
    """Checkpoint names of the Linears a quantizing regime changes, in model
    order; fused experts are listed per expert and projection."""
    out = []
    for name, module in model.named_modules():
        for ckpt in _linear_names(name, module):
            if is_targeted(ckpt, ("Linear", "Module"), reg.targets, reg.ignore):
                out.append(ckpt)
    return out


def _linear_names(name: str, module: nn.Module) -> list[str]:
    if isinstance(module, (nn.Linear, PackedLinear)):
        return [name]
    if _fused_experts(module) or isinstance(module, PackedExperts):
        owner, first = checkpoint_owner(name, module)         # a shard names its experts by their ids
        return [f"{owner}.{first + e}.{p}" for e in range(module.num_experts)
                for p in ("gate_proj", "up_proj", "down_proj")]
    return []


# ---- apply ---------------------------------------------------------------

def apply_regime(model: nn.Module, reg: Regime | str) -> nn.Module:
    """Transform the model's weights in place; notes go to
    `model.diag_regime_notes` (what changed, what was a no-op)."""
    reg = regime(reg)
    if reg.kind == "as-loaded":
        notes = ["as-loaded: weights unchanged"]
    elif reg.kind == "cast":
        notes = _cast(model, reg.dtype)
    else:
        notes = _quantize(model, reg)
    model.diag_regime_notes = tuple(notes)
    return model


def _cast(model: nn.Module, dtype: torch.dtype) -> list[str]:
    keep = tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    keep = keep if dtype in (torch.float16, torch.bfloat16) else ()
    changed = 0
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point() or _in_packed(model, name) or any(k in name for k in keep):
                continue
            t.data = t.data.to(dtype)
            changed += 1
    return [f"cast {changed} floating tensors to {dtype}; packed INT4 buffers and "
            f"fp32-kept tensors {list(keep)} unchanged"]


def _in_packed(model: nn.Module, tensor_name: str) -> bool:
    parent = tensor_name.rpartition(".")[0]
    return isinstance(model.get_submodule(parent) if parent else model, (PackedExperts, PackedLinear))


def _quantize(model: nn.Module, reg: Regime) -> list[str]:
    names = set(targeted_linears(model, reg))
    if not names:
        raise DiagError(f"regime {reg.name} matches no Linear weight of this model", field="regimes",
                        expected=f"targets {list(reg.targets)} outside ignore {list(reg.ignore)}",
                        found="nothing to quantize", hint="try the all-linear scope")
    notes, done = [], 0
    with torch.no_grad():
        for name, module in list(model.named_modules()):
            done += _quantize_module(name, module, reg, names, notes)
    notes.insert(0, f"{reg.name}: fake-quantized {done} Linear weights")
    return notes


def _quantize_module(name: str, module: nn.Module, reg: Regime, names: set[str], notes: list) -> int:
    if isinstance(module, (PackedExperts, PackedLinear)):
        return _packed(name, module, reg, names, notes)
    if isinstance(module, nn.Linear) and name in names:
        module.weight.data = _fake(reg, module.weight.data)
        return 1
    if _fused_experts(module):
        return _experts(name, module, reg, names)
    return 0


def _experts(name: str, module: nn.Module, reg: Regime, names: set[str]) -> int:
    """Fake-quantize the per-expert slices of fused 3-D parameters that are targeted."""
    inter, count = module.gate_up_proj.shape[1] // 2, 0
    for e in range(module.gate_up_proj.shape[0]):
        for proj, param, rows in (("gate_proj", module.gate_up_proj, slice(0, inter)),
                                  ("up_proj", module.gate_up_proj, slice(inter, 2 * inter)),
                                  ("down_proj", module.down_proj, slice(None))):
            if f"{name}.{e}.{proj}" in names:
                param.data[e, rows] = _fake(reg, param.data[e, rows])
                count += 1
    return count


def _packed(name: str, module: nn.Module, reg: Regime, names: set[str], notes: list) -> int:
    mine = [n for n in _linear_names(name, module) if n in names]
    if not mine:
        return 0
    if reg.kind == "fp8":
        raise DiagError("fp8 regime on weights held as packed INT4", field=name,
                        expected="a bf16 checkpoint (or a scope that ignores these weights)",
                        found=f"INT4 packed, group {module.group_size}")
    if len(mine) != len(_linear_names(name, module)):
        raise DiagError("regime targets only some experts of a packed module", field=name,
                        expected="all or none of its experts", found=f"{len(mine)} targeted")
    if reg.group_size == module.group_size:
        notes.append(f"{name}: already INT4 with group {module.group_size}; {reg.name} is a no-op")
        return 0
    _requantize(module, reg.group_size)
    notes.append(f"{name}: INT4 group {module.group_size} re-quantized with group {reg.group_size}")
    module.group_size = reg.group_size
    return len(mine)


def _requantize(module: nn.Module, group_size: int) -> None:
    """Dequantize each packed weight and quantize it again with another group."""
    prefixes = ("weight",) if isinstance(module, PackedLinear) else ("gate_up_proj", "down_proj")
    for p in prefixes:
        packed, scale = getattr(module, f"{p}_packed"), getattr(module, f"{p}_scale")
        shape = (*packed.shape[:-1], packed.shape[-1] * 8)
        dense = dequantize(packed, scale, shape, module.group_size, scale.dtype)
        q, new_scale = quantize_rtn(dense, group_size)
        setattr(module, f"{p}_scale", new_scale)
        packed.copy_(pack_int4(q))
