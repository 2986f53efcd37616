"""quantize_checkpoint writes what compressed-tensors writes and reads."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diag.errors import DiagError
from diag.int4.format import fake_quantize
from diag.int4.scheme import KIMI_IGNORE, quantization_config
from diag.int4.write import quantize_checkpoint
from test_int4_tiny import as_k25_wrapper, edit_tensors, tiny_deepseek, tiny_llama

pytest.importorskip("compressed_tensors")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("w")
    src = tiny_deepseek(root / "bf16")
    return src, quantize_checkpoint(src, root / "int4", group_size=32)


def test_only_routed_experts_are_packed(pair):
    src, dst = pair
    out = load_file(str(dst / "model.safetensors"))
    packed = {k.rsplit(".", 1)[0] for k in out if k.endswith("weight_packed")}
    assert packed == {f"model.layers.{l}.mlp.experts.{e}.{p}" for l in (1, 2) for e in range(8)
                      for p in ("gate_proj", "up_proj", "down_proj")}
    for kept in ("lm_head.weight", "model.layers.1.mlp.gate.weight",
                 "model.layers.1.mlp.shared_experts.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                 "model.layers.1.self_attn.q_b_proj.weight", "model.embed_tokens.weight"):
        assert torch.equal(out[kept], load_file(str(src / "model.safetensors"))[kept])
    assert not any(k.endswith("experts.0.up_proj.weight") for k in out)


def test_tensor_layout_and_values_match_compressed_tensors(pair):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    src, dst = pair
    name = "model.layers.2.mlp.experts.5.down_proj"
    w = load_file(str(src / "model.safetensors"))[f"{name}.weight"]  # [64, 32] bf16
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
    scale, _ = compute_dynamic_scales_and_zp(w, args, module=torch.nn.Module())
    ref = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale},
                                                QuantizationScheme(targets=["Linear"], weights=args))
    with safe_open(str(dst / "model.safetensors"), "pt") as f:
        assert f.get_slice(f"{name}.weight_packed").get_dtype() == "I32"
        assert f.get_slice(f"{name}.weight_scale").get_dtype() == "BF16"
        for k in ("weight_packed", "weight_scale", "weight_shape"):
            assert torch.equal(f.get_tensor(f"{name}.{k}"), ref[k]), k
    assert ref["weight_shape"].tolist() == [64, 32]


def test_config_tokenizer_and_transformers_roundtrip(pair):
    from transformers import AutoModelForCausalLM

    src, dst = pair
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["quantization_config"] == quantization_config(32, ignore=KIMI_IGNORE)
    assert cfg["quantization_config"]["quantization_status"] == "compressed"
    assert (dst / "tokenizer.json").read_text() == (src / "tokenizer.json").read_text()
    model = AutoModelForCausalLM.from_pretrained(str(dst), dtype=torch.bfloat16)  # ct dequantizes
    w = load_file(str(src / "model.safetensors"))
    experts = model.model.layers[1].mlp.experts
    assert torch.equal(experts.gate_up_proj[3, :32],
                       fake_quantize(w["model.layers.1.mlp.experts.3.gate_proj.weight"], 32))
    assert torch.equal(experts.down_proj[6], fake_quantize(w["model.layers.1.mlp.experts.6.down_proj.weight"], 32))
    assert torch.equal(model.model.layers[1].mlp.shared_experts.up_proj.weight,
                       w["model.layers.1.mlp.shared_experts.up_proj.weight"])


def test_fused_source_and_sharded_source_give_the_same_tensors(tmp_path, pair):
    src, dst = pair
    fused = tiny_deepseek(tmp_path / "fused")

    def fuse(t):
        for l in (1, 2):
            p = f"model.layers.{l}.mlp.experts"
            gate = [t.pop(f"{p}.{e}.gate_proj.weight") for e in range(8)]
            up = [t.pop(f"{p}.{e}.up_proj.weight") for e in range(8)]
            down = [t.pop(f"{p}.{e}.down_proj.weight") for e in range(8)]
            t[f"{p}.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up)])
            t[f"{p}.down_proj"] = torch.stack(down)
    edit_tensors(fused, fuse)
    out = quantize_checkpoint(fused, tmp_path / "q1")
    a, b = load_file(str(out / "model.safetensors")), load_file(str(dst / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    sharded = tiny_deepseek(tmp_path / "sh")
    t = load_file(str(sharded / "model.safetensors"))
    (sharded / "model.safetensors").unlink()
    names = sorted(t)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for f, ks in parts.items():
        save_file({k: t[k] for k in ks}, str(sharded / f), metadata={"format": "pt"})
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}))
    out = quantize_checkpoint(sharded, tmp_path / "q2")
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.layers.1.mlp.experts.0.gate_proj.weight_scale"].startswith("model-0000")
    assert set(index) == set(b)


def test_k25_wrapper_puts_config_in_both_places(tmp_path):
    src = tiny_deepseek(tmp_path / "bf16")
    as_k25_wrapper(src)
    out = quantize_checkpoint(src, tmp_path / "int4")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["text_config"]["quantization_config"]["format"] == "pack-quantized"
    assert cfg["quantization_config"] == cfg["text_config"]["quantization_config"]
    keys = load_file(str(out / "model.safetensors"))
    assert "language_model.model.layers.1.mlp.experts.0.gate_proj.weight_packed" in keys
    assert "vision_tower.encoder.blocks.0.wqkv.weight" in keys
    assert "language_model.lm_head.weight" in keys       # "lm_head" names the text model's head


def test_errors(tmp_path, pair):
    src, dst = pair
    with pytest.raises(DiagError, match="already quantized"):
        quantize_checkpoint(dst, tmp_path / "again")
    with pytest.raises(DiagError, match="group size") as err:
        quantize_checkpoint(src, tmp_path / "g64", group_size=64)  # down_proj in = 32
    assert "down_proj.weight" in str(err.value)
    with pytest.raises(DiagError, match="no Linear weight matched"):
        quantize_checkpoint(src, tmp_path / "none", ignore=("re:.*",))
    with pytest.raises(DiagError, match="overwrite"):
        quantize_checkpoint(src, src)


def test_llama_all_linear(tmp_path):
    src = tiny_llama(tmp_path / "llama")
    out = quantize_checkpoint(src, tmp_path / "q", ignore=("lm_head",))
    keys = load_file(str(out / "model.safetensors"))
    assert "model.layers.0.self_attn.q_proj.weight_packed" in keys
    assert "lm_head.weight" in keys and "model.embed_tokens.weight" in keys
    assert "model.norm.weight" in keys
