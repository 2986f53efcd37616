"""vLLM 0.34.0's rejection sampler (model runner v2: vllm/v1/worker/gpu/spec_decode/
rejection_sampler_utils.py, rejection_sample) run on the CPU, greedy requests only.

Its kernels call Triton's own @jit reductions (tl.max(..., return_indices=True)), which the
interpreter runs only when TRITON_INTERPRET=1 is set before triton is imported, so the tests
run this file in a subprocess:  TRITON_INTERPRET=1 python tests/vllm_v2_sampler.py VERSION SEED
It prints JSON: one {"draft", "argmax", "tokens"} per request, tokens = sampled[:num_sampled].
Layout it feeds (read from _rejection_kernel): request r owns logit rows cu[r]..cu[r+1]-1, one
per draft plus the bonus row; draft_sampled[row + 1] is the draft verified at `row`, and
draft_sampled[cu[r]] the request's last sampled token. Temperature 0 = greedy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vllm_wheels  # noqa: E402

UTILS = "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"


def _unused(*a, **k):
    raise AssertionError("a watermark or FLY path ran in a plain greedy verification")


def sampler(version: str):
    import triton.language.extra.libdevice as libdevice
    ns = vllm_wheels.load(version, "vllm/v1/worker/gpu/spec_decode/draft_logits.py", ["draft_logits_row"],
                          triton=True)
    ns.update(philox_gumbel_block_argmax=_unused, compute_fly_entropy=_unused, DraftLogitsCache=object,
              tldevice=libdevice)
    vllm_wheels.load_module(version, "vllm/v1/worker/gpu/sample/gumbel.py", ns)
    vllm_wheels.load_module(version, UTILS, ns)
    return ns["rejection_sample"]


def main(version: str, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    ks, vocab = [1, 3, 4, 2], 16
    rows = sum(k + 1 for k in ks)
    logits = torch.randn(rows, vocab, generator=gen)
    argmax = logits.argmax(-1)
    cu, draft_sampled, drafts = [0], [], []
    for k in ks:
        a = argmax[cu[-1]:cu[-1] + k]
        wrong = torch.rand(k, generator=gen) < 0.3
        d = torch.where(wrong, (a + 1 + torch.randint(0, vocab - 1, (k,), generator=gen)) % vocab, a)
        draft_sampled += [int(torch.randint(0, vocab, (1,), generator=gen))] + d.tolist()
        drafts.append(d.tolist())
        cu.append(cu[-1] + k + 1)
    n = len(ks)
    out, num = sampler(version)(
        logits.contiguous(), None, torch.tensor(draft_sampled), torch.tensor(cu, dtype=torch.int32),
        torch.arange(100, 100 + rows), torch.arange(n, dtype=torch.int32),
        torch.repeat_interleave(torch.arange(n, dtype=torch.int32), torch.tensor([k + 1 for k in ks])),
        torch.cat([torch.arange(k + 1, dtype=torch.int32) for k in ks]), torch.zeros(n),
        torch.zeros(n, dtype=torch.int64), max(ks))
    return [{"draft": drafts[r], "argmax": argmax[cu[r]:cu[r + 1]].tolist(),
             "tokens": out[r, :int(num[r])].tolist()} for r in range(n)]


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
