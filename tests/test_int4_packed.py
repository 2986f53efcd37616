"""PackedExperts / PackedLinear equal their dense counterparts built from the
dequantized weights, and dequantize only the experts that get tokens."""

import torch
from torch.nn import functional as F

from diag.int4.format import fake_quantize
from diag.int4.packed import PackedExperts, PackedLinear, resident_bytes
from test_int4_tiny import deepseek_config


def _dense_experts(seed=0):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts

    cfg = deepseek_config()
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    experts = DeepseekV3Experts(cfg)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.1)
        experts.down_proj.normal_(0, 0.1)
    return experts.to(torch.bfloat16)


def _routing(tokens=10, k=2, experts=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])  # [T, K]
    weights = torch.rand(tokens, k, generator=g)  # fp32, as the router returns
    return idx, weights


def test_packed_experts_equal_dense_on_dequantized_weights():
    dense = _dense_experts()
    packed = PackedExperts.from_dense(dense, 32)
    with torch.no_grad():
        dense.gate_up_proj.copy_(fake_quantize(dense.gate_up_proj, 32))
        dense.down_proj.copy_(fake_quantize(dense.down_proj, 32))
    x = torch.randn(10, 64).to(torch.bfloat16)
    idx, w = _routing()
    assert torch.equal(packed(x, idx, w), dense(x, idx, w))


def test_only_routed_experts_are_dequantized(monkeypatch):
    packed = PackedExperts.from_dense(_dense_experts(), 32)
    seen = []
    real = PackedExperts.expert_weight
    monkeypatch.setattr(PackedExperts, "expert_weight",
                        lambda self, proj, e, dtype: seen.append(e) or real(self, proj, e, dtype))
    idx = torch.tensor([[1, 5], [5, 1], [1, 5]])
    packed(torch.randn(3, 64, dtype=torch.bfloat16), idx, torch.ones(3, 2))
    assert sorted(set(seen)) == [1, 5] and len(seen) == 4  # gate_up + down for each


def test_packed_experts_are_small():
    dense = _dense_experts()
    packed = PackedExperts.from_dense(dense, 32)
    # int4 = 1/4 of bf16, plus one bf16 scale per 32 values (1/32 of bf16)
    assert resident_bytes(packed) == resident_bytes(dense) // 4 + resident_bytes(dense) // 32


def test_packed_linear_matches_dense():
    torch.manual_seed(3)
    lin = torch.nn.Linear(64, 16, bias=True).to(torch.bfloat16)
    from diag.int4.format import pack_int4, quantize_rtn

    q, scale = quantize_rtn(lin.weight.detach(), 32)
    packed = PackedLinear.like(lin, 32, dtype=torch.bfloat16)
    packed.weight_packed.copy_(pack_int4(q))
    packed.weight_scale.copy_(scale)
    packed.bias.data.copy_(lin.bias.detach())
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    expect = F.linear(x, fake_quantize(lin.weight.detach(), 32), lin.bias.detach())
    assert torch.equal(packed(x), expect)
    assert "int4 packed" in repr(packed)


def test_dense_held_dequantizes_each_expert_once_in_a_block_and_gives_the_same_bits(monkeypatch):
    """int4/packed.dense_held: a decode loop's many small forwards on the CPU dequantize each hit
    expert once for the block, not once a forward; the outputs bit for bit those of the per-call
    path; nothing is held after the block; a model whose dense copies pass the budget is left as is."""
    from diag.int4 import format as fmt
    from diag.int4.packed import dense_held

    packed = PackedExperts.from_dense(_dense_experts(), 32)
    lin = PackedLinear(64, 48, 32, dtype=torch.bfloat16)
    model = torch.nn.ModuleDict({"experts": packed, "lin": lin})
    with torch.no_grad():
        lin.weight_packed.random_(-2**31, 2**31 - 1)
        lin.weight_scale.uniform_(0.01, 0.02)
    calls = []
    real = fmt.dequantize
    monkeypatch.setattr("diag.int4.packed.dequantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    xs = [torch.randn(10, 64).to(torch.bfloat16) for _ in range(3)]
    idx, w = _routing()
    want = [(packed(x, idx, w), lin(x)) for x in xs]
    per_call = len(calls)
    calls.clear()
    before = resident_bytes(model)
    with dense_held(model, torch.bfloat16) as held:
        assert held == packed.dense_bytes(torch.bfloat16) + lin.dense_bytes(torch.bfloat16) == 8 * 3 * 32 * 64 * 2 + 48 * 64 * 2   # E x (gate, up, down) x I x H, bf16
        got = [(packed(x, idx, w), lin(x)) for x in xs]
    hit = len(set(idx.flatten().tolist()))
    assert per_call == 3 * (2 * hit + 1) and len(calls) == 2 * hit + 1     # once each in the block
    assert all(torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(want, got))
    assert packed._held is None and lin._held is None and resident_bytes(model) == before
    calls.clear()
    with dense_held(model, torch.bfloat16, budget=held - 1) as none:        # over the budget: per call, as before
        for x in xs:
            packed(x, idx, w)
    assert none == 0 and len(calls) == 3 * 2 * hit


def test_dense_held_blocks_nest_and_overlap_across_threads():
    """A staged generation's microbatch threads each enter dense_held on the same model: the first
    block opens the held weights, the last one out drops them, in any order of exits."""
    import threading

    from diag.int4.packed import dense_held

    packed = PackedExperts.from_dense(_dense_experts(), 32)
    outer = dense_held(packed, torch.bfloat16)
    outer.__enter__()
    inner_open, outer_closed, seen = threading.Event(), threading.Event(), []

    def inner():
        with dense_held(packed, torch.bfloat16):
            inner_open.set()
            outer_closed.wait(5)
            seen.append(packed._held is not None)   # the outer block left first; this one still holds
    t = threading.Thread(target=inner)
    t.start()
    inner_open.wait(5)
    outer.__exit__(None, None, None)
    assert packed._held is not None
    outer_closed.set()
    t.join(5)
    assert seen == [True] and packed._held is None and packed._holders == 0
