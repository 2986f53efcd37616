"""diag bench's sampled section on CPU at tiny widths: the decode loop on a Kimi-shaped INT4
target (3 layouts x tree shapes, 32 prompts), its tokens/s, its cost in teacher-forced passes
over the same tokens, and where its time goes."""

import pytest
import torch

from diag.bench.cpu import SMALL, SMALL_DRAFTER
from diag.bench.render import goal_lines
from diag.bench.sampled import bench_prompts, sampled_bench


def test_sampled_bench_runs_at_tiny_widths(kimi_cpu):
    ks, model, drafter = kimi_cpu
    lays = [ks.layout, "L1+L2+final", "embed+L1+final"]
    prompts = bench_prompts(32, 12, SMALL["vocab_size"])
    kept = []
    res = sampled_bench(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(), lays, prompts,
                        max_new_tokens=6, token_budget=4096, trees=("chain-1", "s2-k2-d4"), partial=kept.append)
    assert [(k["incomplete"], [r["tree"] for r in k["rows"]]) for k in kept] == \
        [("1 of 2 trees not measured", ["chain-1"])]                    # saved after each tree but the last
    assert kept[0]["rows"][0] == res["rows"][0]
    assert res["prompts"] == 32 and res["decoding"] == "t1.0-p0.95-k-1" and len(res["rows"]) == 2
    for row in res["rows"]:
        assert row["rows"] == 3 * 32 and row["emitted_tokens"] == 3 * 32 * 6
        assert row["tokens_per_second"] > 0 and row["pass_tokens_per_second"] > 0
        assert row["pass_tokens"] == 32 * (12 + 6)
        assert len(row["pass_seconds_all"]) == 3 and row["pass_seconds"] == min(row["pass_seconds_all"])
        assert row["cost_in_passes"] > 0 and row["limit"] in row["phases"]
        assert sum(row["phases"].values()) <= row["profiled_seconds"] * 1.05 and row["profiled_same_decode"]
        # 6 tokens a row: the prefill's, then one round per token while nothing is accepted -> 6 / 5;
        # the drafter is random and the target's T=1 distribution near uniform: (almost) never accepted
        assert 1.2 <= row["accept_length"] < 1.25
        rounds = round(row["emitted_tokens"] / row["accept_length"])       # every row's rounds, summed
        assert row["verified_tokens"] >= rounds * row["num_draft_tokens"]
    lines = goal_lines({"sections": {"sampled": res}})
    assert any("sampled loop cost" in x and "not measured" not in x for x in lines)


def test_the_gpu_benchs_sampled_section_runs_its_code_path_on_cpu(kimi_cpu):
    """diag bench gpu --sections sampled calls bench.gpu._sampled: the same code on the CPU model,
    drafter loaded from the checkpoint in the target's dtype, one tree."""
    from diag.bench.gpu import _sampled
    from diag.bench.pair import PairRecipe
    ks, model, _ = kimi_cpu
    st = {"ks": ks, "drafter_widths": {**SMALL, **SMALL_DRAFTER}}
    res = _sampled(st, model, [ks.layout, "L1+L2+final", "embed+L1+final"], 8, 8, 3, device="cpu",
                   dtype=torch.float32, trees=("chain-3",), recipe=PairRecipe(steps=10, batch=4),
                   copy_bytes_per_s=1e10, flops_per_s=1e11)
    assert res["device"] == "cpu" and res["prompts"] == 8 and [r["tree"] for r in res["rows"]] == ["chain-3"]
    assert res["rows"][0]["emitted_tokens"] == 3 * 8 * 3 and res["tokens_per_second"] > 0
    assert set(res["drafter"]["greedy"]) == {ks.layout, "L1+L2+final", "embed+L1+final"}
    ab, = res["graphs_ab"]                                 # chain-3 is one of GRAPHS_AB; no graph on the CPU
    assert ab["tree"] == "chain-3" and ab["same_decode"] and ab["verify_graphs"] is None
    assert ab["eager_s_per_round"] > 0 and ab["graphs_s_per_round"] > 0 and ab["rows"] == 3 * 8
    assert ab["graphs_replay_s_per_round"] == ab["graphs_s_per_round"]     # nothing captured: nothing taken off
    row = res["rows"][0]
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert row["weight_bytes_per_round"] == sum(p.numel() * p.element_size() for p in model.parameters()) \
        + sum(b.numel() * b.element_size() for b in model.buffers()) - (embed.numel() + head.numel()) * 4
    assert row["kv_bytes_per_round"] > 0
    assert row["verify_fraction_of_copy_bandwidth"] == row["verify_bytes_per_second"] / 1e10
    assert res["verify_fraction_of_copy_bandwidth_min"] == row["verify_fraction_of_copy_bandwidth"]
    c = model.config                              # SMALL: layer 0 dense, layer 1 MoE (16 experts, top 4)
    from diag.bench.sampled import active_params
    routed = c.num_experts_per_tok * 3 * c.moe_intermediate_size * c.hidden_size
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert active_params(model) == routed + linears
    assert active_params(model, without=model.get_output_embeddings()) == routed + linears - head.numel()
    assert row["verify_flops_per_round"] == 2 * (routed + linears - head.numel()) * row["verified_tokens"] \
        / row["loop_rounds"]
    assert row["verify_limit_seconds_per_round"] == max(row["verify_bytes_per_round"] / 1e10,
                                                        row["verify_flops_per_round"] / 1e11)
    mods = row["verify_modules"]                           # [count, bytes, FLOP] a round, module kind by kind
    assert sum(n * f for n, _, f in mods) == pytest.approx(row["verify_flops_per_round"])
    tokens = row["verified_tokens"] / row["loop_rounds"]
    assert [n for n, _, f in mods if f == pytest.approx(2 * routed * tokens)] == [1]     # the MoE layer's experts
    assert sum(n * b for n, b, _ in mods) <= row["weight_bytes_per_round"]
    assert 0 < row["verify_roofline_seconds_per_round"] and "verify_fraction_of_roofline" in row
    assert res["drafter"]["target_head"] == "random"
    assert res["round_profiles"] == []                                    # CUDA only


def test_cache_bytes_count_every_row_over_the_caches_width_dead_slots_included(kimi_cpu):
    """One row of one slot costs c bytes (whatever the cache's layout: transformers 5.25 keeps
    MLA's latent, earlier releases each head's keys); rows of 5 and 3 ids -> width 5, 2 x 5 x c."""
    from diag.target.tree_forward import cache_bytes, prefill
    _, model, _ = kimi_cpu
    one, _ = prefill(model, torch.tensor([[7]]), torch.tensor([[True]]), (), capacity=4)
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]])
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    kv, _ = prefill(model, ids, valid, (), capacity=16)
    assert cache_bytes(one) > 0 and cache_bytes(kv) == 2 * 5 * cache_bytes(one)


def test_bench_gpu_refuses_an_unknown_section(tmp_path):
    from diag.bench.gpu import run
    with pytest.raises(ValueError, match="unknown bench sections"):
        run(tmp_path / "g.json", tmp_path, sections=("sampling",))


def test_sampled_trees_flag_picks_the_shapes_and_names_a_wrong_one_before_any_work(tmp_path, monkeypatch):
    """`diag bench gpu --sections sampled --sampled-trees chain-1,s3-k4-d5` hands the two shapes to
    the run; a misspelt one stops before the run starts, naming the flag."""
    import diag.bench.gpu as gpu
    from diag.cli.main import main
    seen = {}
    monkeypatch.setattr(gpu, "run", lambda out, work, **kw: seen.update(kw))
    rc = main(["bench", "gpu", "--sections", "sampled", "--sampled-trees", "chain-1, s3-k4-d5",
               "--out", str(tmp_path / "g.json"), "--workdir", str(tmp_path / "w")])
    assert rc == 0 and seen["sampled_trees"] == ("chain-1", "s3-k4-d5") and seen["sections"] == ("sampled",)
    seen.clear()
    rc = main(["bench", "gpu", "--sections", "sampled", "--sampled-trees", "chain-1,s3-k4-d9x",
               "--out", str(tmp_path / "g.json"), "--workdir", str(tmp_path / "w")])
    assert rc != 0 and not seen


def test_the_trained_pairs_goals_are_the_cpus():
    sec = {"worst_cost_over_draft_tokens": 0.8, "demo_sampled_minus_demo_seconds": 31.5}
    lines = "\n".join(goal_lines({"kind": "cpu", "sections": {"sampled_trained": sec}}))
    assert "| demo-sampled minus the cached demo, side by side (s) | 31.5 | <= 30 | NOT met |" in lines
    assert "worst tree | 0.8 | <= 1.0 | met |" in lines
    assert "demo-sampled" not in "\n".join(goal_lines({"kind": "gpu", "sections": {"sampled_trained": sec}}))


def test_a_round_profile_leaves_the_prefill_and_the_first_round_out_and_splits_the_rest_by_phase(kimi_cpu):
    """round_profile: `rounds` rounds after the prefill and a warm-up round, per phase per round
    (the host's wall; on the CPU no device figures); the phases' host time lies within the
    window's wall and the prefill is not among them."""
    from diag.bench.sampled import round_profile
    ks, model, drafter = kimi_cpu
    prompts = bench_prompts(4, 10, SMALL["vocab_size"])
    res = round_profile(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(),
                        [ks.layout, "L1+L2+final"], prompts, "chain-1", max_new_tokens=12, rounds=4)
    assert res["rounds"] == 4 and res["rows"] == 8
    assert set(res["phases"]) == {"draft", "verify_forward", "accept", "commit", "retire"}
    host = sum(p["host_ms"] for p in res["phases"].values()) / 1e3
    assert 0.5 * res["wall_s_per_round"] < host <= res["wall_s_per_round"] * 1.02
    assert res["device_busy_fraction"] is None and res["phases"]["verify_forward"]["device_ms"] is None
    assert res["top_ops"] == []
    with pytest.raises(ValueError, match="too few"):
        round_profile(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(),
                      [ks.layout], prompts, "chain-1", max_new_tokens=2, rounds=4)


def test_the_kimi_shaped_targets_verify_on_fixed_widths_decodes_what_the_growing_cache_did(kimi_cpu):
    """MLA's cache (transformers' DeepseekV3 attention) through the whole-buffer verify, forced on
    the CPU: the same drafts accepted and the same ids as on growing widths, under sampling."""
    from diag.bench.sampled import bench_loop
    from diag.engines.decoding import sampled
    from diag.trees import tree_shape
    ks, model, drafter = kimi_cpu
    prompts = bench_prompts(6, 10, SMALL["vocab_size"])
    out = []
    for fixed in (True, False):
        loop, _, rows = bench_loop(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(),
                                   [ks.layout, "L1+L2+final"], tree_shape("s2-k2-d4"), len(prompts),
                                   decoding=sampled(1.0, 0.95))
        loop.fixed_width = fixed
        out.append([(d.accepted, d.ids) for d in loop.run(prompts, rows, 10)])
    assert out[0] == out[1] and sum(len(a) for a, _ in out[0]) > 0


def test_the_grown_sections_added_layer_is_its_routed_experts(kimi_cpu):
    """bench.gpu.added_layer on the tiny Kimi-shaped target: the last layer's PackedExperts bytes
    (INT4 words and bf16 scales of E experts x 3 matrices), E and top-k from the config."""
    from diag.bench.bandwidth import routed_bytes
    from diag.bench.gpu import added_layer
    _, model, _ = kimi_cpu
    c = model.config
    got = added_layer(model)
    assert got == {"routed_bytes": got["routed_bytes"], "experts": c.n_routed_experts, "top_k": c.num_experts_per_tok}
    experts = model.model.layers[-1].mlp.experts
    want = routed_bytes(c.n_routed_experts, c.moe_intermediate_size, c.hidden_size, experts.group_size,
                        experts.gate_up_proj_scale.element_size())
    assert got["routed_bytes"] == want > 0


def test_the_generation_probe_takes_the_median_of_its_repeats_at_two_lengths(kimi_cpu, monkeypatch):
    """bench.gpu._generation_probe: after a warm-up, the median of GENERATION_REPEATS timed runs, at
    new_tokens and at a quarter of them; the steady step is the difference over the steps between
    (the call's prefill and fixed costs cancel), the whole call's step its seconds over new_tokens."""
    from diag.bench import gpu
    _, model, _ = kimi_cpu
    calls, lengths = [], []
    clock = iter([0.40, 0.13])                         # the whole call, then the short one

    def fake(fn, **kw):
        calls.append(kw)
        fn()
        return next(clock)
    monkeypatch.setattr(gpu, "timed", fake)
    real = __import__("diag.target.generate", fromlist=["greedy_continuations"]).greedy_continuations
    monkeypatch.setattr("diag.target.generate.greedy_continuations",
                        lambda m, ps, n, **kw: lengths.append(n) or real(m, ps, n, **kw))
    got = gpu._generation_probe(model, SMALL["vocab_size"], prompts=2, prompt_len=4, new_tokens=8)
    assert calls == [{"repeat": gpu.GENERATION_REPEATS, "warmup": 1}] * 2 and gpu.GENERATION_REPEATS == 3
    assert lengths == [8, 2] and got["short_new_tokens"] == 2 and got["repeats"] == 3
    assert got["seconds_per_step"] == pytest.approx(0.40 / 8)
    assert got["steady_seconds_per_step"] == pytest.approx((0.40 - 0.13) / 6)


def test_the_verify_once_its_graphs_are_captured():
    """verify_bandwidth's steady state: the verify phase less its graphs' captures, over the rounds
    that replayed (every other round a capture, whose outputs are its round's); a row whose graphs
    failed or whose rounds ran eagerly gets none."""
    from diag.bench.sampled import replay_seconds_per_round, verify_bandwidth

    def row(**graphs):
        return {"loop_rounds": 62, "phases": {"verify_forward": 0.60}, "verify_seconds_per_round": 0.60 / 62,
                "verify_bytes_per_round": 10.8e9, "verify_bytes_per_second": 10.8e9 * 62 / 0.60,
                "verify_flops_per_round": 1e11, "verify_graphs": graphs}
    good = row(captured=5, replayed=57, eager=5, capture_s=0.27, failure=None)
    assert replay_seconds_per_round(good) == pytest.approx(0.33 / 57) == pytest.approx(5.79e-3, abs=1e-5)
    assert replay_seconds_per_round(row(captured=1, replayed=30, capture_s=0.1, failure=None)) is None
    assert replay_seconds_per_round(row(captured=1, replayed=62, capture_s=0.1, failure=None)) is None
    assert replay_seconds_per_round(row(captured=1, replayed=61, capture_s=0.1, failure="RuntimeError: x")) is None
    section = {"rows": [good, row(captured=1, replayed=3, capture_s=0.1, failure=None)]}
    verify_bandwidth(section, 3.0e12, 8e14)
    assert good["verify_replay_fraction_of_copy_bandwidth"] == pytest.approx(10.8e9 / (0.33 / 57) / 3.0e12)
    assert "verify_replay_seconds_per_round" not in section["rows"][1]
    assert section["verify_replay_fraction_of_copy_bandwidth_min"] == good["verify_replay_fraction_of_copy_bandwidth"]
    assert section["verify_fraction_of_copy_bandwidth_min"] < section["verify_replay_fraction_of_copy_bandwidth_min"]


def test_the_pairs_training_memory_and_the_layers_that_leave_room_for_it():
    """bench/pair.training_bytes: 18 B a trainable parameter (fp32 weight, gradient, AdamW's two
    moments, the bf16 copy under autocast) + 8 GiB; the Kimi-shaped drafter's 1.19 B parameters ->
    30.0 GB. gpu.layers_for_memory leaves that on the device: an H100 (85.0e9 B) holds 5 layers
    of the bench target (0.8 GB layer 0 + 9.9 GB a MoE layer + 4.7 GB tables), an H200 the cap 6.
    gpu.pair_fits says what --layers leaves room when it does not fit."""
    from diag.bench.gpu import layers_for_memory, pair_fits
    from diag.bench.pair import TRAINING_WORK_BYTES, training_bytes
    from diag.drafter.model import Eagle3Drafter
    from diag.zoo.kimi_shaped import drafter_config

    need = training_bytes({})
    assert need == 1_190_948_864 * 18 + TRAINING_WORK_BYTES and round(need / 1e9, 1) == 30.0
    small = {**SMALL, **SMALL_DRAFTER}
    params = sum(p.numel() for p in Eagle3Drafter(drafter_config(small)).parameters())
    assert training_bytes(small) == params * 18 + TRAINING_WORK_BYTES
    assert layers_for_memory(85_000_000_000, need) == 5 and layers_for_memory(150_000_000_000, need) == 6
    assert layers_for_memory(20_000_000_000, need) == 2                    # never below the bench's 2 layers
    assert pair_fits(31_000_000_000, need, 6, 9_900_000_000) is None
    why = pair_fits(24_600_000_000, need, 6, 9_900_000_000)
    assert "30.0 GB needed, 24.6 GB free" in why and "--layers 5 or fewer" in why
    assert "--layers 4 or fewer" in pair_fits(14_000_000_000, need, 6, 9_900_000_000)   # 16 GB short: 2 layers


def test_the_sampled_section_refuses_a_target_that_leaves_no_room_to_train_its_pair(kimi_cpu, monkeypatch):
    """On CUDA the section checks the device's free memory against the pair's training before it
    trains (an OOM deep inside AdamW is what the H100 gave at 6 layers) and names --layers; the
    run records the error and goes on to its other sections (bench/common.section)."""
    from diag.bench.gpu import _sampled
    from diag.bench.pair import PairRecipe
    from diag.errors import DiagError
    ks, model, _ = kimi_cpu
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (1_000_000, 80_000_000_000))
    st = {"ks": ks, "drafter_widths": {**SMALL, **SMALL_DRAFTER}}
    with pytest.raises(DiagError, match="--layers 2 or fewer") as err:
        _sampled(st, model, [ks.layout, "L1+L2+final", "embed+L1+final"], 8, 8, 3, device="cuda",
                 dtype=torch.float32, trees=("chain-3",), recipe=PairRecipe(steps=10, batch=4, seed=7))
    assert err.value.field == "--layers" and "0.0 GB free" in str(err.value)


def test_the_pairs_optimizer_steps_one_parameter_at_a_time():
    """zoo.train.make_optimizer(foreach=False), which the bench pair trains with: no step-wide
    temporaries; torch's own choice by default."""
    from diag.zoo.recipes import TrainBudget
    from diag.zoo.train import make_optimizer

    params = [torch.nn.Parameter(torch.zeros(3, 3)), torch.nn.Parameter(torch.zeros(3))]
    budget = TrainBudget(steps=1, batch=1, seq_len=4, lr=1e-3, seed=0)
    assert make_optimizer(params, budget, foreach=False).defaults["foreach"] is False
    assert make_optimizer(params, budget).defaults["foreach"] is None


def test_the_verify_roofline_module_by_module_worked_example():
    """roofline's docstring: 10.8 GB a round, experts 9.51 GB / 1.082 TFLOP, a dense MLP 0.793 GB /
    1.218 TFLOP, at 3.0 TB/s and 768 TFLOP/s -> 4.92 ms, 1.59 ms of it flops-bound; the goal
    (half the bandwidth: 7.2 ms) is 0.68 of it; a round of 9.84 ms runs at 0.5 of its roofline."""
    from diag.bench.sampled import roofline, verify_bandwidth

    row = {"verify_bytes_per_round": 10.8e9, "verify_modules": [[1, 9.51e9, 1.082e12], [1, 0.793e9, 1.218e12]],
           "verify_seconds_per_round": 9.84e-3, "verify_bytes_per_second": 10.8e9 / 9.84e-3,
           "verify_flops_per_round": 2.3e12}
    got = roofline(row, 3.0e12, 768e12)
    assert got["verify_roofline_seconds_per_round"] == pytest.approx(9.51e9 / 3e12 + 1.218e12 / 768e12 + 0.497e9 / 3e12)
    assert round(got["verify_roofline_seconds_per_round"] * 1e3, 2) == 4.92
    assert got["verify_roofline_flops_bound_seconds"] == pytest.approx(1.218e12 / 768e12)
    assert round(got["verify_bandwidth_goal_share_of_roofline"], 2) == 0.68
    assert got["verify_fraction_of_roofline"] == pytest.approx(0.5, abs=0.001)
    assert roofline({**row, "verify_modules": None}, 3e12, 768e12) == {} == roofline(row, 3e12, None)
    section = {"rows": [row]}
    verify_bandwidth(section, 3.0e12, 768e12)
    assert section["verify_fraction_of_roofline_min"] == row["verify_fraction_of_roofline"]
    assert row["verify_limit_seconds_per_round"] == pytest.approx(10.8e9 / 3e12)    # the one-number limit: bytes


def test_the_loop_on_an_int4_target_dequantizes_each_expert_once_and_decodes_what_the_per_call_path_did(
        kimi_cpu, monkeypatch):
    """The decode loop on the CPU keeps the INT4 target's dequantized experts for its rounds
    (int4/packed.dense_held): each hit expert's two projections dequantized once a loop, not once a
    forward; the same drafts accepted and the same ids as with nothing held (HELD_BYTES 0)."""
    from diag.bench.sampled import bench_loop
    from diag.engines.decoding import sampled
    from diag.int4 import packed as pk
    from diag.trees import tree_shape
    ks, model, drafter = kimi_cpu
    prompts = bench_prompts(6, 10, SMALL["vocab_size"])
    calls, real = [], pk.dequantize
    monkeypatch.setattr(pk, "dequantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = {}
    for name, budget in (("held", pk.HELD_BYTES), ("none", 0)):
        monkeypatch.setattr(pk, "HELD_BYTES", budget)
        loop, _, rows = bench_loop(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(),
                                   [ks.layout, "L1+L2+final"], tree_shape("chain-3"), len(prompts),
                                   decoding=sampled(1.0, 0.95))
        calls.clear()
        got = loop.run(prompts, rows, 10)
        out[name] = ([(d.accepted, d.ids) for d in got], len(calls), loop.counts["rounds"])
    held, none = out["held"], out["none"]
    projections = 2 * sum(m.num_experts for m in model.modules() if isinstance(m, pk.PackedExperts))
    assert held[0] == none[0] and held[2] == none[2] >= 3
    assert held[1] <= projections < none[1]
