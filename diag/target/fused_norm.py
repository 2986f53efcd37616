"""transformers' RMSNorm in one kernel on CUDA, for the steps that replay a few rows at a time.

A decode step or a verify of a few rows runs each RMSNorm of the target (4 a DeepSeek-V3 layer:
the input's, the attention output's, MLA's q_a and kv_a latents') as transformers writes it: the
fp32 copy, pow, mean, rsqrt, two products and a cast, each a kernel of a few microseconds, some
70 us a layer a step on the H100 (reports/bench/NOTES.md, twenty-sixth stop), where the row's
bytes take well under one. `fused_norms(model)` switches every RMSNorm of transformers' form (a
`weight` and a `variance_epsilon`, the forward above) to norm_kernel.rms_norm_rows for the
duration of a block, on CUDA with Triton, for inputs of a float dtype whose rows fit one program
(N <= MAX_WIDTH); elsewhere, and for any other input, transformers' forward runs.

Numerics: the same operations in the same dtypes (fp32 inside, the normed row cast to the input's
dtype, then the weight's product), the mean as the sum times 1 / N as torch's; the sum of squares
in another order than torch's reduction, so a row's variance may differ in its last fp32 bit and an
output by one bf16 step where that moves a rounding (the CUDA test bounds it). Where: the greedy
generation (target/generate.py) and the decode loop (replay/decode_loop.py), beside
`latent_mla`; DIAG_FUSED_NORM=0 turns it off. This module knows transformers' RMSNorm; nothing
about layers, drafters or files.
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch import nn

from diag.errors import env_switch

MAX_WIDTH = 16384           # a row's width up to which one program holds it (Kimi's hidden 7168)


def fused_wanted(dev) -> bool:
    """DIAG_FUSED_NORM "1" or "0" where set, else on CUDA where Triton imports."""
    value = env_switch("DIAG_FUSED_NORM")
    if value is not None:
        return value
    if torch.device(dev).type != "cuda":
        return False
    try:
        import diag.target.norm_kernel  # noqa: F401
    except ImportError:
        return False
    return True


def _norms(model: nn.Module) -> list[nn.Module]:
    """transformers' RMSNorms of `model`: a weight, a variance_epsilon and an *RMSNorm class."""
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon")
            and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 1]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., N] -> [..., N] in weight's and x's promoted dtype (transformers' weight * normed), by
    norm_kernel.rms_norm_rows (module docstring)."""
    from diag.target.norm_kernel import rms_norm_rows
    import triton

    N = x.shape[-1]
    rows = x.reshape(-1, N)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(N)
        # Triton launches on the current device, not the tensors': on N GPUs a layer on cuda:k may
        # run while cuda:0 is current (as int4/fast.FastPackedExperts.forward), so it is made current
        with torch.cuda.device(x.device):
            rms_norm_rows[(rows.shape[0],)](rows, weight, out, N, rows.stride(0), out.stride(0), 1.0 / N, eps,
                                            BLOCK=block, num_warps=min(16, max(1, block // 512)))
    return out.view(x.shape)


def _fused_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if (hidden_states.is_cuda and hidden_states.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and w.device == hidden_states.device and hidden_states.shape[-1] == w.shape[0] <= MAX_WIDTH):
        return rms_norm(hidden_states, w, self.variance_epsilon)
    return type(self).forward(self, hidden_states)


@contextlib.contextmanager
def fused_norms(model: nn.Module, on: bool = True):
    """Inside the block, the model's RMSNorms run norm_kernel's (module docstring); yields how many
    were switched (0 where `on` is False or the model has none; a block inside another switches
    none again). Restored after."""
    norms = [m for m in _norms(model) if "forward" not in vars(m)] if on else []     # not one switched already
    for m in norms:
        m.forward = types.MethodType(_fused_forward, m)
    try:
        yield len(norms)
    finally:
        for m in norms:
            del m.forward
