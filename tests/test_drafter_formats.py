"""Drafter checkpoints as users have them: shipped embed_tokens, EAGLE-3.1 options (fc_norm /
use_aux_norm, norm_before_fc, norm_output), speculators' format, the MLA drafter, the target's
lm_head; and a clear error for every variant diag does not load."""

import json

import pytest
import torch
from safetensors.torch import save_file

import diag.drafter.checkpoint as dck
from diag.drafter.checkpoint import inspect_drafter, load_drafter, save_drafter
from diag.drafter.mla import MlaShape
from diag.drafter.model import DrafterConfig, Eagle3Drafter
from diag.errors import DiagError

V, VD, H, HT = 40, 12, 16, 8
BASE = dict(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, vocab_size=V,
            draft_vocab_size=VD, target_hidden_size=HT, num_aux=3, rope_theta=500.0, max_position_embeddings=64)
MLA = MlaShape(q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)


def model(seed=0, **over) -> Eagle3Drafter:
    torch.manual_seed(seed)
    cfg = DrafterConfig(**{**BASE, **over})
    d = Eagle3Drafter(cfg)
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.3)
    if not cfg.lm_head_from_target:
        d.set_vocab(torch.tensor(sorted(torch.randperm(V)[:cfg.draft_vocab_size].tolist())))
    return d.eval()


def write(path, d, *, rename=None, config=None, extra=None, drop=()):
    """save_drafter, then rename / add / drop tensors and edit config.json."""
    save_drafter(d, path, aux_layer_ids=[1, 2, 3], dtype=torch.float32)
    from safetensors.torch import load_file
    t = load_file(str(path / "model.safetensors"))
    t = {(rename(k) if rename else k): v for k, v in t.items() if k not in drop}
    t.update(extra or {})
    save_file(t, str(path / "model.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    if config:
        res = config(cfg)                      # edits in place, or returns a whole new config
        cfg = res if isinstance(res, dict) else cfg
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def inputs(d, seed=7, T=6):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.Embedding(V, H)
    emb.weight.data = torch.randn(V, H, generator=g)
    return emb, torch.randn(1, T, d.cfg.fc_in, generator=g), torch.randint(0, V, (1, T), generator=g)


@torch.no_grad()
def same_drafts(a, b):
    emb, aux, tok = inputs(a)
    for x, y in zip(a.unroll(emb, aux, tok, 3), b.unroll(emb, aux, tok, 3)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_shipped_embed_tokens_loads(tmp_path):
    """The published drafters ship embed_tokens.weight; load_drafter used to drop it and then
    report it missing."""
    d = model()
    table = torch.randn(V, H)
    back, ckpt = load_drafter(write(tmp_path, d, extra={"embed_tokens.weight": table}))
    assert torch.equal(back.embed_tokens.weight, table)
    assert ckpt.format.options.embed_tokens is True


def test_eagle31_fc_norm_and_norm_output(tmp_path):
    """specforge-qwen3-30B-A3B-eagle3.1: top-level fc_norm and norm_output."""
    d = model(fc_norm=True, norm_output=True)
    back, ckpt = load_drafter(write(tmp_path, d))
    assert ckpt.format.variant == "eagle3.1"
    assert ckpt.format.options.fc_norm and ckpt.format.options.norm_output
    same_drafts(d, back)
    plain = model(norm_output=True)
    plain.load_state_dict({k: v for k, v in d.state_dict().items() if not k.startswith("fc_norm")})
    torch.nn.init.normal_(d.fc_norm[0].weight)
    emb, aux, tok = inputs(d)
    assert not torch.allclose(d.unroll(emb, aux, tok, 1)[0], plain.unroll(emb, aux, tok, 1)[0])


def test_legacy_use_aux_norm_names(tmp_path):
    d = model(fc_norm=True)
    legacy = {"fc_norm.0.": "aux_norm_low.", "fc_norm.1.": "aux_norm_mid.", "fc_norm.2.": "aux_norm_high."}

    def rename(k):
        return next((k.replace(a, b) for a, b in legacy.items() if k.startswith(a)), k)

    path = write(tmp_path, d, rename=rename,
                 config=lambda c: c.update(use_aux_norm=True) or c.pop("fc_norm"))
    back, ckpt = load_drafter(path)
    assert ckpt.format.options.fc_norm
    same_drafts(d, back)


def test_fc_norm_weights_without_the_flag_name_the_flag(tmp_path):
    path = write(tmp_path, model(fc_norm=True), config=lambda c: c.pop("fc_norm"))
    with pytest.raises(DiagError, match="does not enable") as err:
        inspect_drafter(path)
    assert "fc_norm.0.weight" in str(err.value) and "config flag fc_norm" in str(err.value)


def test_norm_before_fc_in_eagle_config(tmp_path):
    d = model(norm_before_fc=True)
    path = write(tmp_path, d, config=lambda c: c.pop("norm_before_fc") and c["eagle_config"].update(
        norm_before_fc=True))
    back, ckpt = load_drafter(path)
    assert ckpt.format.options.norm_before_fc
    same_drafts(d, back)


def speculators_config(d: Eagle3Drafter, layer_type="llama", **top) -> dict:
    c = d.cfg
    layer = {"model_type": layer_type, "hidden_size": H, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": c.dim_head, "intermediate_size": 24, "vocab_size": V, "num_hidden_layers": 1,
             "rms_norm_eps": 1e-6, "rope_theta": 500.0, "max_position_embeddings": 64, "hidden_act": "silu"}
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": layer, "draft_vocab_size": VD, "target_hidden_size": HT,
            "eagle_aux_hidden_state_layer_ids": [1, 2, 3], "norm_before_residual": False,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                   "verifier": {"name_or_path": "t", "architectures": ["LlamaForCausalLM"]}},
            **top}


@pytest.mark.parametrize("layer_type, residual", [("llama", False), ("llama", True), ("qwen3", True)])
def test_speculators_format(tmp_path, layer_type, residual):
    """speculators' Eagle3SpeculatorConfig: layer keys in transformer_layer_config, tensors
    under layers.0.*, embed_tokens shipped; qwen3 layers add q_norm / k_norm."""
    d = model(norm_before_residual=residual, qk_norm=layer_type == "qwen3")
    path = write(tmp_path, d, rename=lambda k: k.replace("midlayer.", "layers.0."),
                 extra={"embed_tokens.weight": torch.randn(V, H)},
                 config=lambda c: speculators_config(d, layer_type, norm_before_residual=residual))
    back, ckpt = load_drafter(path)
    f = ckpt.format
    assert (f.format, f.trainer, f.attention) == ("speculators", "speculators", "llama")
    assert f.options.norm_before_residual is residual and f.options.qk_norm is (layer_type == "qwen3")
    assert ckpt.flat["hidden_size"] == H and ckpt.flat["vocab_size"] == V
    back.embed_tokens = None
    same_drafts(d, back)


@torch.no_grad()
def test_speculators_first_layer_equals_transformers_layers():
    """Step 1 of a speculators drafter, as speculators' Eagle3FirstLayerMixin computes it with
    transformers' own Qwen3 attention (q_norm / k_norm) and norm_before_residual."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3RotaryEmbedding

    d = model(3, norm_before_residual=True, qk_norm=True)
    cfg = Qwen3Config(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=d.cfg.dim_head,
                      rope_theta=500.0, max_position_embeddings=64, rms_norm_eps=1e-6, attention_bias=False)
    cfg._attn_implementation = "eager"
    attn = Qwen3Attention(cfg, layer_idx=0).eval()
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(attn, name, torch.nn.Linear(2 * H, getattr(attn, name).out_features, bias=False))
    attn.load_state_dict({k: v for k, v in d.midlayer.self_attn.state_dict().items()}, strict=True)
    rope = Qwen3RotaryEmbedding(cfg)
    emb, aux, tok = inputs(d, T=5)
    m = d.midlayer
    h = d.fc(aux)
    x = torch.cat([m.input_layernorm(emb(tok)), m.hidden_norm(h)], -1)
    pos = torch.arange(5)[None]
    a, _ = attn(x, position_embeddings=rope(x, pos),
                attention_mask=torch.full((5, 5), float("-inf")).triu(1)[None, None])
    r = m.hidden_norm(h) + a
    r = r + m.mlp(m.post_attention_layernorm(r))
    torch.testing.assert_close(d.unroll(emb, aux, tok, 1)[0], d.lm_head(d.norm(r)), rtol=1e-5, atol=1e-5)


def test_mla_drafter_round_trip_and_fused_a_proj(tmp_path):
    d = model(attention="mla", mla=MLA, fc_norm=True, norm_output=True)
    back, ckpt = load_drafter(write(tmp_path / "a", d))
    assert (ckpt.format.architecture, ckpt.format.attention) == ("Eagle3DeepseekV2ForCausalLM", "mla")
    assert ckpt.format.variant == "eagle3.1"
    same_drafts(d, back)
    q, kv = "midlayer.self_attn.q_a_proj.weight", "midlayer.self_attn.kv_a_proj_with_mqa.weight"
    sd = d.state_dict()
    fused = {"midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight": torch.cat([sd[q], sd[kv]])}
    back, _ = load_drafter(write(tmp_path / "b", d, drop=(q, kv), extra=fused))
    same_drafts(d, back)


def test_mla_with_model_prefix_is_refused(tmp_path):
    """SGLang's MLA loader maps layers.0.* / midlayer.* only: model.-prefixed weights would be
    skipped with a warning and stay random."""
    path = write(tmp_path, model(attention="mla", mla=MLA), rename=lambda k: "model." + k)
    with pytest.raises(DiagError, match="skips model.-prefixed") as err:
        inspect_drafter(path)
    assert "model.fc.weight" in str(err.value) or "model." in str(err.value)


def test_target_lm_head_when_no_draft_vocab_size(tmp_path):
    """torchspec-kimi-k25-eagle3-mla style: no draft_vocab_size -> the full vocabulary through
    the target's lm_head; a shipped lm_head [V, H] is replaced, as SGLang's set_embed_and_head does."""
    d = model(attention="mla", mla=MLA, draft_vocab_size=V, lm_head_from_target=True)
    head = torch.nn.Linear(H, V, bias=False)
    path = write(tmp_path, d, extra={"lm_head.weight": torch.randn(V, H)})
    back, ckpt = load_drafter(path)
    assert ckpt.format.options.lm_head == "target" and ckpt.cfg.draft_vocab_size == V
    assert any("replaced by the target's lm_head" in n for n in ckpt.notes)
    emb, aux, tok = inputs(back)
    with pytest.raises(RuntimeError, match="use_target_head"):
        back.unroll(emb, aux, tok, 1)
    back.use_target_head(head)
    d.use_target_head(head)
    same_drafts(d, back)
    assert torch.equal(back.to_target_ids(torch.arange(V)), torch.arange(V))   # identity d2t


def test_inspect_reads_no_tensor(tmp_path, monkeypatch):
    path = write(tmp_path, model(fc_norm=True))

    def refuse(*a, **k):
        raise AssertionError("a tensor was read")

    monkeypatch.setattr(dck, "safe_open", refuse)
    ckpt = inspect_drafter(path)
    assert ckpt.cfg.fc_norm and ckpt.cfg.num_aux == 3


@pytest.mark.parametrize("edit, message, field", [
    (lambda c: c.update(architectures=["DeepseekV3ForCausalLMNextN"]), "not an EAGLE-3 drafter", "architectures"),
    (lambda c: c.update(architectures=["LlamaForCausalLM"]), "not an EAGLE-3 drafter", "architectures"),
    (lambda c: c.update(num_hidden_layers=2), "one-layer", "num_hidden_layers"),
    (lambda c: c.update(tie_word_embeddings=True), "embedding table", "tie_word_embeddings"),
    (lambda c: c.update(hidden_act="gelu"), "activation", "hidden_act"),
    (lambda c: c.update(speculators_model_type="eagle", transformer_layer_config={}), "speculators model type",
     "speculators_model_type"),
])
def test_unsupported_variants_name_the_field(tmp_path, edit, message, field):
    path = write(tmp_path, model(), config=edit)
    with pytest.raises(DiagError, match=message) as err:
        inspect_drafter(path)
    assert err.value.field == field and "config.json" in err.value.file


def test_mla_needs_q_lora_rank_and_refuses_norm_before_fc(tmp_path):
    path = write(tmp_path / "a", model(attention="mla", mla=MLA), config=lambda c: c.pop("q_lora_rank"))
    with pytest.raises(DiagError, match="q_lora_rank"):
        inspect_drafter(path)
    path = write(tmp_path / "b", model(attention="mla", mla=MLA), config=lambda c: c.update(norm_before_fc=True))
    with pytest.raises(DiagError, match="norm_before_fc"):
        inspect_drafter(path)


def test_missing_d2t_with_a_draft_vocabulary(tmp_path):
    with pytest.raises(DiagError, match="no d2t") as err:
        inspect_drafter(write(tmp_path, model(), drop=("d2t", "t2d")))
    assert err.value.field == "d2t"
