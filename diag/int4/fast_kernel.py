"""The Triton kernel behind diag.int4.fast: a grouped GEMM over routed experts whose weights
stay INT4 packed in global memory and are dequantized tile by tile in registers.

  out[p, n] = sum_k A[row(p), k] * W_e[n, k]            (p: a (token, slot) pair routed to e)
  W_e[n, k] = (((packed[e, n, k // 8] >> 4 * (k % 8)) & 0xF) - 8) * scale[e, n, k // group]

Worked example of one word: packed = 0x7BA9F810, k % 8 = 3 -> (word >> 12) & 0xF = 0xF = 15
-> q = 7. An arithmetic right shift of a negative word fills the top bits with ones; the
`& 0xF` drops them, so negative words decode like positive ones.

Tiles of W are read as [BLOCK_N, BLOCK_K / 8] words, contiguous along k (coalesced), then
unpacked in registers to [BLOCK_N, BLOCK_K] and fed transposed to the dot.

Rows are laid out by diag.int4.fast.route: `sorted_ids` [num_blocks * BLOCK_M] lists pair
indices grouped by expert, each expert's run padded to a multiple of BLOCK_M with the
sentinel S (= number of pairs); `block_expert` [num_blocks] names each block's expert, -1
for unused blocks. The pair count (and glu_rows' row count) is not specialised on: it only
bounds masks, and Triton would otherwise compile each kernel again for each count's
divisibility by 16 met as a loop's rows retire (bench/compiles.py counts compiles in a timed
loop). Importing this module needs Triton; nothing else in diag does.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(x, y, acc, UPCAST: tl.constexpr):
    """acc + x @ y; under Triton's CPU interpreter (which multiplies bf16 dots wrongly) in fp32."""
    if UPCAST:
        out = tl.dot(x.to(tl.float32), y.to(tl.float32), acc)
    else:
        out = tl.dot(x, y, acc)
    return out


@triton.jit
def _block_rows(sorted_ids_ptr, pid_m, num_pairs, a_div, BLOCK_M: tl.constexpr):
    """Block pid_m's pair indices [BM], which of them are real (not the sentinel S), and the
    activation row each reads (pair // a_div; 0 for the sentinel)."""
    pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = pair < num_pairs
    return pair, row_ok, tl.where(row_ok, pair // a_div, 0)


@triton.jit(do_not_specialize=["num_pairs"])
def moe_int4_gemm(a_ptr, w_ptr, s_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, route_w_ptr,
                  N, K, num_pairs, a_div,
                  stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_om,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, MUL_ROUTE: tl.constexpr, UPCAST: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of out. A [rows, K] bf16; packed W [E, N, K/8] int32;
    scales [E, N, K/GROUP] bf16; out [num_pairs, N] bf16. K % BLOCK_K == 0.
    UPCAST: dot in fp32 on the same bf16 values (only for TRITON_INTERPRET=1)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pair, row_ok, a_row = _block_rows(sorted_ids_ptr, pid_m, num_pairs, a_div, BLOCK_M)   # [BM]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :]            # [BM, BK]
    offs_w = tl.arange(0, BLOCK_K // 8)
    w_ptrs = (w_ptr + expert.to(tl.int64) * stride_we + offs_n[:, None] * stride_wn
              + offs_w[None, :])                                            # [BN, BK/8], rows contiguous
    offs_g = tl.arange(0, BLOCK_K // GROUP)
    s_ptrs = (s_ptr + expert.to(tl.int64) * stride_se + offs_n[:, None] * stride_sn
              + offs_g[None, :])                                            # [BN, BK/GROUP]
    shifts = tl.arange(0, 8) * 4                                            # nibble k % 8 at 4 * (k % 8)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        words = tl.load(w_ptrs, mask=n_ok[:, None], other=0)
        q = tl.reshape((words[:, :, None] >> shifts[None, None, :]) & 0xF, (BLOCK_N, BLOCK_K)) - 8
        scale = tl.load(s_ptrs, mask=n_ok[:, None], other=0.0)
        scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_K // GROUP, GROUP)),
                           (BLOCK_N, BLOCK_K))
        w = (q.to(tl.float32) * scale.to(tl.float32)).to(tl.bfloat16)        # [BN, BK], as dequantize()
        acc = _dot(a, tl.trans(w), acc, UPCAST)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K // 8
        s_ptrs += BLOCK_K // GROUP
    if MUL_ROUTE:
        acc = acc * tl.load(route_w_ptr + pair, mask=row_ok, other=0.0)[:, None]
    out_ptrs = out_ptr + pair[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(tl.bfloat16), mask=row_ok[:, None] & n_ok[None, :])


# ---- the grouped kernel: weights in diag.int4.kernel_layout, tokens on the dot's N side ----
#
# out^T[n, m] = sum_k W_e[n, k] * A[row(m), k]: the weight tile is the dot's left operand
# [BLOCK_N, P] (dequantized in registers, never written to memory), the gathered
# activations its right operand [P, BLOCK_M]. One K step is one block of 8P columns:
# BLOCK_N x P words loaded once, then for i in 0..7 one shift + mask gives columns
# k0 + iP .. k0 + iP + P - 1, all in group (k0 + iP) // G, scaled by one [BLOCK_N] vector:
#   q = ((words >> 4i) & 0xF) - 8,   W = bf16(q * scale[:, group])      (as format.dequantize)
# DEQUANT picks how q becomes a float (all exact, so all give the same bf16 bits):
#   0  int -> fp32 convert                                 (the conversion unit: slow)
#   1  fp32 magic: bits 0x4B000000 | u = 2^23 + u exactly, minus (2^23 + 8) = q
#   2  bf16 magic: bits 0x4300 | u = 128 + u exactly (bf16), minus 136 = q; multiply in bf16
#   3  bf16x2 magic, two weights per 32-bit instruction (inline PTX, sm_80+): pieces i and
#      i + 4 sit in nibbles i and i + 4 of a word, 16 bits apart, so (word >> 4i) & 0x000F000F
#      | 0x43004300 is the pair (128 + u_i, 128 + u_{i+4}) as bf16x2; one fma.rn.bf16x2 by
#      (1, 1) plus (-136, -136) gives (q_i, q_{i+4}) exactly, a second by the two pieces'
#      scales plus (-0, -0) gives bf16(q * scale) rounded once, as variant 2 does. Per two
#      weights: one shift, one lop3, two fma, against a shift, a mask, an or, a narrowing and
#      float work per weight in 2.
# Worked example, u = 3: fp32 bits 0x4B000003 = 8388611.0, minus 8388616.0 = -5.0 = q.

@triton.jit
def _to_bf16(x, UPCAST: tl.constexpr):
    """fp32 -> bf16, round to nearest even. On the GPU the hardware conversion; under
    Triton's interpreter (whose fp32 -> bf16 truncates) the same rounding done on the bits:
    0x3F8D8000 (1.10546875, a tie) -> 0x3F8E (even); 0x3F8C8001 -> 0x3F8D."""
    if UPCAST:
        bits = x.to(tl.int32, bitcast=True)
        up = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        y = up.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(tl.bfloat16)
    return y


@triton.jit
def _decode(u, scale, DEQUANT: tl.constexpr, UPCAST: tl.constexpr):
    """Nibbles u (int32, 0..15) and bf16 scales of a broadcastable shape -> bf16 weights
    bf16(q) * scale, q = u - 8. (One return at the end: Triton compiles no early return out
    of a branch.)"""
    if DEQUANT == 2 and not UPCAST:
        h = (u | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
        w = (h - 136.0).to(tl.bfloat16) * scale
    else:
        if DEQUANT == 0:
            f = (u - 8).to(tl.float32)
        elif DEQUANT == 1:
            f = (u | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
        else:  # the interpreter keeps bf16 as raw uint16 and cannot add to it: fp32 there
            f = (u | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32) - 136.0
        w = _to_bf16(f * scale.to(tl.float32), UPCAST)
    return w


@triton.jit
def _dequant(words, shift, scale, DEQUANT: tl.constexpr, UPCAST: tl.constexpr):
    """[BN, P] words, [BN] bf16 scale -> [BN, P] bf16 weights of the piece at `shift`."""
    return _decode((words >> shift) & 0xF, scale[:, None], DEQUANT, UPCAST)


# DEQUANT 3's instructions: $2 the shifted word, $3 the two pieces' bf16 scales (lo | hi << 16)
# -> $0, $1 the pieces' bf16 weights (wgmma_kernel decodes with the same string)
BF16X2_DECODE = tl.constexpr("""{
        .reg .b32 t, m, c, one, neg, nz;
        mov.b32 m, 0x000F000F;
        mov.b32 c, 0x43004300;
        mov.b32 one, 0x3F803F80;
        mov.b32 neg, 0xC308C308;
        mov.b32 nz, 0x80008000;
        lop3.b32 t, $2, m, c, 0xEA;
        fma.rn.bf16x2 t, t, one, neg;
        fma.rn.bf16x2 t, t, $3, nz;
        mov.b32 {$0, $1}, t;
        }""")


@triton.jit
def _dequant_pair(words, shift, scale_lo, scale_hi):
    """[BN, P] words, [BN] bf16 scales of pieces i and i + 4 (shift = 4i, i < 4) -> the two
    pieces' [BN, P] bf16 weights (DEQUANT 3; CUDA only: inline PTX)."""
    pair = ((scale_lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF)
            | (scale_hi.to(tl.int16, bitcast=True).to(tl.int32) << 16))                # [BN]
    pair = tl.broadcast_to(pair[:, None], words.shape)
    return tl.inline_asm_elementwise(BF16X2_DECODE, "=h,=h,r,r", [words >> shift, pair],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)


@triton.jit
def _dequant_block(words, scales, PIECE: tl.constexpr, BLOCK_N: tl.constexpr, DEQUANT: tl.constexpr,
                   UPCAST: tl.constexpr):
    """[BN, P] words, [BN, 8] bf16 scales (one per piece) -> [BN, 8P] bf16 weights of the
    whole block, columns in order: column i * P + j is nibble i of word j (kernel_layout)."""
    shifts = tl.arange(0, 8) * 4                                            # [8]
    u = (words[:, None, :] >> shifts[None, :, None]) & 0xF                  # [BN, 8, P]
    w = _decode(u, scales[:, :, None], DEQUANT, UPCAST)                     # [BN, 8, P]
    return tl.reshape(w, (BLOCK_N, 8 * PIECE))


@triton.jit
def _words_at(w_base, k0, n_ok):
    """The [BN, P] packed words of the K block starting at column k0 (rows past N read 0)."""
    return tl.load(w_base + k0 // 8, mask=n_ok[:, None], other=0)


@triton.jit
def _scale_at(s_base, k, n_ok, stride_sg, GROUP: tl.constexpr):
    """The [BN] bf16 scales of the group holding column k."""
    return tl.load(s_base + (k // GROUP) * stride_sg, mask=n_ok, other=0.0)


@triton.jit
def _piece_tile(words, s_base, k0, i, n_ok, stride_sg, GROUP: tl.constexpr, PIECE: tl.constexpr,
                DEQUANT: tl.constexpr, UPCAST: tl.constexpr):
    """Piece i of the block at column k0: its first column k = k0 + iP and its [BN, P] bf16
    weights (nibble i of each word, scaled by group k // G). Both kernels' narrow loops."""
    k = k0 + i * PIECE
    return k, _dequant(words, 4 * i, _scale_at(s_base, k, n_ok, stride_sg, GROUP), DEQUANT, UPCAST)


@triton.jit
def _pair_tiles(words, s_base, k0, i, n_ok, stride_sg, GROUP: tl.constexpr, PIECE: tl.constexpr):
    """DEQUANT 3: pieces i and i + 4 (i < 4) of the block at column k0, decoded together
    (_dequant_pair): their first columns lo = k0 + iP, hi = k0 + (i + 4)P and [BN, P] bf16
    weights. Both kernels' bf16x2 loops."""
    lo, hi = k0 + i * PIECE, k0 + (i + 4) * PIECE
    w_lo, w_hi = _dequant_pair(words, 4 * i, _scale_at(s_base, lo, n_ok, stride_sg, GROUP),
                               _scale_at(s_base, hi, n_ok, stride_sg, GROUP))
    return lo, hi, w_lo, w_hi


@triton.jit
def _sub_rows(a_ptr, sorted_ids_ptr, pid_m, s: tl.constexpr, num_pairs, a_div, stride_am,
              offs_k, BLOCK_M: tl.constexpr, SPLIT: tl.constexpr):
    """Sub-block s of CTA row block pid_m (SPLIT sub-blocks of BLOCK_M rows): its pair
    indices [BM], which are real, and the activation pointers [K tile, BM] at column 0."""
    pair, row_ok, a_row = _block_rows(sorted_ids_ptr, pid_m * SPLIT + s, num_pairs, a_div, BLOCK_M)
    return pair, row_ok, a_ptr + a_row[None, :].to(tl.int64) * stride_am + offs_k[:, None]


@triton.jit
def _piece_dot(acc, w, a_ptrs, row_ok, UPCAST: tl.constexpr):
    """acc + w @ A-tile: the tile at a_ptrs [P, BM], padding rows read as 0."""
    return _dot(w, tl.load(a_ptrs, mask=row_ok[None, :], other=0.0), acc, UPCAST)


@triton.jit
def _dots(acc0, acc1, acc2, acc3, w, a0, a1, a2, a3, ok0, ok1, ok2, ok3, k,
          SPLIT: tl.constexpr, UPCAST: tl.constexpr):
    """One dequantized weight tile w [BN, P] against the SPLIT sub-blocks' activations at
    column k: the tile is decoded once for all of them."""
    acc0 = _piece_dot(acc0, w, a0 + k, ok0, UPCAST)
    acc1 = _piece_dot(acc1, w, a1 + k, ok1, UPCAST)
    if SPLIT > 2:
        acc2 = _piece_dot(acc2, w, a2 + k, ok2, UPCAST)
    if SPLIT > 3:
        acc3 = _piece_dot(acc3, w, a3 + k, ok3, UPCAST)
    return acc0, acc1, acc2, acc3


@triton.jit
def _weight_rows(w_ptr, s_ptr, expert, pid_n, N, stride_we, stride_wn, stride_se, stride_sn,
                 BLOCK_N: tl.constexpr, PIECE: tl.constexpr, GLU: tl.constexpr):
    """Tile pid_n's weight rows [BN] (gate rows then up rows under GLU, _glu_rows), which are
    real, and the pointers to its first K block: words [BN, P] and scales [BN]."""
    if GLU:
        offs_n, n_ok = _glu_rows(pid_n, N, BLOCK_N)
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
    w_base = (w_ptr + expert.to(tl.int64) * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
              + tl.arange(0, PIECE)[None, :])                                     # [BN, P] words
    s_base = s_ptr + expert.to(tl.int64) * stride_se + offs_n.to(tl.int64) * stride_sn  # [BN]
    return offs_n, n_ok, w_base, s_base


@triton.jit
def _epilogue(acc, out_ptr, route_w_ptr, pair, row_ok, offs_n, n_ok, pid_n, N, stride_om,
              BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, MUL_ROUTE: tl.constexpr,
              GLU: tl.constexpr, UPCAST: tl.constexpr):
    """One sub-block's acc [BN, BM] (fp32) -> out: scaled by the pairs' routing weights
    (MUL_ROUTE), through the GLU (GLU), stored as bf16 at the pairs' rows."""
    if MUL_ROUTE:
        acc = acc * tl.load(route_w_ptr + pair, mask=row_ok, other=0.0)[None, :]
    if GLU:
        _glu_store(acc, out_ptr, pair, row_ok, pid_n, N, stride_om, BLOCK_N, BLOCK_M, UPCAST)
    else:
        out_ptrs = out_ptr + pair[None, :].to(tl.int64) * stride_om + offs_n[:, None]
        tl.store(out_ptrs, _to_bf16(acc, UPCAST), mask=n_ok[:, None] & row_ok[None, :])


@triton.jit(do_not_specialize=["num_pairs"])
def moe_int4_gemm_grouped(a_ptr, w_ptr, s_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, route_w_ptr,
                          N, K, num_pairs, a_div,
                          stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_sg, stride_om,
                          GROUP: tl.constexpr, PIECE: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_M: tl.constexpr, DEQUANT: tl.constexpr, MUL_ROUTE: tl.constexpr,
                          UPCAST: tl.constexpr, WIDE: tl.constexpr = False, GLU: tl.constexpr = False):
    """One [BLOCK_N, BLOCK_M] tile of out^T. Grid (N tiles, M blocks): the N tiles of one
    block of rows run side by side, so its gathered activations are read from L2.
    packed W [E, N, K/8] int32 in kernel layout (piece PIECE); scales [E, N, K/GROUP] bf16
    (any strides); K % (8 * PIECE) == 0 and GROUP % PIECE == 0.
    WIDE: one dot of depth 8P per block (the block's [BN, 8P] weights unpacked at once, the
    activations loaded as one [8P, BM] tile) instead of 8 dots of depth P; the same weights
    and the same fp32 accumulation, in another order of the additions.
    GLU: W is gate_up [2I, K] and out is h = silu(gate) * up [num_pairs, I] (_glu_rows,
    _glu_store): the tile's first BLOCK_N / 2 weight rows are gate rows, the others the
    same rows of up, so the [S, 2I] product is never written."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pair, row_ok, a_row = _block_rows(sorted_ids_ptr, pid_m, num_pairs, a_div, BLOCK_M)   # [BM]
    offs_n, n_ok, w_base, s_base = _weight_rows(w_ptr, s_ptr, expert, pid_n, N, stride_we, stride_wn,
                                                stride_se, stride_sn, BLOCK_N, PIECE, GLU)
    offs_p = tl.arange(0, PIECE)
    a_base = a_ptr + a_row[None, :].to(tl.int64) * stride_am + offs_p[:, None]        # [P, BM]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if WIDE:  # per block of 8P columns: one word load, one [BN, 8] scale load (piece i's group
        # (k0 + iP) // G, e.g. P 16, G 32 -> k0 / 32 + [0, 0, 1, 1, 2, 2, 3, 3]), one dot
        offs_kb = tl.arange(0, 8 * PIECE)
        a_wide = a_ptr + a_row[None, :].to(tl.int64) * stride_am + offs_kb[:, None]      # [8P, BM]
        piece_group = (tl.arange(0, 8) * PIECE) // GROUP                                  # [8]
        for k0 in range(0, K, 8 * PIECE):
            words = _words_at(w_base, k0, n_ok)                                          # [BN, P]
            scales = tl.load(s_base[:, None] + (k0 // GROUP + piece_group)[None, :] * stride_sg,
                             mask=n_ok[:, None], other=0.0)                               # [BN, 8]
            a = tl.load(a_wide + k0, mask=row_ok[None, :], other=0.0)                    # [8P, BM]
            w = _dequant_block(words, scales, PIECE, BLOCK_N, DEQUANT, UPCAST)            # [BN, 8P]
            acc = _dot(w, a, acc, UPCAST)
    elif DEQUANT == 3:  # pieces i and i + 4 dequantized together (bf16x2), dotted in turn
        for k0 in range(0, K, 8 * PIECE):
            words = _words_at(w_base, k0, n_ok)
            for i in tl.static_range(4):   # activations loaded first: the schedule measured (NOTES.md)
                a_lo = tl.load(a_base + (k0 + i * PIECE), mask=row_ok[None, :], other=0.0)    # [P, BM]
                a_hi = tl.load(a_base + (k0 + (i + 4) * PIECE), mask=row_ok[None, :], other=0.0)
                _, _, w_lo, w_hi = _pair_tiles(words, s_base, k0, i, n_ok, stride_sg, GROUP, PIECE)
                acc = tl.dot(w_lo, a_lo, acc)
                acc = tl.dot(w_hi, a_hi, acc)
    else:
        for k0 in range(0, K, 8 * PIECE):
            words = _words_at(w_base, k0, n_ok)
            for i in tl.static_range(8):
                a = tl.load(a_base + (k0 + i * PIECE), mask=row_ok[None, :], other=0.0)      # [P, BM]
                _, w = _piece_tile(words, s_base, k0, i, n_ok, stride_sg, GROUP, PIECE, DEQUANT, UPCAST)
                acc = _dot(w, a, acc, UPCAST)
    _epilogue(acc, out_ptr, route_w_ptr, pair, row_ok, offs_n, n_ok, pid_n, N, stride_om,
              BLOCK_N, BLOCK_M, MUL_ROUTE, GLU, UPCAST)


@triton.jit(do_not_specialize=["num_pairs"])
def moe_int4_gemm_split(a_ptr, w_ptr, s_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, route_w_ptr,
                        N, K, num_pairs, a_div,
                        stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_sg, stride_om,
                        GROUP: tl.constexpr, PIECE: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_M: tl.constexpr, DEQUANT: tl.constexpr, MUL_ROUTE: tl.constexpr,
                        UPCAST: tl.constexpr, GLU: tl.constexpr = False, SPLIT: tl.constexpr = 2):
    """One [BLOCK_N, SPLIT * BLOCK_M] tile of out^T, for SPLIT (2..4) sub-blocks of BLOCK_M
    rows; grid (N tiles, row blocks of SPLIT * BLOCK_M); arguments and GLU as
    moe_int4_gemm_grouped's narrow loops (no WIDE). Each sub-block has its own accumulator
    and dot, all fed by one dequantization of each weight tile: a 192-row block (3 x 64)
    decodes its weights once where three 64-row blocks decode them three times, and pads an
    expert's rows to 192 where one dot of 256 would pad them to 256. Each row's sum runs over
    the same K steps in the same order as in the one-block kernel, so the bits are its bits.
    A separate kernel, so that the one-block kernel compiles as it did: folding SPLIT 1 into
    this one slowed its GLU epilogue by 17% on an H200 (NOTES.md)."""
    tl.static_assert(SPLIT >= 2 and SPLIT <= 4, "2..4 sub-blocks")
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    offs_n, n_ok, w_base, s_base = _weight_rows(w_ptr, s_ptr, expert, pid_n, N, stride_we, stride_wn,
                                                stride_se, stride_sn, BLOCK_N, PIECE, GLU)
    offs_p = tl.arange(0, PIECE)
    # sub-blocks 0 and 1 always; 2 and 3 only where SPLIT has them (unused names stay
    # sub-block 0's and are never dotted or stored)
    pair0, ok0, a0 = _sub_rows(a_ptr, sorted_ids_ptr, pid_m, 0, num_pairs, a_div, stride_am, offs_p,
                               BLOCK_M, SPLIT)                                  # [P, BM]
    pair1, ok1, a1 = _sub_rows(a_ptr, sorted_ids_ptr, pid_m, 1, num_pairs, a_div, stride_am, offs_p,
                               BLOCK_M, SPLIT)
    pair2, ok2, a2 = pair0, ok0, a0
    pair3, ok3, a3 = pair0, ok0, a0
    if SPLIT > 2:
        pair2, ok2, a2 = _sub_rows(a_ptr, sorted_ids_ptr, pid_m, 2, num_pairs, a_div, stride_am,
                                   offs_p, BLOCK_M, SPLIT)
    if SPLIT > 3:
        pair3, ok3, a3 = _sub_rows(a_ptr, sorted_ids_ptr, pid_m, 3, num_pairs, a_div, stride_am,
                                   offs_p, BLOCK_M, SPLIT)
    acc0 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_M) if SPLIT > 2 else (16, 16), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, BLOCK_M) if SPLIT > 3 else (16, 16), dtype=tl.float32)
    if DEQUANT == 3:  # pieces i and i + 4 dequantized together (bf16x2), dotted in turn
        for k0 in range(0, K, 8 * PIECE):
            words = _words_at(w_base, k0, n_ok)
            for i in tl.static_range(4):
                lo, hi, w_lo, w_hi = _pair_tiles(words, s_base, k0, i, n_ok, stride_sg, GROUP, PIECE)
                acc0, acc1, acc2, acc3 = _dots(acc0, acc1, acc2, acc3, w_lo, a0, a1, a2, a3,
                                               ok0, ok1, ok2, ok3, lo, SPLIT, UPCAST)
                acc0, acc1, acc2, acc3 = _dots(acc0, acc1, acc2, acc3, w_hi, a0, a1, a2, a3,
                                               ok0, ok1, ok2, ok3, hi, SPLIT, UPCAST)
    else:
        for k0 in range(0, K, 8 * PIECE):
            words = _words_at(w_base, k0, n_ok)
            for i in tl.static_range(8):
                k, w = _piece_tile(words, s_base, k0, i, n_ok, stride_sg, GROUP, PIECE, DEQUANT, UPCAST)
                acc0, acc1, acc2, acc3 = _dots(acc0, acc1, acc2, acc3, w, a0, a1, a2, a3,
                                               ok0, ok1, ok2, ok3, k, SPLIT, UPCAST)
    _epilogue(acc0, out_ptr, route_w_ptr, pair0, ok0, offs_n, n_ok, pid_n, N, stride_om,
              BLOCK_N, BLOCK_M, MUL_ROUTE, GLU, UPCAST)
    _epilogue(acc1, out_ptr, route_w_ptr, pair1, ok1, offs_n, n_ok, pid_n, N, stride_om,
              BLOCK_N, BLOCK_M, MUL_ROUTE, GLU, UPCAST)
    if SPLIT > 2:
        _epilogue(acc2, out_ptr, route_w_ptr, pair2, ok2, offs_n, n_ok, pid_n, N, stride_om,
                  BLOCK_N, BLOCK_M, MUL_ROUTE, GLU, UPCAST)
    if SPLIT > 3:
        _epilogue(acc3, out_ptr, route_w_ptr, pair3, ok3, offs_n, n_ok, pid_n, N, stride_om,
                  BLOCK_N, BLOCK_M, MUL_ROUTE, GLU, UPCAST)


@triton.jit
def _silu_mul(gate, up, UPCAST: tl.constexpr):
    """bf16 silu(gate) * up as torch computes it on bf16 tensors: gate and up bf16, silu in
    fp32 rounded to bf16, the product in fp32 rounded to bf16."""
    g = gate.to(tl.float32)
    act = _to_bf16(g / (1.0 + tl.exp(-g)), UPCAST).to(tl.float32)
    return _to_bf16(act * up.to(tl.float32), UPCAST)


@triton.jit(do_not_specialize=["S"])
def glu_rows(gu_ptr, out_ptr, S, I, stride_g, stride_o, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
             UPCAST: tl.constexpr):
    """h [S, I] = silu(gu[:, :I]) * gu[:, I:] for gate_up's unfused product gu [S, 2I] bf16,
    in one pass (torch's silu and mul take three): a [BLOCK_R, BLOCK_C] tile per program."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (rows < S)[:, None] & (cols < I)[None, :]
    at = gu_ptr + rows[:, None].to(tl.int64) * stride_g + cols[None, :]
    gate = tl.load(at, mask=ok, other=0.0)
    up = tl.load(at + I, mask=ok, other=0.0)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_o + cols[None, :], _silu_mul(gate, up, UPCAST),
             mask=ok)


@triton.jit
def _glu_rows(pid_n, N, BLOCK_N: tl.constexpr):
    """GLU tile pid_n's weight rows [BN] and which are real: h columns c = pid_n * BN/2 + j,
    j < BN/2, read gate row c (first half of the tile) and up row I + c (second half),
    I = N / 2. BN 4, N 8 (I 4), tile 1: rows [2, 3, 6, 7]."""
    half: tl.constexpr = BLOCK_N // 2
    j = tl.arange(0, BLOCK_N)
    col = pid_n * half + j % half
    return tl.where(j < half, col, col + N // 2), col < N // 2


@triton.jit
def _glu_store(acc, out_ptr, pair, row_ok, pid_n, N, stride_om, BLOCK_N: tl.constexpr,
               BLOCK_M: tl.constexpr, UPCAST: tl.constexpr):
    """acc [BN, BM] fp32 (gate rows, then up rows) -> h [BN/2, BM] stored at out[pair, col],
    computed as the unfused path does: gate and up rounded to bf16, silu in fp32 rounded to
    bf16, the product in fp32 rounded to bf16 (torch's silu and mul on bf16 tensors)."""
    half: tl.constexpr = BLOCK_N // 2
    gate, up = tl.split(tl.permute(tl.reshape(acc, (2, half, BLOCK_M)), (1, 2, 0)))   # [BN/2, BM] each
    h = _silu_mul(_to_bf16(gate, UPCAST), _to_bf16(up, UPCAST), UPCAST)
    col = pid_n * half + tl.arange(0, half)
    out_ptrs = out_ptr + pair[None, :].to(tl.int64) * stride_om + col[:, None]
    tl.store(out_ptrs, h, mask=(col < N // 2)[:, None] & row_ok[None, :])

