"""diag.int4.sharded: a layer's routed experts split over devices (expert parallelism) compute
what the unsplit module computes, the loader reads each expert into its shard, and the placement
plans shards on every GPU. On the CPU every shard is on "cpu" (the same code, no streams)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from diag.errors import DiagError
from diag.int4.packed import PackedExperts
from diag.int4.routing import routes
from diag.int4.sharded import (ShardedExperts, checkpoint_owner, local_index, packed, shard_of, split_sizes,
                               unpacked)
from test_routing import reference


def test_split_sizes_and_local_ids_worked_examples():
    assert split_sizes(384, 8) == [48] * 8
    assert split_sizes(5, 2) == [3, 2]
    idx = torch.tensor([[4, 0]])
    assert local_index(idx, 0, 3).tolist() == [[3, 0]]          # 3: shard 0's sentinel
    assert local_index(idx, 3, 2).tolist() == [[1, 2]]          # 2: shard 1's sentinel
    with pytest.raises(ValueError):
        split_sizes(3, 4)
    assert shard_of("model.layers.3.mlp.experts.shards.1") == ("model.layers.3.mlp.experts", 1)
    assert shard_of("model.layers.3.mlp.experts") is None


@pytest.mark.parametrize("H, wdtype", [(4, torch.bfloat16), (3, torch.float32), (7168, torch.float32)])
def test_a_shards_inputs_travel_in_one_buffer_and_come_back_as_they_were(H, wdtype):
    """sharded.packed / unpacked: the worked example (T 2, K 2, H 4 in bf16: 56 bytes, the hidden
    states at byte 32), and widths whose parts end off a 16-byte boundary (H 3: padded)."""
    gen = torch.Generator().manual_seed(H)
    hidden = torch.randn(2, H, generator=gen).to(torch.bfloat16)
    index = torch.randint(0, 9, (2, 2), generator=gen)
    weights = torch.rand(2, 2, generator=gen).to(wdtype)
    buf = packed(hidden, index, weights)
    if H == 4:
        assert buf.dtype == torch.uint8 and buf.numel() == 56
        assert torch.equal(buf[32:48].view(torch.bfloat16).view(2, 4), hidden)
    x, i, w = unpacked(buf.clone(), (hidden, index, weights))
    assert torch.equal(x, hidden) and torch.equal(i, index) and torch.equal(w, weights)
    assert (x.dtype, i.dtype, w.dtype) == (hidden.dtype, index.dtype, weights.dtype)


def test_partial_sums_are_handed_together_where_they_fit_and_add_to_the_same_bits(monkeypatch):
    """sharded.summed's worked example: 3 parts of [64, 7168] fp32 -> the 2 others handed before
    the first add (a program's copies back to back, the adds one graph); past GATHERED_BYTES each
    handed just before its add. The same bits either way, in first's storage."""
    import diag.int4.sharded as sharded

    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(64, 7168, generator=gen) for _ in range(3)]
    want = (parts[0] + parts[1]) + parts[2]
    for limit, order in ((sharded.GATHERED_BYTES, ["hand", "hand", "add", "add"]),
                         (64 * 7168 * 4, ["hand", "add", "hand", "add"])):
        monkeypatch.setattr(sharded, "GATHERED_BYTES", limit)
        seen = []

        def hand(t):
            seen.append("hand")
            return t.clone()

        first = parts[0].clone()
        others = [p.clone() for p in parts[1:]]
        real_add = torch.Tensor.__iadd__
        monkeypatch.setattr(torch.Tensor, "__iadd__", lambda a, b: seen.append("add") or real_add(a, b))
        got = sharded.summed(first, others, hand)
        monkeypatch.setattr(torch.Tensor, "__iadd__", real_add)
        assert seen == order and got is first and torch.equal(got, want)


def test_routing_skips_the_sentinel_worked_example():
    r = routes(torch.tensor([[2], [0], [2]]), 2, (2,))[2]
    assert r.sorted_ids.tolist() == [1, 3, 3, 3, 3, 3] and r.block_expert.tolist() == [0, -1, -1]


@settings(max_examples=40, deadline=None)
@given(E=st.integers(1, 9), T=st.integers(1, 30), K=st.integers(1, 3), block_m=st.sampled_from([1, 2, 4, 16]),
       seed=st.integers(0, 2 ** 16))
def test_routing_with_sentinel_pairs_is_the_reference_over_the_routed_ones(E, T, K, block_m, seed):
    """Pairs naming expert E (another shard's) are in no block; the others are routed exactly
    as the reference routes them."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, E + 1, (T, K), generator=gen)
    r = routes(idx, E, (block_m,))[block_m]
    ids, experts = reference(idx, E, block_m)
    assert r.sorted_ids.tolist() == ids and r.block_expert.tolist() == experts


def _packed(E=7, H=32, I=16, group=8, seed=0) -> PackedExperts:
    class Dense(torch.nn.Module):
        pass
    gen = torch.Generator().manual_seed(seed)
    dense = Dense()
    dense.gate_up_proj = torch.randn(E, 2 * I, H, generator=gen) / 4
    dense.down_proj = torch.randn(E, H, I, generator=gen) / 4
    dense.act_fn = F.silu
    return PackedExperts.from_dense(dense, group)


def _split(module: PackedExperts, shards: int) -> ShardedExperts:
    return ShardedExperts.of(module, ["cpu"] * shards)


@settings(max_examples=25, deadline=None)
@given(shards=st.integers(1, 7), T=st.integers(1, 12), K=st.integers(1, 4), seed=st.integers(0, 2 ** 16),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_split_experts_compute_the_unsplit_modules_bits(shards, T, K, seed, dtype):
    """The eager loop over the shards adds the same experts' outputs in the same order into one
    running tensor: bit for bit the unsplit module, uneven splits included."""
    module = _packed(seed=seed)
    split = _split(module, shards)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(T, module.hidden_dim, generator=gen).to(dtype)
    idx = torch.rand(T, module.num_experts, generator=gen).topk(K, dim=-1).indices
    w = torch.rand(T, K, generator=gen).to(dtype)
    assert torch.equal(split(x, idx, w), module(x, idx, w))
    assert [s.num_experts for s in split.shards] == split_sizes(module.num_experts, shards)


def test_a_shard_names_its_experts_by_their_checkpoint_ids():
    split = _split(_packed(), 2)
    assert checkpoint_owner("model.layers.1.mlp.experts.shards.1", split.shards[1]) == ("model.layers.1.mlp.experts", 4)
    from diag.target.quantize import targeted_linears
    from diag.target.regimes import regime
    holder = torch.nn.Module()
    holder.experts = split
    names = targeted_linears(holder, regime("w4a16-g32"))
    assert names[:3] == ["experts.0.gate_proj", "experts.0.up_proj", "experts.0.down_proj"]
    assert "experts.6.down_proj" in names and len(names) == 7 * 3


def _split_map(model, shards: int) -> dict:
    out = {"": "cpu"}
    for name, m in model.named_modules():
        if isinstance(m, PackedExperts) and ".shards." not in name:
            out.update({f"{name}.shards.{j}": "cpu" for j in range(shards)})
    return out


def test_the_loader_reads_each_expert_into_its_shard_and_the_logits_are_the_same(kimi_cpu):
    """The Kimi-shaped INT4 pair, loaded with a device map that splits every layer's experts in
    3 (uneven: 8 experts -> 3, 3, 2): every shard holds the checkpoint's experts of its range, and
    the model's logits equal the unsplit model's bit for bit."""
    from diag.int4.load import load_packed_target

    paths, target, _ = kimi_cpu
    split = load_packed_target(paths.target, dtype=torch.float32, device=_split_map(target, 3))
    layers = [n for n, m in split.named_modules() if isinstance(m, ShardedExperts)]
    assert layers and len(layers) == sum(isinstance(m, PackedExperts) for m in target.modules())
    for name in layers:
        whole, parts = target.get_submodule(name), split.get_submodule(name)
        for buf in ("gate_up_proj_packed", "gate_up_proj_scale", "down_proj_packed", "down_proj_scale"):
            assert torch.equal(torch.cat([getattr(s, buf) for s in parts.shards]), getattr(whole, buf))
    ids = torch.randint(10, target.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(split(ids).logits, target(ids).logits)


def test_the_placement_puts_a_shard_of_every_layer_on_every_gpu():
    """Kimi-K2.5's published config on 8 GPUs of 141 GB: 60 MoE layers x 8 shards, 48 experts a
    shard; the rest placed by layers; every GPU holds 1/8 of the experts and the plan's bytes
    add up to the model's."""
    import json
    from pathlib import Path

    from diag.target.placement import place, plan_summary
    cfg = json.loads((Path(__file__).parent / "fixtures/real-configs/kimi-k2.5/config.json").read_text())
    layer_map = place(cfg, 8, "141GB", activation_budget="8GB")
    split_map = place(cfg, 8, "141GB", activation_budget="8GB", experts="split")
    shards = [k for k in split_map if ".shards." in k]
    assert len(shards) == 60 * 8 and {split_map[k] for k in shards} == set(range(8))
    assert all(split_map[f"{k.rsplit('.', 1)[0]}.{j}"] == j for k in shards for j in range(8))
    whole, parts = plan_summary(cfg, layer_map), plan_summary(cfg, split_map)
    assert abs(sum(parts.values()) - sum(whole.values())) < 1e6
    assert max(parts.values()) - min(parts.values()) < 0.1 * max(parts.values())


def test_split_experts_refuses_one_gpu_and_dense_targets():
    import json
    from pathlib import Path

    from diag.target.placement import place
    cfg = json.loads((Path(__file__).parent / "fixtures/real-configs/kimi-k2.5/config.json").read_text())
    with pytest.raises(DiagError, match="at least 2 GPUs"):
        place(cfg, 1, "1000GB", activation_budget="8GB", experts="split")
    with pytest.raises(DiagError, match="unknown placement") as err:
        place(cfg, 2, "1000GB", activation_budget="8GB", experts="spread")
    assert err.value.field == "placement.experts"


def test_the_case_field_and_flag_are_checked_before_anything_loads():
    """[placement] experts: "layer" or "split"; "split" on fewer than 2 GPUs is refused at the
    case check, naming the field (the --experts flag when it set it)."""
    from argparse import Namespace

    from diag.cli.run import checked
    from diag.run.case import check_case, parse_case

    base = {"version": 1, "name": "m", "target": {"path": "zoo:llama-tiny"}, "drafter": {"path": "zoo:x"},
            "prompts": {"file": "p.jsonl"}, "evaluate": {"layouts": ["embed+L2+L4"]}}
    assert check_case(parse_case({**base, "placement": {"gpus": 8, "experts": "split"}}, "c.toml")).placement.experts == "split"
    assert check_case(parse_case(base, "c.toml")).placement.experts == "layer"
    with pytest.raises(DiagError) as err:
        check_case(parse_case({**base, "placement": {"gpus": 8, "experts": "spread"}}, "c.toml"))
    assert err.value.field == "placement.experts" and err.value.found == "'spread'" and err.value.file == "c.toml"
    one = parse_case({**base, "placement": {"gpus": 1, "experts": "split"}}, "c.toml")
    with pytest.raises(DiagError, match="at least 2 GPUs") as err:
        checked(one, Namespace(experts="split"))
    assert err.value.field == "--experts (placement.experts)" and err.value.found == "gpus = 1"


def test_the_split_dispatch_moves_what_the_load_did_not_place():
    """Tensors a model makes at construction (the router's e_score_correction_bias, rotary
    tables) are not read by the load; dispatch_split puts them where their module runs, as
    accelerate's dispatch does, and the shards stay where the map put them ("meta" stands in for
    a second device here: a tensor left behind would stay on the CPU)."""
    from diag.int4.load import dispatch_split

    model = torch.nn.Module()
    model.gate = torch.nn.Module()
    model.gate.register_buffer("bias", torch.zeros(3))
    model.experts = _split(_packed(), 2)
    dispatch_split(model, {"": "meta", "experts.shards.0": "cpu", "experts.shards.1": "cpu"})
    assert model.gate.bias.device.type == "meta"
    assert all(b.device.type == "cpu" for b in model.experts.buffers())


def test_a_split_on_a_target_without_int4_experts_is_refused_before_any_weight(tmp_path, monkeypatch):
    """prepare() checks `experts = "split"` against the target's config.json (no weight read):
    the zoo's dense Llama target is refused naming its config and the field; Kimi-K2.5's published
    config passes."""
    import json
    from pathlib import Path

    import diag.run.inputs as inputs
    from diag.run.case import check_case, parse_case
    from diag.target.placement import require_split_target
    from diag.zoo import zoo_path

    kimi = json.loads((Path(__file__).parent / "fixtures/real-configs/kimi-k2.5/config.json").read_text())
    require_split_target(kimi, "pack-quantized", file="k/config.json")
    target = zoo_path("llama-tiny", progress=False)
    monkeypatch.setattr(inputs, "require_gpus", lambda *a, **k: None)     # this CPU shows no GPU
    case = check_case(parse_case({"version": 1, "name": "m", "target": {"path": str(target)},
                                  "drafter": {"path": str(zoo_path("llama-tiny-eagle3-embed", progress=False))},
                                  "prompts": {"file": "p.jsonl"}, "evaluate": {"layouts": ["embed+L2+L4"]},
                                  "placement": {"gpus": 2, "experts": "split"}}, str(tmp_path / "c.toml")))
    with pytest.raises(DiagError, match="INT4 routed experts") as err:
        inputs.prepare(case)
    assert err.value.file == f"{target}/config.json" and err.value.field == "placement.experts"
    assert err.value.found == "quantization none, 0 routed experts"


def test_a_shards_row_blocks_are_sized_for_its_share_of_the_pairs(monkeypatch):
    """On the fused path each shard's GEMMs are routed for the pairs it holds on average
    (shard_pairs: all pairs x its experts / all experts), not for every pair over its few
    experts, which the host cannot tell apart without waiting for the device. shard_pairs'
    worked example: 768 tokens of Kimi, top 8, a shard of 48 of 384 experts -> 768 (16 an expert,
    32-row blocks), not 6144 (128 an expert: two or three 64-row blocks each)."""
    from diag.int4 import fast
    from diag.int4.sharded import shard_pairs

    assert shard_pairs(768 * 8, 48, 384) == 768 and shard_pairs(3, 1, 5) == 1
    assert fast.grouped_block_m(768, 48, "gate_up") == 32 and fast.grouped_block_m(6144, 48, "gate_up") == 64
    split = _split(_packed(seed=3), 3)
    for shard in split.shards:
        monkeypatch.setattr(shard, "fused_runs", lambda hidden: True, raising=False)
    seen = []

    def fake(shard, x, idx, w, *, partial=False, rows=None, pairs=None):
        seen.append((shard.num_experts, idx.numel(), partial, pairs))
        return torch.zeros(x.shape, dtype=torch.float32)

    monkeypatch.setattr(fast, "fused_experts", fake)
    x = torch.randn(10, split.shards[0].hidden_dim)
    idx = torch.rand(10, split.num_experts).topk(2, dim=-1).indices
    split(x, idx, torch.rand(10, 2))
    E = split.num_experts
    assert seen == [(s.num_experts, 20, True, -(-20 * s.num_experts // E)) for s in split.shards]
