"""vLLM's model-runner-v1 rejection sampler (vllm/v1/sample/rejection_sampler.py: its greedy,
random and recovered-token kernels) run on the CPU for 12 seeded requests, greedy and sampled.

Its kernels call Triton's own @jit reductions (tl.max, tl.argmax), which the interpreter runs
only when TRITON_INTERPRET=1 is set before triton is first imported; in a pytest session
another test may have imported triton without it (diag's int4 kernels), so the tests run this
file in a subprocess:  TRITON_INTERPRET=1 python tests/vllm_v1_sampler.py VERSION
It prints JSON: one {"draft", "probs", "bonus", "u", "e", "greedy", "sampled"} per trial, the
inputs exactly (floats round-trip through JSON) and vLLM's output rows without placeholders.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import vllm_wheels  # noqa: E402

V1_SAMPLER = "vllm/v1/sample/rejection_sampler.py"
KERNELS = ["rejection_greedy_sample_kernel", "rejection_random_sample_kernel", "sample_recovered_tokens_kernel"]


def _kernel_args(kernel, known: dict) -> dict:
    missing = [a for a in kernel.arg_names if a not in known]
    assert not missing, f"{kernel.fn.__name__} has parameters diag does not feed: {missing} (a rule change?)"
    return {a: known[a] for a in kernel.arg_names}


def run_chain(ns, draft, probs, bonus, u, e, greedy) -> tuple[int, ...]:
    """One request through vLLM's kernels: its output row without placeholders."""
    k, vocab = probs.shape[0], probs.shape[1]
    out = torch.full((1, k + 1), -1, dtype=torch.int32)
    common = dict(output_token_ids_ptr=out, cu_num_draft_tokens_ptr=torch.tensor([k], dtype=torch.int32),
                  draft_token_ids_ptr=draft.to(torch.int32), bonus_token_ids_ptr=torch.tensor([bonus]),
                  max_spec_len=k, uniform_probs_ptr=u, synthetic_conditional_rates_ptr=None,
                  SYNTHETIC_MODE=False, draft_probs_ptr=None, NO_DRAFT_PROBS=True, vocab_size=vocab,
                  target_probs_ptr=probs, IS_NGRAM=True)
    if greedy:
        kern = ns["rejection_greedy_sample_kernel"]
        kern[(1,)](**_kernel_args(kern, {**common, "target_argmax_ptr": probs.argmax(-1), "is_greedy_ptr": None}))
    else:
        rec = torch.empty(k, dtype=torch.int32)
        kr = ns["sample_recovered_tokens_kernel"]
        kr[(1, k)](**_kernel_args(kr, {**common, "output_token_ids_ptr": rec, "q_ptr": e[None],
                                      "inv_q_ptr": (1.0 / e)[None], "PADDED_VOCAB_SIZE": 8, "BLOCK_SIZE": 8,
                                      "USE_FP64_GUMBEL": False}))
        kern = ns["rejection_random_sample_kernel"]
        kern[(1,)](**_kernel_args(kern, {**common, "recovered_token_ids_ptr": rec,
                                         "is_greedy_ptr": torch.tensor([False])}))
    return tuple(int(t) for t in out[0] if t >= 0)


def trials(version: str) -> list[dict]:
    ns = vllm_wheels.load(version, V1_SAMPLER, KERNELS, triton=True)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for trial in range(12):
        k, vocab = 1 + trial % 4, 8
        probs = torch.softmax(torch.randn(k, vocab, generator=gen) * 2, -1).contiguous()
        draft = torch.where(torch.rand(k, generator=gen) < 0.7, probs.argmax(-1),
                            torch.randint(0, vocab, (k,), generator=gen))
        bonus, u = 7, torch.rand(k, generator=gen, dtype=torch.float64)
        e = torch.empty(vocab).exponential_(generator=gen)
        rows.append({"draft": draft.tolist(), "probs": probs.tolist(), "bonus": bonus, "u": u.tolist(),
                     "e": e.tolist(), "greedy": run_chain(ns, draft, probs, bonus, u, e, True),
                     "sampled": run_chain(ns, draft, probs, bonus, u, e, False)})
    return rows


if __name__ == "__main__":
    print(json.dumps(trials(sys.argv[1])))
