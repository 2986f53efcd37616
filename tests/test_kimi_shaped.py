"""Kimi-shaped checkpoints: the real-width config without weights, and a K=2 checkpoint with
shrunk widths written, checked tensor by tensor and loaded by diag's own loaders."""

import json

import pytest
import torch
from safetensors import safe_open

from diag.drafter.checkpoint import load_drafter
from diag.errors import DiagError
from diag.int4.format import dequantize
from diag.int4.load import load_packed_target
from diag.int4.packed import PackedExperts, resident_bytes
from diag.zoo.kimi_shaped import drafter_layout, kimi_config, kimi_shaped, packed_layer_bytes

SMALL = {"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8,
         "num_experts_per_tok": 2, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
         "qk_rope_head_dim": 8, "v_head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 4,
         "vocab_size": 1024}
SMALL_DRAFTER = {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
                 "intermediate_size": 96, "draft_vocab_size": 256}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return kimi_shaped(tmp_path_factory.mktemp("k") / "kimi", layers=2, seed=3, widths=SMALL,
                       drafter_widths=SMALL_DRAFTER)


def test_real_width_config_is_kimi():
    cfg = kimi_config(61)
    want = {"hidden_size": 7168, "vocab_size": 163840, "n_routed_experts": 384, "moe_intermediate_size": 2048,
            "num_experts_per_tok": 8, "n_shared_experts": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_attention_heads": 64,
            "intermediate_size": 18432, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
            "model_type": "kimi_k2", "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839}
    assert {k: cfg[k] for k in want} == want
    q = cfg["quantization_config"]
    assert q["format"] == "pack-quantized" and q["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert "re:.*shared_experts.*" in q["ignore"]
    # 384 experts x 3 Linears x 2048 x 7168 weights: 4 bits each plus one bf16 scale per 32
    assert packed_layer_bytes(cfg) == 384 * 3 * 2048 * 7168 // 2 + 384 * 3 * 2048 * 7168 // 16
    wrapped = kimi_config(61, wrapper=True)
    assert wrapped["text_config"]["quantization_config"]["ignore"][0] == "lm_head"
    assert wrapped["quantization_config"] == wrapped["text_config"]["quantization_config"]
    json.dumps(wrapped)


def test_bad_widths_are_user_errors():
    with pytest.raises(DiagError, match="group size"):
        kimi_config(2, widths={"hidden_size": 100})
    with pytest.raises(DiagError, match="n_group"):
        kimi_config(2, widths={"n_group": 5})
    with pytest.raises(DiagError, match="at least one layer"):
        kimi_config(0)


def test_drafter_layout_matches_kimi_ids_at_61_layers():
    assert drafter_layout(61) == ("L2+L30+L58", [2, 30, 58])
    assert drafter_layout(2) == ("embed+L1+L2", None)


def _tensors(path):
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for name, shard in index.items():
        with safe_open(str(path / shard), framework="pt") as f:
            out[name] = f.get_tensor(name)
    return index, out


def test_written_tensors_are_stored_form(pair):
    index, t = _tensors(pair.target)
    e = "model.layers.1.mlp.experts.5"
    assert t[f"{e}.gate_proj.weight_packed"].dtype == torch.int32
    assert t[f"{e}.gate_proj.weight_packed"].shape == (32, 64 // 8)
    assert t[f"{e}.down_proj.weight_scale"].shape == (64, 32 // 32)
    assert t[f"{e}.down_proj.weight_scale"].dtype == torch.bfloat16
    assert t[f"{e}.up_proj.weight_shape"].tolist() == [32, 64]
    assert not any(k.endswith("experts.0.gate_proj.weight") for k in t)          # never dense
    assert t["model.layers.1.mlp.shared_experts.up_proj.weight"].dtype == torch.bfloat16  # ignored: dense
    assert t["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert index["model.layers.0.mlp.down_proj.weight"] != index["model.layers.1.mlp.gate.weight"]
    w = dequantize(t[f"{e}.gate_proj.weight_packed"], t[f"{e}.gate_proj.weight_scale"], (32, 64), 32,
                   torch.float32)
    assert 0.5 / 8 < float(w.std()) < 2 / 8                                     # about 1/sqrt(in)


def test_loads_packed_and_runs(pair):
    model = load_packed_target(pair.target)
    assert isinstance(model.model.layers[1].mlp.experts, PackedExperts)
    assert resident_bytes(model) <= 1.15 * pair.bytes_on_disk
    with torch.no_grad():
        logits = model(torch.randint(0, 1024, (2, 12))).logits
    assert torch.isfinite(logits).all() and float(logits.float().std()) > 0.1


def test_drafter_matches_target_widths(pair):
    drafter, ckpt = load_drafter(pair.drafter)
    assert drafter.fc.weight.shape == (64, 3 * 64)
    assert drafter.lm_head.weight.shape == (256, 64)
    assert ckpt.config["diag_trained_layout"] == pair.layout == "embed+L1+L2"
    assert int(drafter.t2d.sum()) == 256


def test_same_seed_same_bytes_and_wrapper_loads(tmp_path, pair):
    again = kimi_shaped(tmp_path / "again", layers=2, seed=3, widths=SMALL, drafter=False)
    name = "model-00002-of-00003.safetensors"
    assert (again.target / name).read_bytes() == (pair.target / name).read_bytes()
    wrapped = kimi_shaped(tmp_path / "w", layers=2, seed=3, widths=SMALL, drafter=False, wrapper=True)
    _, t = _tensors(wrapped.target)
    assert all(k.startswith("language_model.") for k in t)
    model = load_packed_target(wrapped.target)
    assert any("wrapper" in n for n in model.diag_load_notes)


def test_the_successor_map_is_one_cycle_over_the_ordinary_ids():
    """V 1024: specials 768, 769, 1023 (special_ids) are nobody's successor and lead into the cycle;
    following succ from any ordinary id visits all 1021 ordinary ids before it returns."""
    from diag.zoo.kimi_shaped import special_ids, successor_map
    succ = successor_map(1024, seed=3)
    special = set(special_ids(1024).values())
    assert special == {768, 769, 1023} and not special & set(succ.tolist())
    seen, t = [], 5
    for _ in range(1021):
        seen.append(t)
        t = int(succ[t])
    assert t == 5 and len(set(seen)) == 1021 and all(int(succ[s]) not in special for s in special)
    assert torch.equal(succ, successor_map(1024, seed=3)) and not torch.equal(succ, successor_map(1024, seed=4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_successor_head_makes_greedy_follow_the_map_and_t1_peaked(tmp_path, dtype):
    """The GPU bench's kind of target (successor_margin; hidden 1024 here, so the other logits'
    std is 26 / 32, as at Kimi's 7168 it is 26 / 85): greedy continuations are succ(succ(...)) in
    float32 and bf16 alike, and the successor holds most of the T = 1 mass; without the margin the
    head is the random one (its greedy continuation leaves the map at once)."""
    wide = {**SMALL, "hidden_size": 1024}
    from diag.int4.load import load_packed_target
    from diag.zoo.kimi_shaped import successor_map
    ks = kimi_shaped(tmp_path / "s", layers=2, seed=2, widths=wide, drafter=False, successor_margin=26.0)
    model = load_packed_target(ks.target, dtype=dtype)
    succ = successor_map(SMALL["vocab_size"], seed=2)
    prompts = torch.randint(0, 700, (4, 6), generator=torch.Generator().manual_seed(0))
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                         max_new_tokens=12, min_new_tokens=12)
    for row in out.tolist():
        assert all(row[i + 1] == int(succ[row[i]]) for i in range(5, len(row) - 1))
    probs = torch.softmax(model(input_ids=out).logits.float(), -1)[:, 5:-1]        # [4, 12, V]
    at_succ = probs.gather(-1, succ[out[:, 5:-1]][..., None])[..., 0]
    assert at_succ.mean() > 0.5
    plain = kimi_shaped(tmp_path / "p", layers=2, seed=2, widths=wide, drafter=False)
    rand = load_packed_target(plain.target, dtype=dtype)
    again = rand.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                          max_new_tokens=12, min_new_tokens=12)
    assert sum(r[i + 1] == int(succ[r[i]]) for r in again.tolist() for i in range(5, 17)) < 4
