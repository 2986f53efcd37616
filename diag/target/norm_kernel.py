"""The Triton kernel behind diag.target.fused_norm: transformers' RMSNorm of one row per program,
in one pass (transformers' module is six kernels: the fp32 copy, pow, mean, add + rsqrt, the
product, the cast, and the weight's product).

  out[r] = w * cast(x[r] * rsqrt(sum(x[r]^2) * (1 / N) + eps))   (fp32 inside, cast to x's dtype;
                                                                 out in w's and x's promoted dtype)

Worked example, N 2, eps 0, x [3, 4] and w [1, 2] in bf16: sum 25, * 1/2 -> 12.5, rsqrt 0.28284 ->
[0.84853, 1.13137] -> bf16 [0.84766, 1.13281] -> out [0.84766, 2.26562]. Importing this module
needs Triton.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rms_norm_rows(x_ptr, w_ptr, out_ptr, N, stride_x, stride_o, inv_n, eps, BLOCK: tl.constexpr):
    """x [R, N] (rows `stride_x` apart), w [N], out [R, N] (w's dtype); BLOCK >= N, a power of two."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) * inv_n                                    # mean: the sum times 1 / N
    y = (x * tl.math.rsqrt(var + eps)).to(x_ptr.dtype.element_ty)          # hidden.to(input_dtype)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    out = (w.to(tl.float32) * y.to(tl.float32)).to(out_ptr.dtype.element_ty)   # weight * hidden
    tl.store(out_ptr + row * stride_o + offs, out, mask=ok)
