"""Greedy decoding on diag's own cache (diag.target.generate.on_cache: left padded prompts, a
preallocated cache read at fixed widths, the step a CUDA graph replays on the GPU) continues
every prompt as transformers' generate does, on a Llama and on a Kimi-shaped INT4 MLA target
(its latent attention on and off), in float32 on the CPU, where it runs eagerly; the GPU's
graphed steps are held in tests/test_gpu.py."""

import pytest
import torch

from diag.bench.cpu import SMALL
from diag.bench.sampled import bench_prompts
from diag.target.generate import _left_pad, on_cache
from diag.target.mla_latent import latent_mla


def _generate(model, prompts, new: int) -> list[list[int]]:
    ids, mask = _left_pad(prompts, 0)
    gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                         min_new_tokens=new, pad_token_id=0, eos_token_id=None, num_beams=1,
                         temperature=None, top_p=None, top_k=None)
    return gen[:, ids.shape[1]:].tolist()


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.5, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def _prompts(vocab: int) -> list[list[int]]:
    prompts = bench_prompts(5, 9, vocab, seed=3)
    prompts[1], prompts[3] = prompts[1][:4], prompts[3][:1]            # left padding of 5 and 8 slots
    return prompts


@pytest.mark.parametrize("new", [1, 2, 12])
def test_a_llama_continues_as_transformers_generate_does(llama, new):
    prompts = _prompts(300)
    want = _generate(llama, prompts, new)
    assert len({tuple(r) for r in want}) > 1                            # the rows do not all decode alike
    assert on_cache(llama, prompts, new, 0) == want


@pytest.mark.parametrize("latent", [False, True], ids=["expanded", "latent"])
def test_a_kimi_shaped_target_continues_as_transformers_generate_does(kimi_cpu, latent):
    _, model, _ = kimi_cpu
    prompts = _prompts(SMALL["vocab_size"])
    with latent_mla(model, latent):
        want = _generate(model, prompts, 10)
        got = on_cache(model, prompts, 10, 0)
    assert got == want


def test_no_new_tokens_is_no_step(llama):
    assert on_cache(llama, [[5, 6], [7]], 0, 0) == [[], []]


def test_a_wrong_position_would_show(llama, monkeypatch):
    """The comparison can fail: the same loop with each step's position one late (the prompt's
    right: RoPE sees only distances) decodes another continuation."""
    import diag.target.generate as generate

    prompts = _prompts(300)
    real = generate.forward_points
    late = lambda m, ids, pos, *a: real(m, ids, pos + (ids.shape[1] == 1), *a)   # noqa: E731
    monkeypatch.setattr(generate, "forward_points", late)
    assert on_cache(llama, prompts, 12, 0) != _generate(llama, prompts, 12)


def test_the_steps_replayed_from_a_graph_continue_as_the_eager_steps(llama, monkeypatch):
    """The graph bookkeeping on the CPU, with a stand-in for the CUDA graph that re-runs the
    forward it captured on the graph's own inputs and copies into its own outputs: one capture
    for the batch, every later step a replay of it (its inputs copied in: the fed token, the
    slot), and the same continuation as the eager steps."""
    from graph_standin import stand_in
    from diag.target.verify_graphs import VerifyGraphs

    stand_in(monkeypatch)
    prompts, graphs = _prompts(300), VerifyGraphs()
    got = on_cache(llama, prompts, 12, 0, graphs=graphs)
    assert graphs.failure is None and graphs.counts["captured"] == 1 and graphs.counts["replayed"] == 10
    assert got == on_cache(llama, prompts, 12, 0) == _generate(llama, prompts, 12)
