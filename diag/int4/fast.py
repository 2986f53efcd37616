"""A fast path for PackedExperts on CUDA: both expert GEMMs as one grouped Triton kernel
each, with the INT4 dequantization fused into the tile loop (diag.int4.fast_kernel), so a
layer's experts are read once, packed (8.5 GB for Kimi instead of 34 GB bf16), and no
per-expert Python loop or bf16 weight copy exists.

  pairs   p = t * K + k for token t, slot k (S = T * K)          top_k_index [T, K]
  route   pairs sorted by expert, each expert's run padded to BLOCK_M rows (per GEMM)
  gemm 1  x[t] @ gate_up[e].T -> [S, 2I]      (A row = p // K)
  act     silu(gate) * up     -> [S, I]       (in gemm 1's epilogue when act_fn is SiLU)
  gemm 2  h[p] @ down[e].T * w[p] -> [S, H]   (routing weight applied in fp32)
  sum     out[t] = sum_k y[t * K + k]  (fp32 accumulation, as transformers' grouped_mm path)

Routing (diag.int4.routing, with its worked example) is replayed from a CUDA graph per shape:
some 40 small kernels whose launches cost 1.3 ms of host time per layer.

The kernels (diag.int4.fast_kernel; on Hopper diag.int4.wgmma_kernel, the grouped one with its
pipeline written out in Gluon: copies a K step ahead, each piece decoded while the previous
one multiplies, the same bits): the grouped one wherever the widths allow it
(kernel_layout.fits: Kimi's 7168 and 2048 with group 32 do), reading the packed words re-laid
once, at the first forward, so that unpacking one group is a shift and a mask, in row blocks
of one dot or (a GEMM's "split") of several sub-blocks sharing each decoded weight tile; the
first one, on the checkpoint's layout, for any other width; and glu_rows, the activation in
one pass where gate_up's epilogue does not apply it.

Numerics: weights dequantize exactly as diag.int4.format (bf16 q * bf16 scale); the products
accumulate in fp32 per tile, so outputs match the eager loop to bf16 rounding, not bit for
bit. `accelerate(model)` switches every PackedExperts of a model to this path; on CPU, or
without Triton, the module keeps the eager loop. This module knows tensors and modules; it
reads no files.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn
from torch.nn import functional as F

from diag.int4.blocks import BLOCK_COSTS, cheapest_block
from diag.int4.format import dequantize
from diag.int4.kernel_layout import fits, relayout_, scales_group_major, to_checkpoint
from diag.int4.packed import PackedExperts
from diag.int4.routing import Routing, replayed_routes, route, routes  # noqa: F401  (route, routes: fast's API)

# Tile shape and launch of the first kernel (any width); diag.bench may set these.
TILES = {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 3}
# The grouped kernel (kernel-layout weights, kernel_layout.fits): "gate_up" / "down" tiles
# per GEMM, each with its own block_m, the token side (the dot's N, 16..256; each GEMM is
# routed for its own), "split" (default 1: the row block is split sub-blocks of block_m rows
# decoding each weight tile once for all of them), and block_n, the weight rows ("wgmma": the
# explicit Hopper pipeline of wgmma_kernel, "drain" its variant that empties the MMA queue at
# every K step; "wide": one dot of depth 8 * piece per
# K step instead of 8 of depth piece, fast_kernel; gate_up's "glu": silu(gate) * up in its
# epilogue, where the module's activation is SiLU; "small_stages": the pipeline's stages for the
# smaller power-of-two row blocks grouped_block_m gives a few tokens, one dot each, whose
# shared memory leaves room for a stage more: H100, a decode step's 8 tokens, both GEMMs 0.823
# -> 0.770 ms at 3 stages, reports/bench/NOTES.md, twenty-sixth stop; up to SMALL_BLOCK_ROWS; "by_rows":
# {rows: {block_n, num_warps}}, what a row block of that size below the full one runs with instead,
# tile_of). The piece width (the weights' layout)
# and the dequant variant are shared. The defaults are what diag bench measured fastest on
# an H200 (reports/bench/NOTES.md); a bench run may set others for its own process.
GROUPED = {"dequant": 3, "piece": 32,
           "gate_up": {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "split": 3, "glu": False,
                       "wgmma": True, "drain": True, "small_stages": 3},
           "down": {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2, "split": 3,
                    "wgmma": True, "drain": True, "small_stages": 3}}
# 64- and 128-row blocks: weight slabs of 256 rows at 16 warps, faster than the GEMMs' own tile on
# both devices measured (H100, both GEMMs at half a block an expert: 6.76 -> 6.16 ms at 64 rows,
# 12.79 -> 10.38 at 128; H200 at 3072 tokens: 9.20 -> 9.16 and 12.78 -> 10.37; the same bits);
# 16 and 32 rows keep their own (256 lost there on both). reports/bench/NOTES.md, twenty-eighth stop.
# "only": "wgmma": measured on wgmma_kernel alone; the Triton kernel (other GPUs: their shared memory
# may not hold 128 rows x 256) keeps the GEMM's own tile unless a bench tuned it there (no "only").
BY_ROWS = {64: {"block_n": 256, "num_warps": 16, "only": "wgmma"},
           128: {"block_n": 256, "num_warps": 16, "only": "wgmma"}}
for _gemm in ("gate_up", "down"):
    GROUPED[_gemm]["by_rows"] = {r: dict(v) for r, v in BY_ROWS.items()}


SMALL_BLOCK_ROWS = 32     # row blocks up to this many rows take GROUPED's small_stages (`stages_of`): at 64
                          # rows 3 stages cost a third more than 2 (H200, 3072 tokens: 13.6 against 9.2 ms;
                          # reports/bench/NOTES.md, twenty-seventh stop)


def _block_k(width: int, group: int) -> int:
    """The configured K tile if it is a multiple of the group and divides the width, else
    the first of 128/64/32 that is."""
    for bk in (TILES["block_k"], 128, 64, 32):
        if bk % group == 0 and width % bk == 0:
            return bk
    raise ValueError(f"no K tile for width {width}, group {group}")


def grouped_int4_gemm_any(a: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, r: Routing,
                          group: int, *, a_div: int, route_w: torch.Tensor | None = None) -> torch.Tensor:
    """The first kernel, for any width: a [rows, K] bf16, packed [E, N, K/8] int32 in the
    checkpoint's layout, scale [E, N, K/group] -> out [S, N] bf16; row p of out uses A row
    p // a_div and expert block_expert[block of p]."""
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


def grouped_int4_gemm(a: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, r: Routing,
                      group: int, which: str, *, a_div: int, piece: int,
                      route_w: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """The grouped kernel: packed [E, N, K/8] int32 in kernel layout of piece width `piece`,
    scale [E, N, K/group] (any strides), a [rows, K] bf16 -> out [S, N] bf16, in the
    routing's block_m (GROUPED[which]'s block_m is what fused_experts routes for).
    glu: packed is gate_up [E, 2I, K/8] and out is silu(gate) * up [S, I], in the epilogue.
    A tile with "wgmma" runs wgmma_kernel's explicit Hopper pipeline where wgmma_runs says
    it can (the same bits), else the Triton kernel of the same tile."""
    from diag.int4.fast_kernel import moe_int4_gemm_grouped, moe_int4_gemm_split
    import triton

    N, K = packed.shape[1], packed.shape[2] * 8
    t = tile_of(which, r.block_m)
    split = split_of(which, r.block_m)
    stages = t["num_stages"]
    out = torch.empty(r.num_pairs, N // 2 if glu else N, dtype=torch.bfloat16, device=a.device)
    args = (a, packed, scale, out, r.sorted_ids, r.block_expert, route_w if route_w is not None else out,
            N, K, r.num_pairs, a_div, a.stride(0), packed.stride(0), packed.stride(1), scale.stride(0),
            scale.stride(1), scale.stride(2), out.stride(0))
    if t.get("wgmma", False) and not glu and wgmma_runs(a.device, scale, split, t):
        from diag.int4.wgmma_kernel import moe_int4_gemm_wgmma
        grid = (triton.cdiv(N, t["block_n"]), r.block_expert.numel())
        moe_int4_gemm_wgmma[grid](*args, GROUP=group, PIECE=piece, BLOCK_N=t["block_n"],
                                  BLOCK_M=r.block_m // split, MUL_ROUTE=route_w is not None, SPLIT=split,
                                  STAGES=stages, DRAIN=bool(t.get("drain", True)),
                                  num_warps=t["num_warps"])
        return out
    t = tile_of(which, r.block_m, wgmma=False)             # the Triton kernel: no wgmma-only row tiles
    kernel, extra = (moe_int4_gemm_split, {"SPLIT": split}) if split > 1 else \
        (moe_int4_gemm_grouped, {"WIDE": bool(t.get("wide", False))})
    grid = (triton.cdiv(N // 2 if glu else N, t["block_n"] // 2 if glu else t["block_n"]), r.block_expert.numel())
    kernel[grid](*args, GROUP=group, PIECE=piece, BLOCK_N=t["block_n"], BLOCK_M=r.block_m // split,
                 DEQUANT=dequant_variant(a.device), MUL_ROUTE=route_w is not None,
                 UPCAST=_interpreting(), GLU=glu, **extra,
                 num_warps=t["num_warps"], num_stages=stages)
    return out


def tile_of(which: str, rows: int, wgmma: bool = True) -> dict:
    """The tile GROUPED[which] runs a row block of `rows` with: its own entry, num_stages as
    stages_of gives it, and for a block below the full one what its "by_rows" holds for that
    size (block_n and num_warps; bench/tiles.block_costs times each variant per size and keeps
    the fastest), an entry marked "only": "wgmma" only where `wgmma` (wgmma_kernel runs it, not
    the Triton kernel). Worked example: gate_up block_n 128 / 8 warps, by_rows {64: {"block_n": 256}}
    -> 64 rows: block_n 256, 8 warps, 2 stages; 16 rows: block_n 128, 3 stages; the full block
    (192) never takes by_rows. An H200 at 3072 tokens: 64-row blocks 9.20 -> 8.79 ms with
    block_n 256, 128-row blocks 12.78 -> 10.37 ms with block_n 256 at 16 warps (NOTES.md)."""
    t = GROUPED[which]
    tile = {**t, "num_stages": stages_of(which, rows)}
    own = (t.get("by_rows") or {}).get(rows, {})
    if rows < block_rows(which) and (wgmma or own.get("only") != "wgmma"):
        tile.update((k, v) for k, v in own.items() if k in BY_ROWS_KEYS)
    return tile


BY_ROWS_KEYS = ("block_n", "num_warps")      # what a row size may set apart from its GEMM's tile


def stages_of(which: str, rows: int) -> int:
    """GROUPED[which]'s pipeline stages for a row block of `rows`: its small_stages (num_stages
    where unset) for the power-of-two blocks of at most SMALL_BLOCK_ROWS rows that a few tokens
    get (grouped_block_m), whose shared memory leaves room for a stage more; its num_stages for
    any other. Defaults: 16 and 32 rows (a decode step's 8 tokens: 16) -> 3; 64 -> 2 (at 3
    stages its CTAs are too large to share an SM: a third slower); 64 x 3 -> 2; 128 -> 2 (3
    stages of 128 rows at piece 32 would need ~245 KB of shared memory, over the 227 KB a block gets)."""
    t = GROUPED[which]
    small = rows <= SMALL_BLOCK_ROWS and rows != block_rows(which)
    return t.get("small_stages", t["num_stages"]) if small else t["num_stages"]


def wgmma_runs(dev: torch.device, scale: torch.Tensor | None = None, split: int = 1,
               tile: dict | None = None) -> bool:
    """Whether wgmma_kernel can run: a Hopper GPU with a Triton that has Gluon's Hopper ops
    (_wgmma_device), not under Triton's interpreter, scales group major (stride 1 along N),
    1..3 sub-blocks and a tile whose warpgroups each own whole 64-row slabs of weight rows
    (num_warps a multiple of 4, block_n of 16 x num_warps: 128 at 8 warps). Elsewhere the
    Triton kernel of the same tile runs: the same bits."""
    if _interpreting() or not _wgmma_device(dev):
        return False
    if (scale is not None and scale.stride(1) != 1) or not 1 <= split <= 3:
        return False
    return tile is None or not (tile["num_warps"] % 4 or tile["block_n"] % (16 * tile["num_warps"]))


@functools.lru_cache(maxsize=None)
def _wgmma_device(dev: torch.device) -> bool:
    """sm_90 (wgmma is Hopper's alone) and wgmma_kernel importable (Triton >= 3.5): asked once
    per device, not at every GEMM of every layer."""
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev)[0] != 9:
        return False
    try:
        import diag.int4.wgmma_kernel  # noqa: F401
    except ImportError:
        return False
    return True


def block_rows(which: str) -> int:
    """The rows of one of GROUPED[which]'s full row blocks: block_m times its split."""
    t = GROUPED[which]
    return t["block_m"] * t.get("split", 1)


def grouped_block_m(pairs: int, experts: int, which: str) -> int:
    """One GEMM's row block (what it is routed for): block_rows(which) where the smallest power
    of two >= the mean pairs per expert (16 at least) reaches it; below it, the power of two
    of GROUPED["block_costs"] whose row blocks cost least in all (blocks.cheapest_block): a block costs more
    the more rows it has (each of its N tiles reads its rows' activations again), and an
    expert whose pairs overflow its block takes a second one. Kimi, 384 experts, block_m 64
    split 3 (192 rows), BLOCK_COSTS: 1 token (8 pairs) -> 16; 96 tokens (2 per expert) -> 16;
    768 (16 per expert) -> 32, not 16 (43% of the experts would take two blocks of 16); 1536
    (32) -> 64, not 32 (45% would take two of 32); 3072 (64) -> 64, not 128; 8192 (171) -> 192."""
    full = block_rows(which)
    mean = -(-pairs // experts)
    first = min(full, max(16, 1 << (mean - 1).bit_length()))
    if first == full:
        return full
    sizes = tuple(sorted((int(r), float(c)) for r, c in (GROUPED.get("block_costs") or {}).items() if int(r) < full))
    return cheapest_block(pairs, experts, sizes) if sizes else first


GROUPED["block_costs"] = dict(BLOCK_COSTS)     # blocks.py's defaults; the bench's experts section measures its own


def split_of(which: str, rows: int) -> int:
    """Sub-blocks per row block of `rows`: GROUPED[which]'s split for its full blocks, 1 for
    the smaller power-of-two blocks grouped_block_m gives few tokens (one dot of `rows`)."""
    t = GROUPED[which]
    split = t.get("split", 1)
    if split > 1 and rows == block_rows(which):
        if t.get("wide", False):
            raise ValueError(f"GROUPED[{which!r}]: a wide tile takes split 1, got split {split}")
        return split
    if rows & (rows - 1):
        raise ValueError(f"GROUPED[{which!r}]: a row block of {rows} is neither {block_rows(which)} "
                         f"(block_m x split) nor a power of two")
    return 1


def grouped_fits(module: PackedExperts, piece: int | None = None) -> bool:
    g, p = module.group_size, piece or GROUPED["piece"]
    return fits(module.hidden_dim, g, p) and fits(module.intermediate_dim, g, p)


def to_kernel_layout(module: PackedExperts, piece: int | None = None) -> None:
    """Re-lay a module's packed words (kernel_layout.to_kernel, piece width GROUPED's unless
    given) and store its scales group major; `module.kernel_layout` holds the piece width
    (0: checkpoint layout), expert_weight decodes it. A module in another piece width is
    re-laid again."""
    piece = piece or GROUPED["piece"]
    have = getattr(module, "kernel_layout", 0)
    if have == piece:
        return
    if type(module) is PackedExperts:
        module.__class__ = FastPackedExperts          # whose expert_weight decodes the layout
    for proj in ("gate_up_proj", "down_proj"):
        buf = getattr(module, f"{proj}_packed")
        if have:
            relayout_(buf, have, forward=False)
        relayout_(buf, piece)
        name = f"{proj}_scale"
        if not have:
            module._buffers[name] = scales_group_major(getattr(module, name))
    module.kernel_layout = piece


def fused_experts(module: PackedExperts, hidden: torch.Tensor, top_k_index: torch.Tensor,
                  top_k_weights: torch.Tensor, *, partial: bool = False, rows: int | None = None,
                  pairs: int | None = None) -> torch.Tensor:
    """hidden [T, H], top_k_index / top_k_weights [T, K] -> [T, H] in hidden's dtype.
    partial: some pairs may name the sentinel expert num_experts (held by another shard,
    diag.int4.sharded): their rows, which no block writes, count as zero, and the sum over the
    K slots comes back in fp32, for the shards' sum to round once. pairs: the pairs this
    module's experts are expected to hold, which grouped_block_m sizes the row blocks for
    (default T x K; a shard's share of them under partial: ShardedExperts passes it, for the
    host cannot count them without waiting for the device). rows: both grouped GEMMs routed
    for row blocks of `rows` instead (bench/tiles.block_costs times each size so). Neither
    changes a sum, so neither changes a bit."""
    T, K = top_k_index.shape
    x = hidden.to(torch.bfloat16).contiguous()
    grouped = grouped_fits(module)
    if grouped:
        to_kernel_layout(module)
    block_m = {w: (rows or grouped_block_m(pairs or T * K, module.num_experts, w)) if grouped else TILES["block_m"]
               for w in ("gate_up", "down")}
    routings = replayed_routes(top_k_index, module.num_experts, block_m.values())   # consumed below
    g = module.group_size

    def gemm(a, proj, which, a_div, route_w=None, glu=False):
        packed, scale = getattr(module, f"{proj}_packed"), getattr(module, f"{proj}_scale")
        r = routings[block_m[which]]
        if grouped:
            return grouped_int4_gemm(a, packed, scale, r, g, which, a_div=a_div, route_w=route_w,
                                     piece=module.kernel_layout, glu=glu)
        return grouped_int4_gemm_any(a, packed, scale, r, g, a_div=a_div, route_w=route_w)

    if grouped and GROUPED["gate_up"].get("glu", False) and fuses_activation(module):
        h = gemm(x, "gate_up_proj", "gate_up", K, glu=True)                # [S, I]
    else:
        h = activate(module, gemm(x, "gate_up_proj", "gate_up", K))        # [S, 2I] -> [S, I]
    w = top_k_weights.reshape(-1).to(torch.float32).contiguous()           # [S]
    y = gemm(h, "down_proj", "down", 1, w).view(T, K, -1)                  # [T, K, H]
    if partial:
        y = torch.where((top_k_index < module.num_experts)[..., None], y, 0)
        return y.sum(dim=1, dtype=torch.float32)
    return y.sum(dim=1, dtype=torch.float32).to(hidden.dtype)


def activate(module: PackedExperts, gu: torch.Tensor) -> torch.Tensor:
    """The unfused activation: gate_up's product [S, 2I] -> act(gate) * up [S, I]; for SiLU
    on a bf16 product where the Triton kernels run, in one pass (fast_kernel.glu_rows, the
    same bits as torch's silu and mul but for the exp's last bit); else torch's."""
    if gu.dtype == torch.bfloat16 and fuses_activation(module) and (gu.is_cuda or _interpreting()):
        return glu(gu)
    gate, up = gu.chunk(2, dim=-1)
    return (module.act_fn(gate) * up).contiguous()


def glu(gu: torch.Tensor, block_r: int = 16, block_c: int = 256) -> torch.Tensor:
    """silu(gu[:, :I]) * gu[:, I:] -> [S, I] bf16 in one Triton pass over gu [S, 2I] bf16."""
    from diag.int4.fast_kernel import glu_rows
    import triton

    gu = gu.contiguous()
    S, I = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(S, I, dtype=torch.bfloat16, device=gu.device)
    grid = (triton.cdiv(S, block_r), triton.cdiv(I, block_c))
    glu_rows[grid](gu, out, S, I, gu.stride(0), out.stride(0), BLOCK_R=block_r, BLOCK_C=block_c,
                   UPCAST=_interpreting(), num_warps=4)
    return out


def fuses_activation(module: PackedExperts) -> bool:
    """Whether the grouped kernel computes silu(gate) * up itself: the module's act_fn is SiLU
    (transformers' ACT2FN["silu"], nn.SiLU or F.silu; any other keeps the unfused path)."""
    from transformers import activations
    fn = module.act_fn
    return fn is F.silu or isinstance(fn, (nn.SiLU, getattr(activations, "SiLUActivation", nn.SiLU)))


def dequant_variant(dev: torch.device) -> int:
    """GROUPED's DEQUANT, except that variant 3 (inline PTX bf16x2, sm_80+) falls back to 2
    under Triton's interpreter and on older GPUs: the same bits either way."""
    d = GROUPED["dequant"]
    if d == 3 and (_interpreting() or dev.type != "cuda" or torch.cuda.get_device_capability(dev) < (8, 0)):
        return 2
    return d


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
    eager loop elsewhere. Same buffers; once the grouped kernel has run, its packed words
    are in kernel layout (`kernel_layout` its piece width) and expert_weight decodes it, so
    every reader of weights (eager loop, bf16 references) still sees the same numbers."""

    kernel_layout = 0          # piece width of the kernel layout; 0: the checkpoint's

    def expert_weight(self, proj: str, e: int, dtype: torch.dtype) -> torch.Tensor:
        if not self.kernel_layout:
            return super().expert_weight(proj, e, dtype)
        packed = to_checkpoint(getattr(self, f"{proj}_packed")[e], self.kernel_layout)
        shape = (packed.shape[0], packed.shape[1] * 8)
        return dequantize(packed, getattr(self, f"{proj}_scale")[e], shape, self.group_size, dtype)

    def fused_runs(self, hidden_states: torch.Tensor) -> bool:
        """Whether forward runs the fused kernels for these inputs (CUDA or Triton's
        interpreter, bf16 scales, Triton importable)."""
        usable = hidden_states.is_cuda or _interpreting()
        return usable and self.gate_up_proj_scale.dtype == torch.bfloat16 and triton_available()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        if self.fused_runs(hidden_states):
            if not hidden_states.is_cuda:
                return fused_experts(self, hidden_states, top_k_index, top_k_weights)
            # Triton launches on the current device and its stream, not the tensors': on N GPUs
            # a layer placed on cuda:k runs while cuda:0 may be current (accelerate's hooks move
            # tensors, not the current device), so the layer's device is made current here.
            with torch.cuda.device(hidden_states.device):
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

