"""routing_kernel.route_pairs under Triton's interpreter against routes()' torch ops, case by
case; run by tests/test_routing.py in a subprocess, for TRITON_INTERPRET must be set before
Triton is imported:  TRITON_INTERPRET=1 python tests/routing_interpreted.py CASES SEED
Prints one JSON line: {"cases": n, "mismatches": [...]}."""

import json
import sys

import torch

from diag.int4.routing import kernel_route, torch_routes

# (E, T, K, block_m, sentinel: False, True (some pairs another shard's) or "all"): the edges first:
# one pair; the sentinel only; Kimi's 384 experts at a decode round's 64 tokens; a shard's 48 with
# the sentinel; a split GEMM's 192-row blocks
EDGES = [(1, 1, 1, 1, False), (3, 2, 2, 2, "all"), (384, 64, 8, 16, False), (48, 64, 8, 16, True),
         (4, 40, 8, 192, False), (9, 40, 3, 4, True)]


def case(gen, n: int) -> tuple:
    if n < len(EDGES):
        return EDGES[n]
    pick = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))   # noqa: E731
    return pick(1, 70), pick(1, 80), pick(1, 9), [1, 2, 4, 16, 32, 64][n % 6], bool(n % 2)


def main(cases: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    bad = []
    for n in range(cases):
        E, T, K, bm, sentinel = case(gen, n)
        idx = torch.randint(0, E + bool(sentinel), (T, K), generator=gen)
        if sentinel == "all":
            idx.fill_(E)                                            # every pair another shard's
        want, got = torch_routes(idx, E, (bm,))[bm], kernel_route(idx, E, bm)
        if not (torch.equal(want.sorted_ids, got.sorted_ids) and torch.equal(want.block_expert, got.block_expert)):
            bad.append({"E": E, "T": T, "K": K, "block_m": bm, "want": want.sorted_ids.tolist()[:32],
                        "got": got.sorted_ids.tolist()[:32]})
    return {"cases": cases, "mismatches": bad}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
