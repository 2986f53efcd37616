"""Modules that keep INT4 weights packed in memory and dequantize at compute
time, so a model's resident bytes stay close to its checkpoint bytes.

PackedExperts is a drop-in for transformers' fused routed experts
(DeepseekV3Experts: forward(hidden_states [T, H], top_k_index [T, K],
top_k_weights [T, K]) -> [T, H]). It mirrors that module's eager loop
(same expert order, same token order, same dtype promotions) so outputs
match a dense model built from the dequantized weights bit for bit; only
experts that receive tokens are dequantized, one at a time, in the
activation dtype. Buffers keep the fused layout of gate_up_proj:
  gate_up_proj_packed  int32 [E, 2I, H/8]   rows [0, I) gate, [I, 2I) up
  gate_up_proj_scale   bf16  [E, 2I, H/group]
  down_proj_packed     int32 [E, H, I/8]
  down_proj_scale      bf16  [E, H, I/group]
PackedLinear does the same for one targeted nn.Linear.

A decode loop on the CPU runs a forward a round over a few tokens a row, and dequantized every
hit expert again in each (the CPU bench's chain-1: 16 forwards, 1,536 dequantizations, 0.24 s of
a 1.7 s loop). `dense_held(model)` keeps each module's dequantized weights from their first use
to the end of a block, where all of them fit in HELD_BYTES: the same tensors the call would
compute, so the same outputs bit for bit; resident bytes outside the block unchanged.

This module knows modules and tensors; it reads no files.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch import nn
from torch.nn import functional as F

from diag.int4.format import check_group, dequantize, pack_int4, packed_width, quantize_rtn


HELD_BYTES = 1 << 30          # dense copies `dense_held` keeps for a block, at most (over the whole model)
_HOLDERS_LOCK = threading.Lock()


class PackedExperts(nn.Module):
    """Routed experts held as INT4 packed buffers."""

    _held: dict | None = None     # (proj, expert, dtype) -> dense weight, inside `dense_held`
    _holders = 0                  # the `dense_held` blocks open on this module

    def __init__(self, num_experts: int, hidden: int, intermediate: int, group_size: int,
                 act_fn, *, scale_dtype=torch.bfloat16, device=None):
        super().__init__()
        check_group(hidden, group_size, field="experts.gate_up_proj")
        check_group(intermediate, group_size, field="experts.down_proj")
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden, intermediate
        self.group_size, self.act_fn = group_size, act_fn
        e, h, i, g = num_experts, hidden, intermediate, group_size

        def buf(*shape, dtype):   # uninitialised: the loader (every key checked first) or
            # from_dense writes every element; zero-filling 9.5 GB per Kimi layer would touch
            # each page twice
            return torch.empty(*shape, dtype=dtype, device=device)

        self.register_buffer("gate_up_proj_packed", buf(e, 2 * i, packed_width(h), dtype=torch.int32))
        self.register_buffer("gate_up_proj_scale", buf(e, 2 * i, h // g, dtype=scale_dtype))
        self.register_buffer("down_proj_packed", buf(e, h, packed_width(i), dtype=torch.int32))
        self.register_buffer("down_proj_scale", buf(e, h, i // g, dtype=scale_dtype))

    @classmethod
    def like(cls, experts: nn.Module, group_size: int, *, device=None) -> "PackedExperts":
        """An empty PackedExperts shaped like a transformers fused-experts module."""
        num, two_i, hidden = experts.gate_up_proj.shape
        return cls(num, hidden, two_i // 2, group_size, experts.act_fn, device=device)

    @classmethod
    def from_dense(cls, experts: nn.Module, group_size: int) -> "PackedExperts":
        """Quantize a dense fused-experts module (compressed-tensors RTN numerics,
        weights cast to bf16 first as in checkpoints)."""
        packed = cls.like(experts, group_size, device=experts.gate_up_proj.device)
        for proj in ("gate_up_proj", "down_proj"):
            q, scale = quantize_rtn(getattr(experts, proj).detach().to(torch.bfloat16), group_size)
            getattr(packed, f"{proj}_packed").copy_(pack_int4(q))
            getattr(packed, f"{proj}_scale").copy_(scale)
        return packed

    def expert_weight(self, proj: str, e: int, dtype: torch.dtype) -> torch.Tensor:
        """Dense weight of one expert's projection: gate_up_proj -> [2I, H],
        down_proj -> [H, I], in `dtype`."""
        def make() -> torch.Tensor:
            packed, scale = getattr(self, f"{proj}_packed")[e], getattr(self, f"{proj}_scale")[e]
            return dequantize(packed, scale, (packed.shape[0], packed.shape[1] * 8), self.group_size, dtype)
        return _kept(self, (proj, e, dtype), make)

    def dense_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of every expert's dense weights in `dtype`."""
        e, h, i = self.num_experts, self.hidden_dim, self.intermediate_dim
        return e * 3 * i * h * torch.finfo(dtype).bits // 8

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return self.add_into(torch.zeros_like(hidden_states), hidden_states, top_k_index, top_k_weights)

    def add_into(self, final: torch.Tensor, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> torch.Tensor:
        """The eager loop adding each hit expert's weighted outputs into `final` [T, H] (in place,
        returned), expert by expert in ascending order; index num_experts is skipped (the
        sentinel of a pair whose expert is elsewhere: diag.int4.sharded)."""
        with torch.no_grad():
            mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1)  # [T, K, E+1]
            mask = mask.permute(2, 1, 0)  # [E+1, K, T]
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit[:, 0].tolist():
            if e == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(mask[e])
            x = hidden_states[token_idx]  # [n, H]
            w_gate_up = self.expert_weight("gate_up_proj", e, hidden_states.dtype)  # [2I, H]
            gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)
            y = F.linear(self.act_fn(gate) * up, self.expert_weight("down_proj", e, hidden_states.dtype))
            y = y * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, y.to(final.dtype))
        return final


class PackedLinear(nn.Module):
    """An nn.Linear whose weight stays INT4 packed; dequantized per call."""

    _held: dict | None = None     # dtype -> dense weight, inside `dense_held`
    _holders = 0

    def __init__(self, in_features: int, out_features: int, group_size: int, *, bias: bool = False,
                 scale_dtype=torch.bfloat16, device=None, dtype=None):
        super().__init__()
        check_group(in_features, group_size, field="weight")
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("weight_packed", torch.zeros(
            out_features, packed_width(in_features), dtype=torch.int32, device=device))  # [out, in/8]
        self.register_buffer("weight_scale", torch.zeros(
            out_features, in_features // group_size, dtype=scale_dtype, device=device))  # [out, in/g]
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype),
                                 requires_grad=False) if bias else None

    @classmethod
    def like(cls, linear: nn.Linear, group_size: int, *, device=None, dtype=None) -> "PackedLinear":
        return cls(linear.in_features, linear.out_features, group_size,
                   bias=linear.bias is not None, device=device, dtype=dtype)

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        shape = (self.out_features, self.in_features)
        return _kept(self, dtype, lambda: dequantize(self.weight_packed, self.weight_scale, shape, self.group_size,
                                                     dtype))

    def dense_bytes(self, dtype: torch.dtype) -> int:
        return self.out_features * self.in_features * torch.finfo(dtype).bits // 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dense_weight(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, int4 packed")


def _kept(module: nn.Module, key, make):
    """make(), or the weight `dense_held` keeps under `key` on `module` (kept there when made inside
    a block)."""
    held = module._held
    if held is not None and key in held:
        return held[key]
    w = make()
    if held is not None:
        held[key] = w
    return w


@contextlib.contextmanager
def dense_held(model: nn.Module, dtype: torch.dtype | None = None, *, budget: int | None = None):
    """Inside the block, each PackedExperts / PackedLinear of `model` on the CPU keeps the dense
    weights it dequantizes (module docstring), where all of them in `dtype` (None: the model's
    first floating parameter's) fit in `budget` bytes (None: HELD_BYTES); else nothing changes.
    Yields the bytes that may be held (0: none). Example: the CPU bench's 4-layer target, 3 MoE
    layers of 16 experts at 256 x 64 -> 3 x 16 x 3 x 64 x 256 x 4 B = 2.4 MB, held; Kimi's 60 MoE
    layers in float32 (about 4 TB) are not."""
    mods = [m for m in model.modules() if isinstance(m, (PackedExperts, PackedLinear))
            and next(iter(m.buffers())).device.type == "cpu"]
    dtype = dtype or next((t.dtype for t in model.parameters() if t.is_floating_point()), torch.float32)
    need = sum(m.dense_bytes(dtype) for m in mods)
    if not mods or need > (HELD_BYTES if budget is None else budget):
        yield 0
        return
    with _HOLDERS_LOCK:                  # blocks nest and overlap (a staged generation's microbatch
        for m in mods:                   # threads each hold the same model): the first opens, the last drops
            if not m._holders:
                m._held = {}
            m._holders += 1
    try:
        yield need
    finally:
        with _HOLDERS_LOCK:
            for m in mods:
                m._holders -= 1
                if not m._holders:
                    del m._held, m._holders


def resident_bytes(module: nn.Module) -> int:
    """Bytes held by a module's parameters and buffers (shared tensors once)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() in seen or t.device.type == "meta":
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
