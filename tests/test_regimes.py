"""Regimes: parsing, name matching, numerics, and in-place application."""

import pytest
import torch

from diag.errors import DiagError
from diag.int4.format import dequantize, fake_quantize
from diag.int4.scheme import KIMI_IGNORE, is_targeted, match_name
from diag.target.regimes import REGIMES, regime
from diag.target.quantize import apply_regime, fake_quantize_fp8_channel, targeted_linears
from test_int4_tiny import deepseek_config


def test_parse():
    r = regime("w4a16-g32")
    assert (r.kind, r.group_size, r.targets, r.ignore) == ("w4a16", 32, ("Linear",), ())
    assert regime("w4a16-g128:kimi").ignore == KIMI_IGNORE
    assert regime("fp8-e4m3:all-linear") == REGIMES["fp8-e4m3"]
    assert regime("fp16").dtype == torch.float16 and regime("as-loaded").kind == "as-loaded"
    with pytest.raises(DiagError, match="unknown regime"):
        regime("w4a16-g64")


@pytest.mark.parametrize("name, quantized", [
    ("model.layers.3.mlp.experts.7.up_proj", True),
    ("model.layers.3.mlp.shared_experts.up_proj", False),
    ("model.layers.0.mlp.down_proj", False),
    ("model.layers.3.self_attn.kv_b_proj", False),
    ("lm_head", False),
    ("language_model.lm_head", True),  # "lm_head" is an exact name, not a pattern
])
def test_kimi_ignore_worked_examples(name, quantized):
    assert is_targeted(name, ("Linear", "Module"), ("Linear",), KIMI_IGNORE) is quantized


def test_match_name_semantics():
    assert match_name("vision_tower.blocks.0.wo", "re:vision_tower.*")
    assert not match_name("model.vision_tower.blocks.0.wo", "re:vision_tower.*")  # anchored start
    assert match_name("a.b.c", "re:a\\.b")  # not anchored at the end
    assert not match_name("a.b.c", "a.b") and match_name("a.b", "a.b")
    assert not is_targeted("x.embed", ("Embedding", "Module"), ("Linear",), ())
    assert is_targeted("x.embed", ("Embedding", "Module"), ("re:x\\..*",), ())


def test_fp8_channel_worked_example_and_compressed_tensors():
    w = torch.tensor([[896.0, 3.3, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    out = fake_quantize_fp8_channel(w)
    assert out[0, 0] == 896.0 and out[0, 1] == 3.25 and out[0, 3] == -1.0
    assert torch.equal(out[1], torch.zeros(4))
    ct = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize as ct_fake
    from compressed_tensors.quantization.utils import calculate_qparams

    args = ct.QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="channel")
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        x = torch.randn(16, 64).to(dtype)
        scale, zp = calculate_qparams(x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True), args)
        assert torch.equal(fake_quantize_fp8_channel(x), ct_fake(x, scale, zp, args))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def _changed(before, model):
    return {n for n, p in model.state_dict().items() if not torch.equal(p, before[n])}


def test_w4a16_on_llama_changes_exactly_the_linear_weights():
    model = _llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    apply_regime(model, "w4a16-g32")
    linears = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert _changed(before, model) == linears and "lm_head.weight" in linears
    w = before["model.layers.1.mlp.down_proj.weight"]
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, fake_quantize(w, 32))
    assert "fake-quantized 15 Linear weights" in model.diag_regime_notes[0]
    with pytest.raises(DiagError, match="matches no Linear"):
        apply_regime(_llama(), "w4a16-g32:kimi")


def test_fp8_on_llama_and_casts():
    model = _llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    apply_regime(model, "fp8-e4m3")
    w = before["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, fake_quantize_fp8_channel(w))
    assert "model.embed_tokens.weight" not in _changed(before, model)
    apply_regime(model, "fp16")
    assert model.model.embed_tokens.weight.dtype == torch.float16


def _deepseek():
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(1)
    return DeepseekV3ForCausalLM(deepseek_config()).eval()


def test_kimi_scope_on_fused_experts():
    model = _deepseek()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = targeted_linears(model, regime("w4a16-g32:kimi"))
    assert len(names) == 2 * 8 * 3 and names[0] == "model.layers.1.mlp.experts.0.gate_proj"
    apply_regime(model, "w4a16-g32:kimi")
    assert _changed(before, model) == {f"model.layers.{l}.mlp.experts.{p}"
                                       for l in (1, 2) for p in ("gate_up_proj", "down_proj")}
    gu = before["model.layers.2.mlp.experts.gate_up_proj"]
    assert torch.equal(model.model.layers[2].mlp.experts.gate_up_proj, fake_quantize(gu, 32))


def test_bf16_cast_keeps_router_fp32_where_transformers_does():
    """A bf16 cast keeps in fp32 exactly what the installed transformers keeps at load
    (`_keep_in_fp32_modules_strict`: on 5.24 the router weight and its bias correction;
    5.17 declares less); everything else becomes bf16."""
    from diag.int4.skeleton import fp32_names
    model = _deepseek()
    apply_regime(model, "bf16")
    kept = fp32_names(model)
    want = torch.float32 if "gate.weight" in kept else torch.bfloat16
    assert model.model.layers[1].mlp.gate.weight.dtype == want
    bias_want = torch.float32 if "e_score_correction_bias" in kept else torch.bfloat16
    assert model.model.layers[1].mlp.gate.e_score_correction_bias.dtype == bias_want
    assert model.model.layers[1].mlp.experts.gate_up_proj.dtype == torch.bfloat16


def test_packed_experts(tmp_path):
    from diag.int4.load import load_packed_target
    from diag.int4.write import quantize_checkpoint
    from test_int4_tiny import tiny_deepseek

    src = tiny_deepseek(tmp_path / "bf16")
    model = load_packed_target(quantize_checkpoint(src, tmp_path / "g32", group_size=32))
    packed = model.model.layers[1].mlp.experts
    before = packed.gate_up_proj_packed.clone()
    apply_regime(model, "w4a16-g32:kimi")
    assert any("no-op" in n for n in model.diag_regime_notes)
    assert torch.equal(packed.gate_up_proj_packed, before)
    with pytest.raises(DiagError, match="fp8 regime on weights held as packed"):
        apply_regime(model, "fp8-e4m3:kimi")

    model = load_packed_target(quantize_checkpoint(src, tmp_path / "g16", group_size=16))
    packed = model.model.layers[2].mlp.experts
    dense16 = dequantize(packed.down_proj_packed, packed.down_proj_scale, (8, 64, 32), 16)
    apply_regime(model, "w4a16-g32:kimi")
    assert packed.group_size == 32 and packed.down_proj_scale.shape == (8, 64, 1)
    assert any("re-quantized" in n for n in model.diag_regime_notes)
    assert torch.equal(packed.expert_weight("down_proj", 3, torch.bfloat16), fake_quantize(dense16[3], 32))
