"""The bench pair's trained drafter (diag.bench.pair) at tiny Kimi-shaped widths: greedy chain-3
accept length >= 2.5 on the prompts it was trained on, where the random drafter accepts ~1;
cached by key; the T=1.0 figure recorded beside it."""

import pytest
import torch

TINY = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 16, "num_attention_heads": 2, "num_key_value_heads": 2,
        "vocab_size": 512}
TINY_DRAFTER = {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128,
                "draft_vocab_size": 256}
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from diag.bench.pair import PairRecipe, trained_pair_drafter
    from diag.bench.sampled import bench_prompts
    from diag.int4.load import load_packed_target
    from diag.zoo.kimi_shaped import kimi_shaped

    root = tmp_path_factory.mktemp("pair")
    ks = kimi_shaped(root / "k", layers=2, seed=7, widths=TINY, drafter_widths=TINY_DRAFTER)
    model = load_packed_target(ks.target, dtype=torch.float32)
    prompts = bench_prompts(8, 12, TINY["vocab_size"])
    lays = [ks.layout, "L1+L2+final"]
    args = (ks.target, model, prompts, NEW_TOKENS, lays, {**TINY, **TINY_DRAFTER})
    path, meta = trained_pair_drafter(*args, recipe=PairRecipe(steps=100, batch=8), cache=root / "cache")
    return ks, model, prompts, lays, args, path, meta


def test_trained_pair_accepts_like_a_trained_one_greedily(pair):
    ks, model, prompts, lays, _, path, meta = pair
    from diag.bench.pair import accept_lengths
    from diag.drafter.checkpoint import load_drafter

    assert meta["tree"] == "chain-3" and set(meta["greedy"]) == set(lays)
    assert all(x >= 2.5 for x in meta["greedy"].values()), meta["greedy"]
    assert meta["greedy_accept_length_min"] == min(meta["greedy"].values()) >= 2.5
    assert set(meta["t1.0-p0.95-k-1"]) == set(lays) and "greedy continuations" in meta["made"]
    assert meta["continuation_distinct_ids_min"] > meta["continuation_ids"] // 2      # not degenerate
    drafter, ckpt = load_drafter(path)                  # what the bench loads accepts the same
    again = accept_lengths(model, drafter, prompts, NEW_TOKENS, lays)
    assert again["greedy"] == meta["greedy"]
    random, _ = load_drafter(ks.drafter)                # the random drafter fails the same bar
    assert all(x < 2.5 for x in accept_lengths(model, random, prompts, NEW_TOKENS, lays)["greedy"].values())


def test_trained_pair_is_cached_by_key(pair):
    from diag.bench.pair import PairRecipe, pair_key, trained_pair_drafter

    _, _, prompts, lays, args, path, meta = pair
    again, meta2 = trained_pair_drafter(*args, recipe=PairRecipe(steps=100, batch=8), cache=path.parent)
    assert again == path and meta2 == meta
    other = pair_key(args[0], prompts[:-1], NEW_TOKENS, lays, args[5], PairRecipe(steps=100, batch=8))
    assert other != path.name
