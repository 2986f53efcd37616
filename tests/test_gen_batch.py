"""The greedy-generation batch (diag/target/gen_batch.py): from the KV room, evened out,
DEFAULT on CPU; and the step-cost measurement's single prefill per job (diag/diagnoses/pricing/costs.py)."""

import functools
from types import SimpleNamespace

import pytest
import torch

from diag.target import gen_batch
from diag.target.gen_batch import DEFAULT, batch_for, generation_batch, kv_bytes_per_token, prefill_tokens
from diag.target.placement import activation_bytes
from diag.zoo.kimi_shaped import KIMI_TEXT

KIMI = SimpleNamespace(num_hidden_layers=61, num_attention_heads=64, kv_lora_rank=512, qk_nope_head_dim=128,
                       qk_rope_head_dim=64, v_head_dim=128, hidden_size=7168)


def test_kv_bytes_worked_examples():
    assert kv_bytes_per_token(KIMI) == 61 * 64 * (192 + 128) * 2                  # 2.5 MB
    llama = SimpleNamespace(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                            hidden_size=4096)
    assert kv_bytes_per_token(llama) == 32 * 8 * 256 * 2


def test_docstring_example_one_batch_of_48():
    assert batch_for(48, 1024, 512, kv_bytes_per_token(KIMI), int(200e9), 32768) == 48


def test_rooms_split_the_free_memory():
    """Half of all the GPUs' free bytes for caches, the other half of the smallest for a
    prefill (one layer at a time runs on one GPU); nothing on CPU."""
    assert gen_batch.rooms([100, 60]) == (80, 30)
    assert gen_batch.rooms([]) == (None, None)


def test_prefill_holds_what_one_layer_fits_in_the_activation_share():
    """Kimi: one decoder layer's activations are 557,056 B a token (placement's estimate without
    points and logits); 30 GB -> 53,854 tokens -> 48 prompts of 512 in one batch, where the
    capture pass's 16,384 tokens alone would give 2 batches of 24 (twice the decode steps)."""
    assert activation_bytes(KIMI_TEXT, 1, num_points=0, vocab_chunk=0) == 557056
    assert prefill_tokens(KIMI_TEXT, 16384, int(30e9)) == 53854
    kv = kv_bytes_per_token(KIMI)
    assert batch_for(48, 1024, 512, kv, int(200e9), prefill_tokens(KIMI_TEXT, 16384, int(30e9))) == 48
    assert batch_for(48, 1024, 512, kv, int(200e9), 16384) == 24
    assert prefill_tokens(KIMI_TEXT, 16384, int(1e9)) == 16384           # never below the token budget
    assert prefill_tokens(KIMI_TEXT, 16384, None) == 16384               # CPU


@pytest.mark.parametrize("n,room_rows,budget_rows,want", [
    (48, 32, 99, 24),         # at most 32 a batch -> 2 batches of 24
    (48, 1000, 99, 48),       # the room allows more than the prompts
    (100, 1000, 99, 50),      # CAP 64 -> 2 batches of 50
    (48, 1000, 20, 16),       # the prefill's token budget: 20 rows -> 3 batches of 16
    (5, 0, 99, 1)])           # no room: one prompt at a time
def test_batch_from_room_and_budget(n, room_rows, budget_rows, want):
    max_len, prompt, kv = 100, 10, 7
    assert batch_for(n, max_len, prompt, kv, room_rows * max_len * kv, budget_rows * prompt) == want


def test_cpu_keeps_the_default_and_the_choice_reads_no_free_memory(monkeypatch):
    assert batch_for(48, 100, 10, 7, None, 10 ** 6) == DEFAULT
    model = torch.nn.Linear(2, 2)
    model.config = SimpleNamespace(**KIMI_TEXT)
    assert generation_batch(model, [[1, 2, 3]] * 40, 8, 1024) == 14            # CPU: at most 16 -> 3 x 14
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr(gen_batch, "room_bytes", lambda m: 10 ** 12)
    monkeypatch.setattr(gen_batch, "activation_room_bytes", lambda m: None)
    assert generation_batch(model, [[1, 2, 3]] * 40, 8, 1024) == 40            # room for all
    assert generation_batch(model, [[1, 2, 3]] * 40, 8, 30) == 10              # prefill: 10 rows of 3 -> 4 x 10
    monkeypatch.setattr(gen_batch, "activation_room_bytes", lambda m: 10 ** 12)
    assert generation_batch(model, [[1, 2, 3]] * 40, 8, 30) == 40              # the activation share holds all


def test_step_costs_build_each_prefix_once():
    """One prefill per timed job (the cache is cropped back after each call), not one per call."""
    import tiny
    from diag.drafter.checkpoint import load_drafter
    from diag.diagnoses.pricing.costs import measure_costs
    from diag.target.load import load_embed_and_head, load_target
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        t = tiny.make_target(Path(tmp) / "t")
        model, _ = load_target(t, dtype=torch.float32)
        drafter, _ = load_drafter(tiny.make_drafter(Path(tmp) / "d"))
        embed, _ = load_embed_and_head(t)
    widths = []
    real = model.forward

    @functools.wraps(real)                                   # keeps the signature (cache_kwarg)
    def counted(*a, **kw):
        widths.append(kw["input_ids"].shape[1])
        return real(*a, **kw)

    model.forward = counted
    m = measure_costs(model, drafter, embed, [1, 3], context=16, repeats=4)
    assert widths.count(16) == 2                             # jobs D = 1 and D = 3: one prefill each
    assert widths.count(1) == widths.count(3) == 5           # 1 warm-up + 4 timed calls each
    assert m.repeats == 4 and set(m.costs.t_verify) == {1, 3}


def test_cut_crops_or_says_it_cannot():
    """pricing/costs._cut: a cache cut back to n tokens, or False (the caller rebuilds it) for a
    cache without crop or one that refuses it; any other error is a bug and propagates."""
    from types import SimpleNamespace as NS

    from transformers import DynamicCache

    from diag.diagnoses.pricing.costs import _cut

    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), 0)
    assert _cut(cache, 3) and cache.get_seq_length() == 3
    assert not _cut(cache, 4)                                            # fewer than n held
    assert not _cut(NS(get_seq_length=lambda: 5), 3)                     # no crop

    def refuse(_k):
        raise NotImplementedError("sliding window")
    assert not _cut(NS(get_seq_length=lambda: 5, crop=refuse), 3)

    def broken(_k):
        raise KeyError("a bug")
    with pytest.raises(KeyError):
        _cut(NS(get_seq_length=lambda: 5, crop=broken), 3)
