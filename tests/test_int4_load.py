"""load_packed_target: same outputs as transformers + compressed-tensors,
packed residency, and clear errors for broken checkpoints."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from diag.errors import DiagError
from diag.int4.load import load_packed_target
from diag.int4.packed import PackedExperts, PackedLinear, resident_bytes
from diag.int4.scheme import KIMI_K25_IGNORE
from diag.checkpoint.headers import tensor_infos
from diag.int4.write import quantize_checkpoint
from test_int4_tiny import as_k25_wrapper, edit_config, edit_tensors, tiny_deepseek, tiny_llama

pytest.importorskip("compressed_tensors")
IDS = torch.tensor([[5, 17, 99, 3, 200, 41, 7, 7, 130, 64, 2, 250]])


@pytest.fixture(scope="module")
def int4(tmp_path_factory):
    root = tmp_path_factory.mktemp("l")
    return quantize_checkpoint(tiny_deepseek(root / "bf16"), root / "int4", group_size=32)


@pytest.fixture
def copy(int4, tmp_path):
    return shutil.copytree(int4, tmp_path / "c")


def _run(model):
    with torch.no_grad():
        out = model(IDS, output_hidden_states=True)
    return out.hidden_states, out.logits


def _reference(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    model.config._experts_implementation = "eager"  # the loop PackedExperts mirrors
    return model


def test_matches_transformers_compressed_tensors(int4):
    ours = load_packed_target(int4)
    assert isinstance(ours.model.layers[1].mlp.experts, PackedExperts)
    assert ours.model.layers[1].mlp.gate.weight.dtype == torch.float32  # kept fp32, as transformers
    (h1, l1), (h2, l2) = _run(ours), _run(_reference(int4))
    assert len(h1) == len(h2) == 4
    for a, b in zip(h1, h2):
        torch.testing.assert_close(a, b, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(l1, l2, rtol=1.6e-2, atol=1e-2)
    assert torch.equal(l1.argmax(-1), l2.argmax(-1))


def test_resident_bytes_close_to_checkpoint(int4):
    model = load_packed_target(int4)
    tensor_bytes = sum(t.numel() * t.element_size() for t in load_file(str(int4 / "model.safetensors")).values())
    assert resident_bytes(model) <= 1.15 * tensor_bytes
    dense = load_packed_target(int4, dtype=torch.float32)
    assert resident_bytes(dense) > resident_bytes(model)  # sanity: the bound is not vacuous


def test_kimi_k2_model_type_loads_as_deepseek_without_remote_code(int4, copy):
    edit_config(copy, lambda c: c.update(model_type="kimi_k2", auto_map={
        "AutoModelForCausalLM": "modeling_missing.DeepseekV3ForCausalLM"}))
    model = load_packed_target(copy)
    assert any("kimi_k2" in n for n in model.diag_load_notes)
    assert torch.equal(_run(model)[1], _run(load_packed_target(int4))[1])


def test_k25_wrapper_loads_text_only(int4, copy):
    """Kimi-K2.5 as published: text weights under `language_model.`, the quantization_config at
    the top level and in text_config, with a plain "lm_head" ignore entry that names the text
    model's lm_head (stored dense as `language_model.lm_head.weight`)."""
    as_k25_wrapper(copy)
    cfg = json.loads((copy / "config.json").read_text())
    assert cfg["quantization_config"] == cfg["text_config"]["quantization_config"]
    assert "lm_head" in cfg["quantization_config"]["ignore"]
    model = load_packed_target(copy)
    assert any("text model only" in n for n in model.diag_load_notes)
    assert not isinstance(model.lm_head, PackedLinear)
    assert torch.equal(_run(model)[1], _run(load_packed_target(int4))[1])


def test_k25_copies_must_agree(copy):
    as_k25_wrapper(copy)
    edit_config(copy, lambda c: c["quantization_config"].update(ignore=["lm_head"]))
    with pytest.raises(DiagError, match="copies of the wrapper disagree") as err:
        load_packed_target(copy)
    assert "quantization_config.ignore vs text_config.quantization_config.ignore" in str(err.value)


def test_k25_rawstyle_rope_scaling_yarn_loads(int4, copy):
    """The raw file spells the text model_type `kimi_k2` and RoPE as `rope_scaling` (type
    yarn): real-configs/kimi-k2.5-rawstyle."""
    as_k25_wrapper(copy)
    yarn = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 64, "type": "yarn"}
    edit_config(copy, lambda c: c["text_config"].update(rope_scaling=yarn))
    model = load_packed_target(copy)
    assert model.config.rope_parameters["rope_type"] == "yarn"
    assert model.config.rope_parameters["factor"] == 4.0


def test_k25_quantized_vision_missing_from_ignore(copy):
    as_k25_wrapper(copy, quantize_vision=True)
    edit_config(copy, lambda c: c["text_config"]["quantization_config"].update(
        ignore=[i for i in KIMI_K25_IGNORE if "vision" not in i]))
    edit_config(copy, lambda c: c.update(quantization_config=c["text_config"]["quantization_config"]))
    with pytest.raises(DiagError, match="missing from the ignore list") as err:
        load_packed_target(copy)
    assert "vision_tower.encoder.blocks.0.wo.weight_packed" in str(err.value)


def test_llama_all_linear_packed(tmp_path):
    src = tiny_llama(tmp_path / "llama")
    dst = quantize_checkpoint(src, tmp_path / "q", ignore=("lm_head",))
    model = load_packed_target(dst)
    assert isinstance(model.model.layers[0].self_attn.q_proj, PackedLinear)
    assert not isinstance(model.lm_head, PackedLinear)
    torch.testing.assert_close(_run(model)[1], _run(_reference(dst))[1], rtol=1.6e-2, atol=1e-2)


def _drop(key):
    return lambda t: [t.pop(key)] and None


EXPERT = "model.layers.2.mlp.experts.4.up_proj"


@pytest.mark.parametrize("edit, message, field", [
    (_drop(f"{EXPERT}.weight_packed"), "missing from the checkpoint", f"{EXPERT}.weight_packed"),
    (_drop(f"{EXPERT}.weight_scale"), "no weight_scale", f"{EXPERT}.weight_scale"),
    (_drop("model.layers.1.mlp.gate.e_score_correction_bias"), "missing", "e_score_correction_bias"),
    (lambda t: t.update({"model.layers.1.extra.weight": torch.zeros(2)}), "no place for",
     "model.layers.1.extra.weight"),
    (lambda t: t.update({f"{EXPERT}.weight_shape": torch.tensor([32, 32])}), "weight_shape",
     f"{EXPERT}.weight_shape"),
    (lambda t: t.update({f"{EXPERT}.weight_scale": torch.ones(32, 4, dtype=torch.bfloat16)}),
     "wrong shape", f"{EXPERT}.weight_scale"),
])
def test_broken_tensors(copy, edit, message, field):
    edit_tensors(copy, edit)
    with pytest.raises(DiagError, match=message) as err:
        load_packed_target(copy)
    assert field in str(err.value) and str(copy) in str(err.value)


def test_group_size_must_divide_width(copy):
    edit_config(copy, lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(
        group_size=64))
    with pytest.raises(DiagError, match="group size"):
        load_packed_target(copy)


def test_corrupt_header_and_truncated_shard(copy):
    f = copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 100])
    with pytest.raises(DiagError, match="truncated") as err:
        load_packed_target(copy)
    assert str(f) in str(err.value)
    f.write_bytes(b"\xff" * 8 + data[8:])
    with pytest.raises(DiagError, match="corrupt safetensors header"):
        load_packed_target(copy)
    f.write_bytes(data[:8] + b"{not json" + data[17:])
    with pytest.raises(DiagError, match="corrupt safetensors header"):
        tensor_infos(copy)


def test_sharded_checkpoint(int4, copy):
    from safetensors.torch import save_file

    t = load_file(str(copy / "model.safetensors"))
    (copy / "model.safetensors").unlink()
    names = sorted(t)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for f, ks in parts.items():
        save_file({k: t[k] for k in ks}, str(copy / f), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(_run(load_packed_target(copy))[1], _run(load_packed_target(int4))[1])
    (copy / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DiagError, match="shard named by the index is missing"):
        load_packed_target(copy)


def test_unquantized_checkpoint_is_refused(tmp_path):
    with pytest.raises(DiagError, match="no quantization_config"):
        load_packed_target(tiny_llama(tmp_path / "plain"))
