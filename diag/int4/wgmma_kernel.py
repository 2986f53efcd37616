"""The grouped INT4 GEMM for Hopper written in Gluon (Triton's explicit dialect): the same
product as fast_kernel.moe_int4_gemm_split, with the weights in kernel_layout and the
tokens on the MMA's N side, but with its pipeline spelled out, because the one Triton
derives for that kernel leaves the tensor cores waiting (reports/bench/NOTES.md, wgmma;
scripts/int4_schedule.py prints both schedules without a GPU):

  Triton's schedule (sm_90, Kimi's gate_up at block_m 64, 2 stages), per K step of 8P columns:
    wait for all copies; decode piece 0; wgmma; wait 0; decode piece 1; wgmma; wait 0; ...;
    then issue the next step's copies
  so each K step's load latency is paid in full, and no decode overlaps an MMA.
  Here, per K step s (every copy lands in shared memory by cp.async, one commit group a step):
    wait for step s's group; fence; barrier; issue the copies of step s + DIST;
    words <- shared (registers, in the MMA's A layout); step s + 1's scales <- global
    (registers, one step ahead); for each piece i (pairs i, i + 4):
      decode piece i into registers (bf16x2, as fast_kernel's DEQUANT 3)
      issue its wgmma for every sub-block, asynchronously
      wait until only that piece's wgmmas are in flight: the previous piece's are done, so
      the decode of the next piece runs while this one multiplies
    (DRAIN: wait 0 at the step's end; else the last piece stays in flight into the next step)

Buffers and hazards. STAGES buffers hold a step's words [BN, P] int32 and its activations
[SPLIT * 8, BM, P] bf16 (index (stage * SPLIT + s) * 8 + i: sub-block s, piece i; P 32,
BM 64, 3 sub-blocks: 16 + 96 KB a stage, 224 KB at 2 stages, one CTA per SM). Step s + DIST is copied into buffer (s + DIST) % STAGES, last read at step s + DIST -
STAGES: with DRAIN (DIST = STAGES - 1) its wgmmas were waited for at that step's end; without
(DIST = STAGES - 2) its last wgmmas were retired by each warpgroup's first wait of step s - 1,
before step s's barrier. cp.async writes are ordered before the async proxy's wgmma reads by
wait_group, fence.proxy.async and the CTA barrier, in that order.

Rows that are padding (the sentinel) read activation row 0 and are never stored; weight rows
past N read row N - 1 and are never stored: no load is masked. Each output column's K sum
runs over the same pieces in the same order, in fp32 wgmma, as fast_kernel's, so the
results are its bits (tests/test_wgmma_kernel.py checks them on an H200). Importing this
module needs Triton >= 3.5 (gluon); nothing imports it unless the grouped kernel's
"wgmma" is on (diag.int4.fast).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.runtime.jit import constexpr_function

from diag.int4.fast_kernel import BF16X2_DECODE


@constexpr_function
def _copy_layout(rows, cols, vec, num_warps):
    """A blocked layout in which each thread cp.asyncs `vec` contiguous elements of a
    [rows, cols] tile (row major): threads along the row first, warps down the rows.
    Activations [64, 32] bf16, vec 8 (16 bytes), 8 warps: threads [8, 4], warps [8, 1], one
    pass; words [128, 32] int32, vec 4: threads [4, 8], warps [8, 1], four passes."""
    tc = min(cols // vec, 32)
    tr = 32 // tc
    wr = min(num_warps, max(rows // tr, 1))
    return gl.BlockedLayout([1, vec], [tr, tc], [wr, num_warps // wr], [1, 0])


@constexpr_function
def _store_layout(block_n, block_m, num_warps):
    """out^T [BN, BM] stored at out[pair, n]: 8 consecutive n (16 bytes) per thread; BN 128,
    8 warps: threads [16, 2], warps [1, 8], so a pass stores [128, 16]."""
    tn = min(block_n // 8, 32)
    return gl.BlockedLayout([8, 1], [tn, 32 // tn], [1, num_warps], [0, 1])


@gluon.jit
def _dequant_pair(words, shift: gl.constexpr, pair_scale):
    """[BN, P] int32 words, [BN, P] int32 pairs of bf16 scales (piece i low, piece i + 4
    high) -> pieces i and i + 4 as [BN, P] bf16 each: fast_kernel._dequant_pair's
    instructions (worked example there): (q_i, q_{i+4}) = bf16x2(128 + u) - 136, exactly,
    then times the scales, rounded once."""
    return gl.inline_asm_elementwise(BF16X2_DECODE, "=h,=h,r,r", [words >> shift, pair_scale],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)


@gluon.jit
def _scale_pair(s_ptrs, k0, i: gl.constexpr, stride_sg, GROUP: gl.constexpr, PIECE: gl.constexpr):
    """[BN] int32 in s_ptrs' layout: the bf16 bits of piece i's scales (group (k0 + i * P) //
    GROUP) low, piece i + 4's high."""
    lo = gl.load(s_ptrs + ((k0 + i * PIECE) // GROUP) * stride_sg).to(gl.int16, bitcast=True)
    hi = gl.load(s_ptrs + ((k0 + (i + 4) * PIECE) // GROUP) * stride_sg).to(gl.int16, bitcast=True)
    return (lo.to(gl.int32) & 0xFFFF) | (hi.to(gl.int32) << 16)


@gluon.jit
def _scale_pairs(s_ptrs, step, stride_sg, GROUP: gl.constexpr, PIECE: gl.constexpr):
    """Step `step`'s four scale pairs (_scale_pair, i = 0..3)."""
    k0 = step * (8 * PIECE)
    return (_scale_pair(s_ptrs, k0, 0, stride_sg, GROUP, PIECE), _scale_pair(s_ptrs, k0, 1, stride_sg, GROUP, PIECE),
            _scale_pair(s_ptrs, k0, 2, stride_sg, GROUP, PIECE), _scale_pair(s_ptrs, k0, 3, stride_sg, GROUP, PIECE))


@gluon.jit
def _issue(step, stage, words_buf, acts_buf, w_ptrs, a0, a1, a2, PIECE: gl.constexpr, SPLIT: gl.constexpr):
    """cp.async step `step`'s words and activations into buffer `stage`, one commit group."""
    k0 = step * (8 * PIECE)
    cp.async_copy_global_to_shared(words_buf.index(stage), w_ptrs + k0 // 8)
    for i in gl.static_range(8):
        k = k0 + i * PIECE
        cp.async_copy_global_to_shared(acts_buf.index((stage * SPLIT + 0) * 8 + i), a0 + k)
        if SPLIT > 1:
            cp.async_copy_global_to_shared(acts_buf.index((stage * SPLIT + 1) * 8 + i), a1 + k)
        if SPLIT > 2:
            cp.async_copy_global_to_shared(acts_buf.index((stage * SPLIT + 2) * 8 + i), a2 + k)
    cp.commit_group()


@gluon.jit
def _act_ptrs(a_ptr, sorted_ids_ptr, block, num_pairs, a_div, stride_am, BLOCK_M: gl.constexpr,
              PIECE: gl.constexpr, layout: gl.constexpr):
    """Row block `block`'s activation pointers [BM, P] at column 0 (the sentinel reads row 0)."""
    pair = gl.load(sorted_ids_ptr + block * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(1, layout)))
    row = gl.where(pair < num_pairs, pair // a_div, 0)
    cols = gl.arange(0, PIECE, gl.SliceLayout(0, layout))
    return a_ptr + row.to(gl.int64)[:, None] * stride_am + cols[None, :]


@gluon.jit
def _mma(w, acts_buf, base: gl.constexpr, acc0, acc1, acc2, SPLIT: gl.constexpr):
    """One decoded piece w [BN, P] against each sub-block's activations, asynchronously."""
    acc0 = warpgroup_mma(w, acts_buf.index(base).permute((1, 0)), acc0, is_async=True)
    if SPLIT > 1:
        acc1 = warpgroup_mma(w, acts_buf.index(base + 8).permute((1, 0)), acc1, is_async=True)
    if SPLIT > 2:
        acc2 = warpgroup_mma(w, acts_buf.index(base + 16).permute((1, 0)), acc2, is_async=True)
    return acc0, acc1, acc2


@gluon.jit
def _retire(keep: gl.constexpr, acc0, acc1, acc2, w, SPLIT: gl.constexpr):
    """Wait until `keep` wgmmas are in flight; w (the piece they read) stays alive until then."""
    if SPLIT == 1:
        acc0, w = warpgroup_mma_wait(num_outstanding=keep, deps=(acc0, w))
    elif SPLIT == 2:
        acc0, acc1, w = warpgroup_mma_wait(num_outstanding=keep, deps=(acc0, acc1, w))
    else:
        acc0, acc1, acc2, w = warpgroup_mma_wait(num_outstanding=keep, deps=(acc0, acc1, acc2, w))
    return acc0, acc1, acc2


@gluon.jit
def _store(acc, out_ptr, route_w_ptr, sorted_ids_ptr, block, num_pairs, offs_n, N, stride_om,
           BLOCK_M: gl.constexpr, MUL_ROUTE: gl.constexpr, mma: gl.constexpr, layout: gl.constexpr):
    """One sub-block's acc [BN, BM] fp32 -> out[pair, n] bf16 (times the pairs' routing
    weights in fp32 where MUL_ROUTE), stored with n fastest."""
    if MUL_ROUTE:
        pair_m = gl.load(sorted_ids_ptr + block * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(0, mma)))
        acc = acc * gl.load(route_w_ptr + pair_m, mask=pair_m < num_pairs, other=0.0)[None, :]
    y = gl.convert_layout(acc.to(gl.bfloat16), layout)
    pair = gl.load(sorted_ids_ptr + block * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(0, layout)))
    ptrs = out_ptr + pair.to(gl.int64)[None, :] * stride_om + offs_n[:, None]
    gl.store(ptrs, y, mask=(pair < num_pairs)[None, :] & (offs_n < N)[:, None])


@gluon.jit(do_not_specialize=["num_pairs"])
def moe_int4_gemm_wgmma(a_ptr, w_ptr, s_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, route_w_ptr,
                        N, K, num_pairs, a_div,
                        stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_sg, stride_om,
                        GROUP: gl.constexpr, PIECE: gl.constexpr, BLOCK_N: gl.constexpr,
                        BLOCK_M: gl.constexpr, MUL_ROUTE: gl.constexpr, SPLIT: gl.constexpr,
                        STAGES: gl.constexpr, DRAIN: gl.constexpr):
    """One [BLOCK_N, SPLIT * BLOCK_M] tile of out^T; grid (N tiles, row blocks of SPLIT *
    BLOCK_M rows); arguments as fast_kernel.moe_int4_gemm_split's (stride_sn must be 1:
    scales group major). K % (8 * PIECE) == 0, 8 * PIECE % GROUP == 0, GROUP % PIECE == 0."""
    gl.static_assert(SPLIT >= 1 and SPLIT <= 3, "1..3 sub-blocks")
    gl.static_assert(STAGES >= 2 and (DRAIN or STAGES >= 3), "DIST = STAGES - 1 (DRAIN) or - 2 >= 1")
    NW: gl.constexpr = gl.num_warps()
    DIST: gl.constexpr = STAGES - 1 if DRAIN else STAGES - 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                  instr_shape=[16, BLOCK_M, 16])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows_of_a: gl.constexpr = gl.SliceLayout(1, a_op)
    words_ld: gl.constexpr = _copy_layout(BLOCK_N, PIECE, 4, NW)
    acts_ld: gl.constexpr = _copy_layout(BLOCK_M, PIECE, 8, NW)
    out_st: gl.constexpr = _store_layout(BLOCK_N, BLOCK_M, NW)
    words_sh: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=4, order=[1, 0])
    acts_sh: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, PIECE], gl.bfloat16)

    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    expert = gl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    n0 = pid_n * BLOCK_N
    rows_w = gl.minimum(n0 + gl.arange(0, BLOCK_N, gl.SliceLayout(1, words_ld)), N - 1)
    w_ptrs = (w_ptr + expert.to(gl.int64) * stride_we + rows_w.to(gl.int64)[:, None] * stride_wn
              + gl.arange(0, PIECE, gl.SliceLayout(0, words_ld))[None, :])              # [BN, P]
    rows_s = gl.minimum(n0 + gl.arange(0, BLOCK_N, rows_of_a), N - 1)
    s_ptrs = s_ptr + expert.to(gl.int64) * stride_se + rows_s                            # [BN], group 0
    a0 = _act_ptrs(a_ptr, sorted_ids_ptr, pid_m * SPLIT, num_pairs, a_div, stride_am, BLOCK_M, PIECE, acts_ld)
    a1 = a0
    a2 = a0
    if SPLIT > 1:
        a1 = _act_ptrs(a_ptr, sorted_ids_ptr, pid_m * SPLIT + 1, num_pairs, a_div, stride_am, BLOCK_M,
                       PIECE, acts_ld)
    if SPLIT > 2:
        a2 = _act_ptrs(a_ptr, sorted_ids_ptr, pid_m * SPLIT + 2, num_pairs, a_div, stride_am, BLOCK_M,
                       PIECE, acts_ld)

    words_buf = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, PIECE], words_sh)
    acts_buf = gl.allocate_shared_memory(gl.bfloat16, [STAGES * SPLIT * 8, BLOCK_M, PIECE], acts_sh)

    steps = K // (8 * PIECE)
    for s in gl.static_range(DIST):
        if s < steps:
            _issue(s, s, words_buf, acts_buf, w_ptrs, a0, a1, a2, PIECE, SPLIT)
        else:
            cp.commit_group()                    # an empty group keeps the count per step
    acc0 = gl.zeros((BLOCK_N, BLOCK_M), gl.float32, mma)
    acc1 = gl.zeros((BLOCK_N, BLOCK_M), gl.float32, mma)     # unused below SPLIT 2
    acc2 = gl.zeros((BLOCK_N, BLOCK_M), gl.float32, mma)     # unused below SPLIT 3
    prev = gl.zeros((BLOCK_N, PIECE), gl.bfloat16, a_op)     # the piece whose wgmmas may be in flight
    p0, p1, p2, p3 = _scale_pairs(s_ptrs, 0, stride_sg, GROUP, PIECE)   # step 0's; then one step ahead
    for step in range(steps):
        stage = step % STAGES
        cp.wait_group(DIST - 1)                  # step's group landed (DIST - 1 younger ones may not)
        fence_async_shared()
        gl.thread_barrier()
        nxt = step + DIST
        if nxt < steps:
            _issue(nxt, nxt % STAGES, words_buf, acts_buf, w_ptrs, a0, a1, a2, PIECE, SPLIT)
        else:
            cp.commit_group()
        words = words_buf.index(stage).load(a_op)                                        # [BN, P]
        pairs = (p0, p1, p2, p3)
        p0, p1, p2, p3 = _scale_pairs(s_ptrs, gl.minimum(step + 1, steps - 1), stride_sg, GROUP, PIECE)
        for i in gl.static_range(4):
            pair = gl.broadcast(pairs[i][:, None], words)[0]
            w_lo, w_hi = _dequant_pair(words, 4 * i, pair)
            # issue piece i, then retire the piece before it (prev, kept alive until here)
            acc0, acc1, acc2 = _mma(w_lo, acts_buf, stage * SPLIT * 8 + i, acc0, acc1, acc2, SPLIT)
            acc0, acc1, acc2 = _retire(SPLIT, acc0, acc1, acc2, prev, SPLIT)
            acc0, acc1, acc2 = _mma(w_hi, acts_buf, stage * SPLIT * 8 + i + 4, acc0, acc1, acc2, SPLIT)
            acc0, acc1, acc2 = _retire(SPLIT, acc0, acc1, acc2, w_lo, SPLIT)
            prev = w_hi
        if DRAIN:
            acc0, acc1, acc2 = _retire(0, acc0, acc1, acc2, prev, SPLIT)
    cp.wait_group(0)
    acc0, acc1, acc2 = _retire(0, acc0, acc1, acc2, prev, SPLIT)
    offs_n = n0 + gl.arange(0, BLOCK_N, gl.SliceLayout(1, out_st))
    _store(acc0, out_ptr, route_w_ptr, sorted_ids_ptr, pid_m * SPLIT, num_pairs, offs_n, N, stride_om,
           BLOCK_M, MUL_ROUTE, mma, out_st)
    if SPLIT > 1:
        _store(acc1, out_ptr, route_w_ptr, sorted_ids_ptr, pid_m * SPLIT + 1, num_pairs, offs_n, N,
               stride_om, BLOCK_M, MUL_ROUTE, mma, out_st)
    if SPLIT > 2:
        _store(acc2, out_ptr, route_w_ptr, sorted_ids_ptr, pid_m * SPLIT + 2, num_pairs, offs_n, N,
               stride_om, BLOCK_M, MUL_ROUTE, mma, out_st)
