"""The drafter's batched chain equals an independent per-position reference.

The reference below is written from DESIGN.md §3 alone: one position at a time, one key at
a time, plain RoPE from the formula, no shared code with diag.drafter.model except the weights.
"""

import math

import pytest
import torch

from diag.drafter.model import DrafterConfig, Eagle3Drafter
from diag.drafter.checkpoint import load_drafter, save_drafter
from diag.errors import DiagError

CFG = DrafterConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24,
                    vocab_size=40, draft_vocab_size=12, target_hidden_size=8, num_aux=3,
                    rope_theta=500.0, max_position_embeddings=64)


def make_drafter(seed=0, cfg=CFG):
    torch.manual_seed(seed)
    d = Eagle3Drafter(cfg)
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.3)
    d.set_vocab(torch.tensor(sorted(torch.randperm(cfg.vocab_size)[:cfg.draft_vocab_size].tolist())))
    return d.eval()


def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rope_ref(x, pos, theta):
    """x [heads, hd]; rotate-half RoPE at integer position pos."""
    hd = x.shape[-1]
    inv = torch.tensor([theta ** (-2 * i / hd) for i in range(hd // 2)])
    ang = torch.cat([pos * inv, pos * inv])
    rot = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * torch.cos(ang) + rot * torch.sin(ang)


def kv_ref(d, e, h, pos):
    m, c = d.midlayer, d.cfg
    x = torch.cat([rms(e, m.input_layernorm.weight, c.rms_norm_eps), rms(h, m.hidden_norm.weight, c.rms_norm_eps)])
    hd = c.dim_head
    q = (m.self_attn.q_proj.weight @ x).view(c.num_attention_heads, hd)
    k = (m.self_attn.k_proj.weight @ x).view(c.num_key_value_heads, hd)
    v = (m.self_attn.v_proj.weight @ x).view(c.num_key_value_heads, hd)
    rep = c.num_attention_heads // c.num_key_value_heads
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    return rope_ref(q, pos, c.rope_theta), rope_ref(k, pos, c.rope_theta), v


def finish_ref(d, q, keys, vals, h):
    m, c = d.midlayer, d.cfg
    outs = []
    for head in range(c.num_attention_heads):
        s = torch.stack([q[head] @ k[head] for k in keys]) / math.sqrt(c.dim_head)
        w = torch.softmax(s, 0)
        outs.append(sum(wi * v[head] for wi, v in zip(w, vals)))
    r = m.self_attn.o_proj.weight @ torch.cat(outs) + h
    y = rms(r, m.post_attention_layernorm.weight, c.rms_norm_eps)
    mlp = m.mlp.down_proj.weight @ (torch.nn.functional.silu(m.mlp.gate_proj.weight @ y) * (m.mlp.up_proj.weight @ y))
    return r + mlp


def chain_ref(d, emb, aux, tokens, steps):
    """Greedy chain at every index j of one sequence, one position at a time."""
    c = d.cfg
    T = tokens.shape[0]
    prefix = [kv_ref(d, emb[tokens[i]], d.fc.weight @ aux[i], i) for i in range(T)]
    logits = torch.zeros(steps, T, c.draft_vocab_size)
    for j in range(T):
        h = d.fc.weight @ aux[j]
        q = prefix[j][0]
        r = finish_ref(d, q, [p[1] for p in prefix[:j + 1]], [p[2] for p in prefix[:j + 1]], h)
        own_k, own_v = [], []
        for s in range(1, steps + 1):
            logits[s - 1, j] = d.lm_head.weight @ rms(r, d.norm.weight, c.rms_norm_eps)
            if s == steps:
                break
            tok = int(logits[s - 1, j].argmax()) + int(d.d2t[int(logits[s - 1, j].argmax())])
            q, k, v = kv_ref(d, emb[tok], r, j + s)
            own_k.append(k)
            own_v.append(v)
            r = finish_ref(d, q, [p[1] for p in prefix[:j + 1]] + own_k,
                           [p[2] for p in prefix[:j + 1]] + own_v, r)
    return logits


@torch.no_grad()
def test_chain_logits_equal_per_position_reference():
    d = make_drafter()
    emb = torch.nn.Embedding(CFG.vocab_size, CFG.hidden_size)
    torch.nn.init.normal_(emb.weight)
    T, steps = 9, 3
    aux = torch.randn(2, T, CFG.fc_in)
    tokens = torch.randint(0, CFG.vocab_size, (2, T))
    out = d.unroll(emb, aux, tokens, steps)
    for b in range(2):
        ref = chain_ref(d, emb.weight, aux[b], tokens[b], steps)
        for s in range(steps):
            torch.testing.assert_close(out[s][b], ref[s], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_right_padding_does_not_change_valid_positions():
    d = make_drafter(1)
    emb = torch.nn.Embedding(CFG.vocab_size, CFG.hidden_size)
    aux = torch.randn(1, 7, CFG.fc_in)
    tok = torch.randint(0, CFG.vocab_size, (1, 7))
    short = d.unroll(emb, aux[:, :5], tok[:, :5], 3)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    padded = d.unroll(emb, aux, tok, 3, attention_mask=mask)
    for s in range(3):
        torch.testing.assert_close(padded[s][:, :5], short[s], rtol=1e-5, atol=1e-5)


def test_d2t_worked_example():
    d = Eagle3Drafter(DrafterConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=2,
                                    intermediate_size=8, vocab_size=10, draft_vocab_size=3,
                                    target_hidden_size=8))
    d.set_vocab(torch.tensor([0, 5, 9]))
    assert d.d2t.tolist() == [0, 4, 7]
    assert d.to_target_ids(torch.tensor([0, 1, 2])).tolist() == [0, 5, 9]
    assert d.t2d.nonzero().flatten().tolist() == [0, 5, 9]
    assert d.to_draft_ids(torch.tensor([5, 6, 9])).tolist() == [1, -1, 2]


def test_save_load_round_trip(tmp_path):
    d = make_drafter(2)
    save_drafter(d, tmp_path, aux_layer_ids=[0, 2, 4], trained_layout="embed+L2+L4", dtype=torch.float32)
    back, ckpt = load_drafter(tmp_path)
    assert ckpt.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    assert ckpt.format.format == "sglang-eagle3" and ckpt.format.variant == "eagle3"
    for k, v in d.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v)


def test_missing_weight_names_file_and_key(tmp_path):
    from safetensors.torch import load_file, save_file
    save_drafter(make_drafter(3), tmp_path, aux_layer_ids=None)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["midlayer.hidden_norm.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(DiagError) as err:
        load_drafter(tmp_path)
    msg = str(err.value)
    assert "model.safetensors" in msg and "midlayer.hidden_norm.weight" in msg and "missing" in msg


def test_a_dropped_draft_vocab_size_is_named_by_the_head_it_leaves_behind(tmp_path):
    """A config.json that lost draft_vocab_size reads as "the target's head over every id", so
    the checkpoint's d2t no longer fits: the error says which key is probably missing and its value."""
    import json
    d = make_drafter(4)
    save_drafter(d, tmp_path, aux_layer_ids=[0, 2, 4])
    cfg = json.loads((tmp_path / "config.json").read_text())
    rows = cfg.pop("draft_vocab_size")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DiagError) as err:
        load_drafter(tmp_path)
    assert err.value.field in ("d2t", "lm_head.weight")
    assert f'"draft_vocab_size": {rows} is probably missing' in err.value.message


@torch.no_grad()
def test_deep_step_in_chunks_of_one_index_equals_the_reference(monkeypatch):
    """deep_step splits its scores [B, Q, R, nh, T + n] into chunks of indices under
    SCORE_ELEMENTS (Kimi's widths asked for 32 GiB at once); one index per chunk must still be
    the per-position reference."""
    import diag.drafter.model as model
    monkeypatch.setattr(model, "SCORE_ELEMENTS", 1)
    d = make_drafter(2)
    emb = torch.nn.Embedding(CFG.vocab_size, CFG.hidden_size)
    torch.nn.init.normal_(emb.weight)
    aux = torch.randn(2, 8, CFG.fc_in)
    tokens = torch.randint(0, CFG.vocab_size, (2, 8))
    out = d.unroll(emb, aux, tokens, 3)
    for b in range(2):
        ref = chain_ref(d, emb.weight, aux[b], tokens[b], 3)
        for s in range(3):
            torch.testing.assert_close(out[s][b], ref[s], rtol=1e-4, atol=1e-4)


def test_loading_fills_no_parameter_at_random_and_restores_torchs_initialisers(tmp_path):
    """load_drafter builds the module without the random fill (the strict load overwrites every
    parameter): the global RNG is untouched, the weights are the file's, and torch.nn.init is
    itself again afterwards (a module built next is filled as usual)."""
    d = make_drafter(2)
    save_drafter(d, tmp_path / "d", aux_layer_ids=[0, 2, 4], trained_layout="embed+L2+L4", dtype=torch.float32)
    init_before = torch.nn.init.kaiming_uniform_
    torch.manual_seed(7)
    state = torch.random.get_rng_state()
    back, _ = load_drafter(tmp_path / "d")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(d.state_dict().values(), back.state_dict().values()))
    assert torch.nn.init.kaiming_uniform_ is init_before
    fresh = torch.nn.Linear(8, 8)
    assert not torch.equal(torch.random.get_rng_state(), state) and fresh.weight.abs().sum() > 0


def test_the_device_read_path_reads_what_the_memory_maps_hold(tmp_path):
    """drafter/checkpoint._read_to_device (a GPU's path: checkpoint.reader into tensors made on the
    device) on the CPU: the same tensors as the memory-mapped path, d2t / t2d on the CPU; a NaN
    found there names the tensor and the file."""
    from safetensors.torch import load_file, save_file

    from diag.checkpoint.headers import tensor_infos
    from diag.drafter.checkpoint import _read_mapped, _read_to_device, inspect_drafter
    d = make_drafter(2)
    d.d2t.copy_(torch.arange(len(d.d2t)) % 3)
    save_drafter(d, tmp_path, aux_layer_ids=[0, 2, 4], trained_layout="embed+L2+L4", dtype=torch.bfloat16)
    ckpt = inspect_drafter(tmp_path)
    mapped = _read_mapped(ckpt, tensor_infos(tmp_path))
    read = _read_to_device(ckpt, tensor_infos(tmp_path), torch.device("cpu"))
    assert set(read) == set(mapped) and {"d2t", "fc.weight"} <= set(read)
    for k, v in mapped.items():
        assert read[k].dtype == v.dtype and torch.equal(read[k], v), k
    state = load_file(str(tmp_path / "model.safetensors"))
    state["fc.weight"][1, 2] = float("nan")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(DiagError) as err:
        _read_to_device(inspect_drafter(tmp_path), tensor_infos(tmp_path), torch.device("cpu"))
    assert err.value.field == "fc.weight" and err.value.file.endswith("model.safetensors")
