"""MLA over its latent cache (diag.target.mla_latent) computes what transformers' expanded MLA
computes, on a Kimi-shaped INT4 target (DeepseekV3, yarn RoPE, interleaved rope weights) in
float32: a prefill and a tree verify through diag's own forwards (growing and fixed widths),
greedy generation (2D masks), and the decode loop; the switch restores the model, ignores
what is not MLA, and reads DIAG_MLA_LATENT."""

import pytest
import torch

from diag.bench.cpu import SMALL
from diag.bench.sampled import bench_loop, bench_prompts
from diag.engines.decoding import sampled
from diag.errors import DiagError
from diag.layouts import CapturePoint
from diag.target.generate import greedy_continuations
from diag.target.mla_latent import NAME, latent_attention, latent_mla, latent_wanted
from diag.target.tree_forward import prefill, verify_forward
from diag.trees import tree_shape

TREE = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 3])


def _verify(model, latent: bool, fixed: bool):
    g = torch.Generator().manual_seed(3)
    B, P, D = 3, 9, len(TREE)
    ids = torch.randint(5, SMALL["vocab_size"], (B, P), generator=g)
    valid = torch.ones(B, P, dtype=torch.bool)
    valid[1, 6:] = False                                      # a shorter row: dead slots after it
    points = (CapturePoint("L1"), CapturePoint("final"))
    with latent_mla(model, latent) as switched:
        kv, first = prefill(model, ids, valid, points, capacity=P + 2 * D)
        tokens = torch.randint(5, SMALL["vocab_size"], (B, D), generator=g)
        scored = verify_forward(model, kv, tokens, TREE.expand(B, D), torch.ones(B, D, dtype=torch.bool),
                                valid.sum(-1) - 1, points, fixed=fixed)
        logits = scored.logits.rows(torch.arange(B * D))
    return switched, first, scored.states, logits


@pytest.mark.parametrize("fixed", [False, True], ids=["growing", "fixed-width"])
def test_a_verify_over_the_latents_scores_what_the_expanded_keys_score(kimi_cpu, fixed):
    _, model, _ = kimi_cpu
    n0, first0, states0, logits0 = _verify(model, False, fixed)
    n1, first1, states1, logits1 = _verify(model, True, fixed)
    assert n0 == 0 and n1 == model.config.num_hidden_layers
    torch.testing.assert_close(first1.logits, first0.logits, rtol=1e-4, atol=1e-4)
    for name in states0:
        torch.testing.assert_close(states1[name], states0[name], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits1, logits0, rtol=1e-4, atol=1e-4)
    assert (logits1 - logits0).abs().max() > 0          # another order of sums: not the same code run twice


def test_generation_over_the_latents_continues_as_transformers_does(kimi_cpu, monkeypatch):
    _, model, _ = kimi_cpu
    prompts = bench_prompts(6, 7, SMALL["vocab_size"], seed=2)
    prompts[1] = prompts[1][:4]                               # left padding: a 2D mask with holes
    got = {}
    for value in ("0", "1"):
        monkeypatch.setenv("DIAG_MLA_LATENT", value)
        got[value] = greedy_continuations(model, prompts, 10, pad_id=0, eos_ids=set(), progress=False)
    assert got["1"] == got["0"]


def test_the_decode_loop_over_the_latents_decodes_what_it_did(kimi_cpu, monkeypatch):
    ks, model, drafter = kimi_cpu
    prompts = bench_prompts(8, 10, SMALL["vocab_size"], seed=4)
    out = {}
    for value in ("0", "1"):
        monkeypatch.setenv("DIAG_MLA_LATENT", value)
        loop, _, rows = bench_loop(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(),
                                   [ks.layout, "L1+L2+final"], tree_shape("s3-k4-d8"), len(prompts),
                                   decoding=sampled(1e-7))
        decoded = loop.run(prompts, rows, 12)
        out[value] = ([d.ids for d in decoded], [d.accepted for d in decoded], loop.counts["mla_latent_layers"])
    assert out["1"][:2] == out["0"][:2]
    assert (out["0"][2], out["1"][2]) == (0, model.config.num_hidden_layers)


def test_the_switch_restores_the_model_and_leaves_other_models_alone(kimi_cpu):
    _, model, drafter = kimi_cpu
    attn = model.model.layers[0].self_attn
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="inside"):
        with latent_mla(model) as n:
            assert n == 2 and model.config._attn_implementation == NAME and "expand_kv" in vars(attn)
            raise RuntimeError("inside")
    assert model.config._attn_implementation == before and "expand_kv" not in vars(attn)
    with latent_mla(drafter) as n:                            # a Llama-style drafter: no MLA
        assert n == 0
    from transformers import AttentionInterface
    AttentionInterface.register("someone_elses", AttentionInterface._global_mapping["sdpa"])
    model.config._attn_implementation = "someone_elses"       # an engine's attention (engine_numerics) is kept
    try:
        with latent_mla(model) as n:
            assert n == 0 and model.config._attn_implementation == "someone_elses"
    finally:
        model.config._attn_implementation = before


def test_layers_it_cannot_absorb_keep_transformers_path(kimi_cpu):
    """A quantised kv_b_proj (not a float Linear) and one offloaded to the meta device by a device
    map (its weights arrive with its own forward, which the latent path never calls) stay expanded."""
    import copy

    from diag.target.mla_latent import _absorbable

    _, model, _ = kimi_cpu
    attn = copy.deepcopy(model.model.layers[0].self_attn)
    assert _absorbable(attn)
    attn.kv_b_proj.weight = torch.nn.Parameter(attn.kv_b_proj.weight.to("meta"))
    assert not _absorbable(attn)
    attn.kv_b_proj = torch.nn.Identity()
    assert not _absorbable(attn)


def test_without_a_mask_the_last_queries_attend_causally(kimi_cpu):
    """latent_attention given no mask (Q > 1): query i of the last Q sees slots up to L - Q + i,
    as the same call given that causal bias."""
    _, model, _ = kimi_cpu
    attn = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(1)
    B, H, Q, L = 2, attn.num_heads, 3, 7
    q = torch.randn(B, H, Q, attn.qk_nope_head_dim + attn.qk_rope_head_dim, generator=g)
    k_rot = torch.randn(B, 1, L, attn.qk_rope_head_dim, generator=g)
    c = torch.randn(B, 1, L, SMALL["kv_lora_rank"], generator=g)
    see = torch.arange(L)[None] <= torch.arange(Q)[:, None] + (L - Q)
    bias = torch.zeros(Q, L).masked_fill(~see, torch.finfo(torch.float32).min)[None, None].expand(B, 1, Q, L)
    with torch.no_grad():
        a, _ = latent_attention(attn, q, k_rot, c, None, attn.scaling)
        b, _ = latent_attention(attn, q, k_rot, c, bias, attn.scaling)
    torch.testing.assert_close(a, b)


def test_the_switch_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("DIAG_MLA_LATENT", raising=False)
    assert latent_wanted("cpu") is False and latent_wanted("cuda") is True
    monkeypatch.setenv("DIAG_MLA_LATENT", "1")
    assert latent_wanted("cpu") is True
    monkeypatch.setenv("DIAG_MLA_LATENT", "absorbed")
    with pytest.raises(DiagError, match="DIAG_MLA_LATENT"):
        latent_wanted("cpu")


def test_the_step_cost_probe_runs_over_the_latents(kimi_cpu, monkeypatch):
    """The probe (diagnoses/pricing/costs.py) times forwards with no mask of diag's own (transformers
    builds it, through the mask function registered with the latent attention)."""
    from diag.diagnoses.pricing.costs import measure_costs

    _, model, drafter = kimi_cpu
    monkeypatch.setenv("DIAG_MLA_LATENT", "1")
    costs = measure_costs(model, drafter, model.get_input_embeddings(), [1, 4], context=16, repeats=2)
    assert model.config._attn_implementation != NAME
    assert costs.costs.t_decode > 0 and sorted(costs.costs.t_verify) == [1, 4]


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "shared", "none"])
def test_heads_folded_into_the_queries_attend_as_each_head_does(mask_kind):
    """fold_heads: one head of H x Q queries against the one latent key head gives each head's
    own attention (the slots read once a row, not once a head). Worked example of the layout:
    H 2, Q 3 -> query rows (h0 q0, h0 q1, h0 q2, h1 q0, h1 q1, h1 q2); a mask row i of head h
    is row h * Q + i. Masks: a per-row boolean one, an additive bias, one shared by the rows
    [1, 1, Q, L], none."""
    from diag.target.mla_latent import fold_heads

    g = torch.Generator().manual_seed(0)
    B, H, Q, L, d, dv = 2, 3, 4, 7, 5, 6
    q, k, v = torch.randn(B, H, Q, d, generator=g), torch.randn(B, 1, L, d, generator=g), torch.randn(B, 1, L, dv, generator=g)
    see = torch.rand(B, 1, Q, L, generator=g) < 0.6
    see[..., 0] = True                                              # every query sees a slot
    mask = {"bool": see, "additive": torch.where(see, 0.0, -1e9), "shared": see[:1], "none": None}[mask_kind]
    want = torch.nn.functional.scaled_dot_product_attention(q, k.expand(B, H, L, d), v.expand(B, H, L, dv),
                                                            attn_mask=mask)
    fq, fmask = fold_heads(q, mask, L)
    assert fq.shape == (B, 1, H * Q, d) and torch.equal(fq[:, 0, 1 * Q + 2], q[:, 1, 2])
    if mask is not None:
        assert fmask.shape == (B, 1, H * Q, L) and torch.equal(fmask[:, 0, 2 * Q + 1], mask.expand(B, H, Q, L)[:, 2, 1])
    got = torch.nn.functional.scaled_dot_product_attention(fq, k, v, attn_mask=fmask).view(B, H, Q, dv)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("Q", [1, 16, 64, 65, 200])
def test_latent_attention_folds_the_heads_of_decode_shapes_only(Q, monkeypatch):
    """latent_attention folds the heads into the queries up to FOLD_MAX_QUERIES (64) queries a head
    (a decode step, a draft, a tree verify); a prefill's longer queries attend unfolded (the folded
    mask would be an H x Q x L copy a row). Both give the expanded attention's output."""
    import diag.target.mla_latent as ml

    class Attn(torch.nn.Module):
        num_heads, qk_nope_head_dim, v_head_dim, qk_rope_head_dim, scaling = 3, 4, 5, 2, 0.3

        def __init__(self):
            super().__init__()
            self.kv_b_proj = torch.nn.Linear(6, 3 * (4 + 5), bias=False)
    g = torch.Generator().manual_seed(Q)
    m, B, L = Attn(), 2, Q + 5
    query = torch.randn(B, 3, Q, 4 + 2, generator=g)
    k_rot, c = torch.randn(B, 1, L, 2, generator=g), torch.randn(B, 1, L, 6, generator=g)
    bias = torch.where(torch.rand(B, 1, Q, L, generator=g) < 0.3, -1e9, 0.0)
    bias[..., 0] = 0.0
    folds = []
    real = ml.fold_heads
    monkeypatch.setattr(ml, "fold_heads", lambda *a: folds.append(a[0].shape) or real(*a))
    out, _ = ml.latent_attention(m, query, k_rot, c, bias)
    assert (len(folds) == 1) == (Q <= ml.FOLD_MAX_QUERIES)
    w = m.kv_b_proj.weight.view(3, 9, 6)
    keys = torch.cat([torch.einsum("hnc,blc->bhln", w[:, :4], c[:, 0]), k_rot.expand(B, 3, L, 2)], -1)
    vals = torch.einsum("hvc,blc->bhlv", w[:, 4:], c[:, 0])
    want = torch.nn.functional.scaled_dot_product_attention(query, keys, vals, attn_mask=bias, scale=0.3)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_a_decode_steps_attention_as_two_matmuls_is_torchs_attention(dtype, mask_kind):
    """one_query_attention (latent_attention's path for one query a head): fp32 scores, the mask,
    fp32 softmax, the probabilities in v's dtype times v; against torch's attention on the same
    folded inputs: float32 to 1e-6, bf16 to its rounding of the probabilities."""
    from diag.target.mla_latent import one_query_attention

    g = torch.Generator().manual_seed(1)
    B, H, L, d, dv = 3, 8, 11, 20, 16
    q = torch.randn(B, 1, H, d, generator=g).to(dtype)
    k, v = torch.randn(B, 1, L, d, generator=g).to(dtype), torch.randn(B, 1, L, dv, generator=g).to(dtype)
    see = torch.rand(B, 1, 1, L, generator=g) < 0.7
    see[..., -1] = True
    mask = {"bool": see, "additive": torch.where(see, 0.0, torch.finfo(dtype).min).to(dtype), "none": None}[mask_kind]
    got = one_query_attention(q, k, v, mask, 0.25)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                            attn_mask=mask if mask is None or mask.dtype == torch.bool
                                                            else mask.float(), scale=0.25)
    assert got.shape == (B, 1, H, dv) and got.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got.float(), want, **tol)
