"""Placement: packed INT4 counted at packed size, layers in order across GPUs, embeddings
first and lm_head last, a clear error with numbers when it does not fit."""

import pytest
import torch

from diag.errors import DiagError
from diag.zoo.kimi_shaped import kimi_config
from diag.target.placement import GiB, activation_bytes, device_map_for, dispatch, parse_bytes, place, plan_summary

SMALL = {"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64, "n_routed_experts": 16,
         "num_experts_per_tok": 4, "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
         "qk_rope_head_dim": 16, "v_head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 4,
         "vocab_size": 4096}


def _layer_order(device_map):
    return [d for n, d in device_map.items() if n.startswith("model.layers.")]


def test_layers_in_order_embed_first_head_last():
    cfg = kimi_config(8, widths=SMALL)
    total = sum(plan_summary(cfg, place(cfg, 1, "1GiB", "1MiB")).values())
    dm = place(cfg, 3, int(total / 3 * 1.3) + 2 ** 20, 2 ** 20)
    order = _layer_order(dm)
    assert order == sorted(order) and set(dm.values()) == {0, 1, 2}
    assert dm["model.embed_tokens"] == 0 and dm["lm_head"] == 2
    assert sum(plan_summary(cfg, dm).values()) == total


def test_packed_experts_counted_at_packed_size():
    cfg = kimi_config(3, widths=SMALL)
    plain = {k: v for k, v in cfg.items() if k != "quantization_config"}
    int4 = sum(plan_summary(cfg, place(cfg, 1, "1GiB", "1MiB")).values())
    bf16 = sum(plan_summary(plain, place(plain, 1, "1GiB", "1MiB")).values())
    n = 2 * 16 * 3 * 64 * 256           # 2 MoE layers x 16 experts x 3 Linears x I x H weights
    assert bf16 - int4 == n * 2 - (n // 8 * 4 + n // 32 * 2)   # bf16 minus (int32 words + bf16 scales)


def test_does_not_fit_names_numbers():
    cfg = kimi_config(8, widths=SMALL)
    with pytest.raises(DiagError) as err:
        place(cfg, 2, "4MiB", "1MiB")
    assert "per GPU" in err.value.expected and "2 GPU(s) with 0.0 GiB" in err.value.found
    with pytest.raises(DiagError, match="activation budget"):
        place(cfg, 2, "4MiB", "8MiB")


def test_real_kimi_plan_on_eight_h200s():
    cfg = kimi_config(61)
    dm = place(cfg, 8, "139GiB", token_budget=16384)
    per = plan_summary(cfg, dm)
    act = activation_bytes(cfg, 16384)
    assert set(per) == {str(i) for i in range(8)}
    assert max(per.values()) + act <= 139 * GiB
    assert 540 * GiB < sum(per.values()) < 570 * GiB      # packed: not the ~2 TB of bf16 experts
    with pytest.raises(DiagError, match="does not fit"):
        place(cfg, 4, "139GiB")


def test_cpu_and_inputs():
    assert place({}, 0) is None
    assert device_map_for("/nonexistent", 0) is None
    assert parse_bytes("2GiB", field="x") == 2 * GiB
    with pytest.raises(DiagError, match="memory size"):
        parse_bytes("lots", field="placement.gpu_memory")
    model = torch.nn.Linear(2, 2)
    assert dispatch(model, None) is model


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_asking_for_gpus_without_any(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(DiagError, match="fewer GPUs are visible"):
        device_map_for(tmp_path, 2)
