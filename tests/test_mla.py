"""The MLA drafter's attention against transformers' own DeepSeek-V3 MLA attention on the same
weights (yarn RoPE, interleaved rope dims, mscale), and its deeper draft steps against a
per-index reference built on that attention: prefix keys 0..j plus the row's own key."""

import math

import pytest
import torch

from diag.drafter.mla import MlaShape, mla_scale
from diag.drafter.model import DrafterConfig, Eagle3Drafter

H, HEADS = 16, 4
SHAPE = MlaShape(q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def config(**over) -> DrafterConfig:
    base = dict(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=HEADS, intermediate_size=24,
                vocab_size=40, draft_vocab_size=12, target_hidden_size=8, num_aux=3, rms_norm_eps=1e-6,
                rope_theta=500.0, rope_scaling=YARN, max_position_embeddings=64, attention="mla", mla=SHAPE)
    return DrafterConfig(**{**base, **over})


def drafter(cfg: DrafterConfig, seed: int = 0) -> Eagle3Drafter:
    torch.manual_seed(seed)
    d = Eagle3Drafter(cfg)
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.3)
    d.set_vocab(torch.tensor(sorted(torch.randperm(cfg.vocab_size)[:cfg.draft_vocab_size].tolist())))
    return d.eval()


def hf_attention(d: Eagle3Drafter):
    """transformers' DeepseekV3Attention built for input width 2H, holding the drafter's weights
    (its o_proj maps to H like the drafter's; transformers' low-rank norms use eps 1e-6)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    cfg = d.cfg
    hf_cfg = DeepseekV3Config(hidden_size=2 * H, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                              q_lora_rank=SHAPE.q_lora_rank, kv_lora_rank=SHAPE.kv_lora_rank,
                              qk_nope_head_dim=SHAPE.qk_nope_head_dim, qk_rope_head_dim=SHAPE.qk_rope_head_dim,
                              v_head_dim=SHAPE.v_head_dim, rope_theta=cfg.rope_theta,
                              rope_scaling=dict(cfg.rope_scaling) if cfg.rope_scaling else None,
                              max_position_embeddings=cfg.max_position_embeddings, attention_bias=False)
    hf_cfg._attn_implementation = "eager"
    attn = DeepseekV3Attention(hf_cfg, layer_idx=0).eval()
    attn.o_proj = torch.nn.Linear(HEADS * SHAPE.v_head_dim, H, bias=False)
    ours = dict(d.midlayer.self_attn.named_parameters())
    attn.load_state_dict({k: v for k, v in ours.items()}, strict=True)
    return attn, DeepseekV3RotaryEmbedding(hf_cfg)


def hf_last(attn, rope, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Causal attention over x [1, N, 2H] at `positions` [1, N]; output of the last query [H]."""
    n = x.shape[1]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    out, _ = attn(x, position_embeddings=rope(x, positions), attention_mask=mask)
    return out[0, -1]


def test_scale_worked_example():
    kimi = MlaShape(1536, 512, 128, 64, 128)
    assert mla_scale(kimi, None) == pytest.approx(192 ** -0.5)
    m = 0.1 * math.log(64) + 1
    assert mla_scale(kimi, {"type": "yarn", "factor": 64.0, "mscale_all_dim": 1.0}) == pytest.approx(
        192 ** -0.5 * m * m) == pytest.approx(0.1447, abs=1e-4)
    assert mla_scale(kimi, {"type": "yarn", "factor": 64.0}) == pytest.approx(192 ** -0.5)  # no mscale_all_dim


@pytest.mark.parametrize("scaling", [YARN, None], ids=["yarn", "plain"])
@torch.no_grad()
def test_prefix_attention_equals_transformers_deepseek_v3(scaling):
    d = drafter(config(rope_scaling=scaling))
    attn, rope = hf_attention(d)
    T = 7
    x = torch.randn(1, T, 2 * H)
    pos = torch.arange(T)[None]
    q, k, v = d.midlayer.self_attn.qkv(x, pos)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    ours = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=d.midlayer.self_attn.scale)
    ours = d.midlayer.self_attn.o_proj(ours.transpose(1, 2).flatten(-2))      # [1, T, H]
    ref, _ = attn(x, position_embeddings=rope(x, pos),
                  attention_mask=torch.full((T, T), float("-inf")).triu(1)[None, None])
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert attn.scaling == pytest.approx(d.midlayer.self_attn.scale)


def rms(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


@torch.no_grad()
def test_deep_steps_equal_per_index_reference():
    """Step 2 at index j attends to step-1 inputs 0..j (positions 0..j) and its own input at
    position j + 1: transformers' causal attention over that sequence, last query."""
    d = drafter(config(fc_norm=True, norm_output=True), seed=3)
    attn, rope = hf_attention(d)
    emb = torch.nn.Embedding(d.cfg.vocab_size, H)
    torch.nn.init.normal_(emb.weight)
    T = 6
    aux = torch.randn(1, T, d.cfg.fc_in)
    tokens = torch.randint(0, d.cfg.vocab_size, (1, T))
    teacher = torch.randint(0, d.cfg.vocab_size, (1, T, 1))
    out = d.unroll(emb, aux, tokens, 2, teacher_tokens=teacher)
    m = d.midlayer

    def layer(x_seq, pos, h):
        a = hf_last(attn, rope, x_seq, pos)
        r = a + h
        return r + m.mlp(rms(r, m.post_attention_layernorm.weight))

    chunks = aux[0].chunk(3, -1)
    h1 = d.fc(torch.cat([rms(c, n.weight) for c, n in zip(chunks, d.fc_norm)], -1))   # [T, H]
    x1 = torch.cat([rms(emb(tokens[0]), m.input_layernorm.weight), rms(h1, m.hidden_norm.weight)], -1)
    for j in range(T):
        r1 = layer(x1[None, :j + 1], torch.arange(j + 1)[None], h1[j])
        torch.testing.assert_close(out[0][0, j], d.lm_head(rms(r1, d.norm.weight)), rtol=1e-4, atol=1e-4)
        carried = rms(r1, d.norm.weight)                                    # norm_output
        x2 = torch.cat([rms(emb(teacher[0, j, 0]), m.input_layernorm.weight), rms(carried, m.hidden_norm.weight)])
        seq = torch.cat([x1[:j + 1], x2[None]])[None]
        r2 = layer(seq, torch.arange(j + 2)[None], carried)
        torch.testing.assert_close(out[1][0, j], d.lm_head(rms(r2, d.norm.weight)), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_beam_and_chain_agree_at_topk_1():
    from diag.drafter.drafting import DraftHead, DraftInputs, draft_beam, draft_chain

    d = drafter(config(), seed=5)
    emb = torch.nn.Embedding(d.cfg.vocab_size, H)
    x = DraftInputs(torch.randn(2, 8, d.cfg.fc_in), torch.randint(0, 40, (2, 8)),
                    torch.ones(2, 8, dtype=torch.bool), torch.arange(2, 8).expand(2, 6))   # indices 2..7
    chain = draft_chain(d, DraftHead(emb), x, 3)                           # [B, Q, S]
    beams = draft_beam(d, DraftHead(emb), x, 3, topk=1)
    assert torch.equal(torch.stack([b.tokens.view(2, 6) for b in beams], -1), chain)
