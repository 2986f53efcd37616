"""The routing of a few pairs in one Triton kernel: diag.int4.routing.routes' sorted_ids and
block_expert (the same values, a test holds them equal) from one launch of one program, where
routes() is some 30 small kernels (a stable argsort's, searchsorted's, a cumsum's, a scatter's):
at a decode round's pairs their device time is most of the routing's, once per MoE layer and
forward. Importing this module needs Triton; routing.py asks for it only on CUDA.

One program, p < S pairs in registers (SP: S's power of two):
  key     e[p] * SP + p (a pad past S: (E + 1) * SP)   sorted -> by expert, then by pair: stable
  counts  histogram of e over E + 1 bins (the sentinel's last, never a block)
  blocks  ceil(counts / BM) per expert; ends = cumsum(blocks); padded_start = (ends - blocks) * BM
  start   cumsum(counts) - counts: where each expert's run starts in the sorted order
  place   the i-th sorted pair (expert e, pair p) -> sorted_ids[padded_start[e] + i - start[e]] = p
  blocks  block_expert[b] = #{e : ends[e] <= b} (searchsorted right), -1 past the last expert: a
          mark at each expert's end, summed along the blocks
Worked example (routing.py's), BM 2, experts [1, 0, 1]: keys [4+0, 0+1, 4+2] (SP 4) -> sorted
[1, 4, 6] -> (e, p) (0, 1) (1, 0) (1, 2); counts [1, 2]; blocks [1, 1]; ends [1, 2]; padded_start
[0, 2]; start [0, 1] -> sorted_ids[0] = 1, sorted_ids[2] = 0, sorted_ids[3] = 2, the rest S:
[1, 3, 0, 2 | 3, 3 | ...]; block_expert [0, 1, -1, ...].

`padded_start`, `start` and the marks go through a scratch buffer of 2 x EP + MBP words: a
program gathers from global memory, not from its registers; the barriers order the writes before
the reads (one program, so one block: __syncthreads makes its global writes visible to all its
threads), as they order the fill of sorted_ids with S before the placing. Every size is a
power-of-two block of the one program (no loop: the sizes' few powers of two are the kernel's
few compilations; S, max_blocks and rows are not specialised on, which would compile it again for
each count's divisibility by 16 met as a loop's rows retire), and the interpreter runs it as the
GPU does.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["S", "max_blocks", "rows"])
def route_pairs(flat_ptr, sorted_ids_ptr, block_expert_ptr, scratch_ptr, S, E, max_blocks, rows,
                BM: tl.constexpr, SP: tl.constexpr, EP: tl.constexpr, ROWSP: tl.constexpr, MBP: tl.constexpr):
    p = tl.arange(0, SP)                                                          # a pair; below, a place
    e = tl.load(flat_ptr + p, mask=p < S, other=E).to(tl.int32)                 # [SP] the sentinel for pads
    order = tl.sort(tl.where(p < S, e * SP + p, (E + 1) * SP))                   # [SP] by expert, then pair
    e_i, p_i = order // SP, order % SP
    bins = tl.arange(0, EP)
    counts = tl.histogram(e, EP)                                                  # [EP] bin E: sentinel, pads
    counts = tl.where(bins < E, counts, 0)
    blocks = (counts + BM - 1) // BM
    ends = tl.cumsum(blocks, 0)
    tl.store(scratch_ptr + bins, (ends - blocks) * BM)                            # padded_start
    tl.store(scratch_ptr + EP + bins, tl.cumsum(counts, 0) - counts)              # start
    b = tl.arange(0, MBP)
    tl.store(scratch_ptr + 2 * EP + b, tl.zeros([MBP], tl.int32))                 # marks
    at = tl.arange(0, ROWSP)
    tl.store(sorted_ids_ptr + at, tl.zeros([ROWSP], tl.int32) + S, mask=at < rows)   # every row a pad first
    tl.debug_barrier()
    i = p                                                                         # [SP] a place in `order`
    routed = e_i < E                                                              # not the sentinel, no pad
    e_c = tl.minimum(e_i, E - 1)
    dest = tl.load(scratch_ptr + e_c) + i - tl.load(scratch_ptr + EP + e_c)      # + i - start[e]: its rank
    tl.store(sorted_ids_ptr + dest, p_i.to(tl.int32), mask=routed)
    tl.atomic_add(scratch_ptr + 2 * EP + ends, tl.full([EP], 1, tl.int32), mask=(bins < E) & (ends < MBP))
    tl.debug_barrier()
    expert = tl.cumsum(tl.load(scratch_ptr + 2 * EP + b), 0)                      # #{e : ends[e] <= b}
    tl.store(block_expert_ptr + b, tl.where(expert < E, expert, -1), mask=b < max_blocks)
