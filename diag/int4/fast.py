"""A fast path for PackedExperts on CUDA: both expert GEMMs as one grouped Triton kernel
each, with the INT4 dequantization fused into the tile loop (diag.int4.fast_kernel), so a
layer's experts are read once, packed (8.5 GB for Kimi instead of 34 GB bf16), and no
per-expert Python loop or bf16 weight copy exists.

  pairs   p = t * K + k for token t, slot k (S = T * K)          top_k_index [T, K]
  route   pairs sorted by expert, each expert's run padded to BLOCK_M rows
  gemm 1  x[t] @ gate_up[e].T -> [S, 2I]      (A row = p // K)
  act     silu(gate) * up     -> [S, I]
  gemm 2  h[p] @ down[e].T * w[p] -> [S, H]   (routing weight applied in fp32)
  sum     out[t] = sum_k y[t * K + k]  (fp32 accumulation, as transformers' grouped_mm path)

Worked routing example, BLOCK_M 2, experts [1, 0, 1] (T 3, K 1): counts [1, 2] -> blocks
[1, 1]; sorted_ids = [1, S | 0, 2] (S = 3 pads expert 0's run); block_expert = [0, 1].

Numerics: weights dequantize exactly as diag.int4.format (bf16 q * bf16 scale); the products
accumulate in fp32 per tile, so outputs match the eager loop to bf16 rounding, not bit for
bit. `accelerate(model)` switches every PackedExperts of a model to this path; on CPU, or
without Triton, the module keeps the eager loop. This module knows tensors and modules; it
reads no files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from diag.int4.packed import PackedExperts

# Tile shape and launch; diag.bench times alternatives on the GPU at hand and may set these.
TILES = {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 3}


@dataclass(frozen=True)
class Routing:
    sorted_ids: torch.Tensor     # [num_blocks * BLOCK_M] int32 pair indices, S = padding
    block_expert: torch.Tensor   # [num_blocks] int32 expert of each block, -1 unused
    num_pairs: int


def route(top_k_index: torch.Tensor, num_experts: int, block_m: int) -> Routing:
    """[T, K] expert ids -> padded, expert-grouped pair order, without a host sync
    (the number of blocks is bounded by S / block_m + E)."""
    flat = top_k_index.reshape(-1).to(torch.int64)                         # [S]
    S = flat.numel()
    order = torch.argsort(flat, stable=True)                               # [S]
    counts = torch.bincount(flat, minlength=num_experts)[:num_experts]     # [E]
    blocks = (counts + block_m - 1) // block_m                             # [E]
    padded_start = torch.cumsum(blocks * block_m, 0) - blocks * block_m    # [E]
    first = torch.cumsum(counts, 0) - counts                               # [E] start in `order`
    e_sorted = flat[order]
    rank = torch.arange(S, device=flat.device) - first[e_sorted]
    max_blocks = S // block_m + num_experts
    sorted_ids = torch.full((max_blocks * block_m,), S, dtype=torch.int32, device=flat.device)
    sorted_ids[padded_start[e_sorted] + rank] = order.to(torch.int32)
    ends = torch.cumsum(blocks, 0)                                         # [E]
    b = torch.arange(max_blocks, device=flat.device)
    expert = torch.searchsorted(ends, b, right=True)                       # [max_blocks]
    block_expert = torch.where(expert < num_experts, expert, -1).to(torch.int32)
    return Routing(sorted_ids, block_expert, S)


def _block_k(width: int, group: int) -> int:
    """The configured K tile if it is a multiple of the group and divides the width, else
    the first of 128/64/32 that is."""
    for bk in (TILES["block_k"], 128, 64, 32):
        if bk % group == 0 and width % bk == 0:
            return bk
    raise ValueError(f"no K tile for width {width}, group {group}")


def grouped_int4_gemm(a: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, r: Routing,
                      group: int, *, a_div: int, route_w: torch.Tensor | None = None) -> torch.Tensor:
    """a [rows, K] bf16, packed [E, N, K/8] int32, scale [E, N, K/group] -> out [S, N] bf16;
    row p of out uses A row p // a_div and expert block_expert[block of p]."""
    from diag.int4.fast_kernel import moe_int4_gemm
    import triton

    N, K = packed.shape[1], packed.shape[2] * 8
    out = torch.empty(r.num_pairs, N, dtype=torch.bfloat16, device=a.device)
    bk = _block_k(K, group)
    grid = (r.block_expert.numel(), triton.cdiv(N, TILES["block_n"]))
    moe_int4_gemm[grid](a, packed, scale, out, r.sorted_ids, r.block_expert,
                        route_w if route_w is not None else out,
                        N, K, r.num_pairs, a_div,
                        a.stride(0), packed.stride(0), packed.stride(1), scale.stride(0), scale.stride(1),
                        out.stride(0), GROUP=group, BLOCK_M=TILES["block_m"], BLOCK_N=TILES["block_n"],
                        BLOCK_K=bk, MUL_ROUTE=route_w is not None, UPCAST=_interpreting(),
                        num_warps=TILES["num_warps"], num_stages=TILES["num_stages"])
    return out


def fused_experts(module: PackedExperts, hidden: torch.Tensor, top_k_index: torch.Tensor,
                  top_k_weights: torch.Tensor) -> torch.Tensor:
    """hidden [T, H], top_k_index / top_k_weights [T, K] -> [T, H] in hidden's dtype."""
    T, K = top_k_index.shape
    x = hidden.to(torch.bfloat16).contiguous()
    r = route(top_k_index, module.num_experts, TILES["block_m"])
    gu = grouped_int4_gemm(x, module.gate_up_proj_packed, module.gate_up_proj_scale, r,
                           module.group_size, a_div=K)                      # [S, 2I]
    gate, up = gu.chunk(2, dim=-1)
    h = (module.act_fn(gate) * up).contiguous()                            # [S, I]
    w = top_k_weights.reshape(-1).to(torch.float32).contiguous()           # [S]
    y = grouped_int4_gemm(h, module.down_proj_packed, module.down_proj_scale, r,
                          module.group_size, a_div=1, route_w=w)            # [S, H]
    return y.view(T, K, -1).sum(dim=1, dtype=torch.float32).to(hidden.dtype)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class FastPackedExperts(PackedExperts):
    """PackedExperts whose forward uses the fused kernel on CUDA (bf16 scales), and the
    eager loop elsewhere. Same buffers, same state dict: only the class differs."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        usable = hidden_states.is_cuda or _interpreting()
        if usable and self.gate_up_proj_scale.dtype == torch.bfloat16 and triton_available():
            return fused_experts(self, hidden_states, top_k_index, top_k_weights)
        return super().forward(hidden_states, top_k_index, top_k_weights)


def accelerate(model: nn.Module) -> int:
    """Switch every PackedExperts in `model` to FastPackedExperts in place; returns how
    many. The swap changes the class only: buffers and outputs' meaning stay."""
    n = 0
    for module in model.modules():
        if type(module) is PackedExperts:
            module.__class__ = FastPackedExperts
            n += 1
    return n

