"""The row block a grouped INT4 GEMM is routed for, weighed by what its blocks cost
(fast.grouped_block_m asks it below the full block): the row blocks a uniform routing
launches at each power-of-two size, and the size whose blocks cost least in all.

Why a choice at all: a block costs more the more rows it has (each of its N tiles reads its
rows' activations again), and an expert whose pairs overflow its block takes a second block,
which reads its weights again. Worked example, 768 tokens of Kimi (6144 pairs over 384
experts, 16 an expert): 43% of the experts overflow a 16-row block, so 16 rows launch 549
blocks, 32 rows 384: 549 x 11.1 us = 6.09 ms against 384 x 12.9 us = 4.95 ms (measured on an
H200: 4.95 ms at 32). This module knows arithmetic; nothing about kernels or devices.
"""

from __future__ import annotations

import functools
import math

# The grouped kernel's device time per row block of each power-of-two size (us, both GEMMs of
# Kimi's widths, 64-row blocks at 2 stages): bench/tiles.block_costs on an H200 at fast.GROUPED's
# defaults (reports/bench/NOTES.md, twenty-seventh stop; an H100 measured 10.8, 13.5 and 33.0 at
# 16, 32 and 128 rows alike). The bench's experts section measures them on the device at hand
# into fast.GROUPED["block_costs"] for its own process.
BLOCK_COSTS = {16: 11.1, 32: 12.9, 64: 16.5, 128: 32.9}


@functools.lru_cache(maxsize=256)
def cheapest_block(pairs: int, experts: int, costs: tuple) -> int:
    """The block size r of `costs` ((rows, us a block), ...) with the least expected_blocks(pairs,
    experts, r) * cost (ties: the smaller r). The module docstring's example: 6144 pairs, 384
    experts, ((16, 11.1), (32, 12.9)) -> 32."""
    return min(costs, key=lambda rc: (expected_blocks(pairs, experts, rc[0]) * rc[1], rc[0]))[0]


def expected_blocks(pairs: int, experts: int, rows: int) -> float:
    """E[sum over experts of ceil(n_e / rows)] for `pairs` routed uniformly, each expert's count
    n_e ~ Poisson(pairs / experts): experts * sum_k P(n > k * rows), k = 0, 1, ... (the pmf in
    logs, so a mean in the thousands does not underflow). Example: 16 pairs an expert, rows
    16: P(n > 0) = 1.0, P(n > 16) = 0.43, P(n > 32) = 0.0001 -> 1.43 blocks an expert."""
    mu = pairs / experts
    if mu <= 0:
        return 0.0
    total, cdf, log_pmf, log_mu, n, k = 0.0, 0.0, -mu, math.log(mu), 0, 0
    while True:
        while n <= k * rows:                      # cdf = P(X <= k * rows)
            cdf += math.exp(log_pmf)
            n += 1
            log_pmf += log_mu - math.log(n)
        tail = max(0.0, 1.0 - cdf)
        total += tail
        if tail < 1e-9:
            return experts * total
        k += 1
