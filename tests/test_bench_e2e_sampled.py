"""The e2e section under sampling (bench/e2e.py's sampled figures, bench/e2e_pair.py), its
61-layer extrapolation (bench/extrapolate.sampled_extrapolation) and its goal rows (bench/render.py)."""

from __future__ import annotations

import argparse

import pytest
import torch

from diag.bench.render import goal_lines
from diag.errors import DiagError

MORE = {"sampled_s": 9.0, "sampled_rounds": 180, "sampled_lanes": 12, "target_load_s": 4.0, "wall_s": 14.5}


def test_sampled_extrapolation_worked_example():
    """The docstring's example: K 2, 3.49 ms per layer-round; 60 s over 1,200 rounds -> 307.1 s,
    after a 216 s greedy verdict 523.1 s; one more layout 9 s over 180 rounds -> 46.1 s, its 4 s
    load of 15.5 GB -> 154.7 s for 599.5 GB, 1.5 s else -> 202.3 s."""
    from diag.bench.extrapolate import RoundCost, sampled_extrapolation

    e2e = {"layers": 2, "first": {"sampled_s": 60.0, "sampled_rounds": 1200}, "one_more_layout": MORE}
    x = sampled_extrapolation(e2e, RoundCost(3.49e-3, 0.0, "decode slope"), 216.0, 599.5e9, 15.5e9)
    assert x["first_sampled_s"] == pytest.approx(60 + 59 * 3.49e-3 * 1200) == pytest.approx(307.092)
    assert x["first_sampled_verdict_after_load_s"] == pytest.approx(523.092)
    assert x["further_decode_s"] == pytest.approx(9 + 59 * 3.49e-3 * 180) == pytest.approx(46.0638)
    assert x["further_reload_s"] == pytest.approx(4 * 599.5 / 15.5) == pytest.approx(154.71, abs=0.01)
    assert x["further_rest_s"] == pytest.approx(1.5)
    assert x["further_sampled_variant_s"] == pytest.approx(1.5 + 4 * 599.5 / 15.5 + 46.0638)
    assert x["first_sampled_if_all_per_layer_s"] == pytest.approx(60 * 61 / 2)
    assert x["first_seconds_per_round"] == pytest.approx(307.092 / 1200)
    assert x["goals"]["first_sampled_verdict_after_load_s"] == {"value": x["first_sampled_verdict_after_load_s"],
                                                               "limit": 300.0, "met": False}
    assert not x["goals"]["further_sampled_variant_s"]["met"]
    assert x["terms"]["first_sampled_verdict_after_load_s"] == "greedy verdict 216.0 + sampled 307.1 = 523.1 s"
    assert "1200 rounds" in x["formulas"]["first_sampled_s"]
    fast = sampled_extrapolation({**e2e, "first": {"sampled_s": 6.0, "sampled_rounds": 100},
                                  "one_more_layout": {"sampled_s": 0.5, "sampled_rounds": 10, "wall_s": 1.0}},
                                 RoundCost(1e-3, 0.0, "decode slope"), 100.0, 599.5e9, 15.5e9)
    assert fast["further_reload_s"] == 0 and fast["further_sampled_variant_s"] == pytest.approx(0.5 + 0.5 + 0.59)
    assert fast["goals"]["first_sampled_verdict_after_load_s"]["met"]      # 100 + 6 + 5.9
    assert fast["goals"]["further_sampled_variant_s"]["met"]
    assert "further_sampled_variant_kept_s" not in x and "further_sampled_variant_kept_s" not in x["goals"]
    kept = sampled_extrapolation({**e2e, "one_more_layout_kept": {"wall_s": 3.1, "sampled_s": 2.0,
                                                                  "sampled_rounds": 180, "target_kept": 1}},
                                 RoundCost(3.49e-3, 0.0, "decode slope"), 216.0, 599.5e9, 15.5e9)
    assert kept["further_sampled_variant_kept_s"] == pytest.approx(1.1 + 2.0 + 59 * 3.49e-3 * 180)
    assert kept["further_sampled_variant_kept_s"] == pytest.approx(40.17, abs=0.01)     # the docstring's 40.2
    assert kept["further_kept_rest_s"] == pytest.approx(1.1) and kept["further_kept_targets"] == 1
    assert kept["goals"]["further_sampled_variant_kept_s"] == {"value": kept["further_sampled_variant_kept_s"],
                                                               "limit": 10.0, "met": False}
    assert kept["terms"]["further_sampled_variant_kept_s"].endswith("= 40.2 s (the target kept loaded)")
    assert kept["further_sampled_variant_s"] == x["further_sampled_variant_s"]      # the new process's, unchanged
    tokens = {**e2e, "first": {"sampled_s": 60.0, "sampled_rounds": 1200, "sampled_verified_tokens": 96000}}
    with_b = sampled_extrapolation(tokens, RoundCost(3.49e-3, 20e-6, "fit"), 216.0, 599.5e9, 15.5e9)
    gained = with_b["first_sampled_s"] - x["first_sampled_s"]
    assert gained == pytest.approx(59 * 20e-6 * 96000) == pytest.approx(113.28)
    assert "floors" not in x                                          # no copy bandwidth given


def test_round_floors_worked_example():
    """round_floors' docstring: 120 rounds of 594 GB at 3.0 TB/s -> 23.8 s stage after stage,
    2.97 s on all 8 GPUs; sampled_extrapolation gives them for the first run and the further one."""
    from diag.bench.extrapolate import RoundCost, round_floors, sampled_extrapolation

    f = round_floors(120, 594e9, 3.0e12)
    assert f["stage_after_stage_s"] == pytest.approx(23.76) and f["all_gpus_s"] == pytest.approx(2.97)
    assert f["seconds_per_round_stage_after_stage"] == pytest.approx(0.198)
    e2e = {"layers": 2, "first": {"sampled_s": 60.0, "sampled_rounds": 1200}, "one_more_layout": MORE}
    x = sampled_extrapolation(e2e, RoundCost(3.49e-3, 0.0, "decode slope"), 216.0, 594e9, 15.5e9, 3.0e12)
    assert x["floors"]["first"]["stage_after_stage_s"] == pytest.approx(1200 * 0.198)
    assert x["floors"]["further"]["rounds"] == 180 and x["floors"]["further"]["all_gpus_s"] == pytest.approx(180 * 0.198 / 8)


def _example() -> tuple[dict, dict, dict, list]:
    """A 4-layer e2e run's first run, the e2e and grown sections, its shards (48 prompts, batch 48)."""
    first = {"sequences": 48, "tokens": 30000, "target_s": 130.0, "target_load_s": 30.0, "target_generate_s": 40.0,
             "target_capture_s": 10.0, "checks_s": 2.0, "drafter_s": 20.0, "summary_s": 1.0, "report_s": 3.0,
             "target_generate_batch": 48}
    e2e = {"layers": 4, "max_new_tokens": 512, "cached_seconds_per_variant": 0.2, "first": first}
    grown = {"generate_seconds_per_layer_step": 1e-3, "capture_seconds_per_layer_token": 1e-5,
             "generate_seconds_per_layer_step_by_batch": {"48": 2e-3}}
    return first, e2e, grown, [1e9, 1e10, 1e10, 1e10, 5e9]


def test_extrapolate_takes_the_sampled_loop_out_of_the_greedy_verdict_and_grows_it():
    """sampled_s sits inside target_s (the loop runs while the pass holds the target): the greedy
    terms leave it out, `sampled` grows it by the e2e batch's decode slope."""
    from diag.bench.extrapolate import extrapolate

    first, e2e, grown, shards = _example()
    greedy = extrapolate(e2e, grown, {"diag_cold_bytes_per_s": 1e9}, shards)
    assert "sampled" not in greedy
    sampled_first = {**first, "target_s": 160.0, "sampled_s": 30.0, "sampled_rounds": 500}
    x = extrapolate({**e2e, "first": sampled_first, "one_more_layout": MORE}, grown,
                    {"diag_cold_bytes_per_s": 1e9}, shards)
    assert x["first_verdict_after_load_s"] == pytest.approx(greedy["first_verdict_after_load_s"])
    s = x["sampled"]
    assert s["first_sampled_s"] == pytest.approx(30 + 57 * 2e-3 * 500)
    assert s["first_sampled_verdict_after_load_s"] == pytest.approx(greedy["first_verdict_after_load_s"] + 87.0)
    assert s["further_reload_s"] == pytest.approx(4.0 * x["kimi_bytes"] / sum(shards))
    assert s["slope"].startswith("the greedy decode slope at batch 48")
    fit = {"seconds_per_layer_round": 4e-3, "seconds_per_layer_verified_token": 1e-5}
    y = extrapolate({**e2e, "first": {**sampled_first, "sampled_verified_tokens": 8000}, "one_more_layout": MORE},
                    {**grown, "sampled_round_slope": fit}, {"diag_cold_bytes_per_s": 1e9}, shards)["sampled"]
    assert y["first_sampled_s"] == pytest.approx(30 + 57 * (4e-3 * 500 + 1e-5 * 8000))
    assert y["slope"].startswith("the grown section's decode-loop fit")


def test_the_greedy_generation_grows_by_the_steady_step_and_a_cost_per_call():
    """generate_term's worked example: at batch 48 the probe's 64-token call read 4.50 ms a
    layer-step and its steady step 3.09 ms -> 90.2 ms a layer a call; 59 added layers, one call of
    512 steps: 0.8 + 59 * (0.00309 * 512 + 0.0902) = 99.5 s, where the whole call's slope gives
    136.7 s. A grown section without the steady step keeps the whole call's slope; one whose probe
    ran at another batch than the e2e's does too."""
    from diag.bench.extrapolate import extrapolate, generate_term

    first = {"target_generate_s": 0.8}
    probe = {"prompts": 48, "new_tokens": 64, "steady_seconds_per_step": 0.005}
    grown = {"generate_steady_seconds_per_layer_step_by_batch": {"48": 0.00309},
             "generation_at_batch": {"grown": probe}, "generation": {"prompts": 16, "new_tokens": 32}}
    gen, formula, extra = generate_term(first, grown, 59, 512, 1, 48, 0.0045)
    assert extra["generate_per_layer_call_s"] == pytest.approx((0.0045 - 0.00309) * 64)
    assert gen == pytest.approx(0.8 + 59 * (0.00309 * 512 + 0.09024)) and round(gen, 1) == 99.5
    assert extra["generate_whole_call_slope_s"] == pytest.approx(0.8 + 59 * 0.0045 * 512)
    assert "steady" in formula and "1 calls" in formula
    assert generate_term(first, {}, 59, 512, 1, 48, 0.0045)[0] == pytest.approx(0.8 + 59 * 0.0045 * 512)
    other = {**grown, "generation_at_batch": {"grown": {**probe, "prompts": 8}}}
    assert generate_term(first, other, 59, 512, 1, 48, 0.0045)[2] == {}
    # in the extrapolation: 48 prompts at batch 48, 512 steps, 57 added layers
    _, e2e, base, shards = _example()
    x = extrapolate(e2e, {**base, **grown}, {"diag_cold_bytes_per_s": 1e9}, shards)
    per_call = (2e-3 - 0.00309) * 64                                   # a steady step dearer than the call: 0
    assert per_call < 0 and x["generate_per_layer_call_s"] == 0.0
    assert x["generate_s"] == pytest.approx(40 + 57 * 0.00309 * 512) and "steady" in x["formulas"]["generate_s"]


def test_the_eager_generate_slope_prices_the_greedy_generation_a_multi_gpu_placement_runs():
    """A grown section that timed transformers' eager generate beside the graphed step: the
    extrapolation prices the 61-layer generation with both (graphs: one device only), the
    greedy verdict with the graphed one. 48 prompts at batch 48, 512 steps: 40 + 57 * 5e-3 * 512."""
    from diag.bench.extrapolate import GRAPHS_NOTE, extrapolate

    first, e2e, grown, shards = _example()
    plain = extrapolate(e2e, grown, {"diag_cold_bytes_per_s": 1e9}, shards)
    assert "generate_eager_s" not in plain and plain["graphs_note"] == GRAPHS_NOTE
    x = extrapolate(e2e, {**grown, "transformers_generate_seconds_per_layer_step_by_batch": {"48": 5e-3}},
                    {"diag_cold_bytes_per_s": 1e9}, shards)
    assert x["generate_s"] == pytest.approx(40 + 57 * 2e-3 * 512)
    assert x["generate_eager_s"] == pytest.approx(40 + 57 * 5e-3 * 512)
    assert x["first_verdict_after_load_s"] == pytest.approx(plain["first_verdict_after_load_s"])


def test_sampled_goal_rows_render_and_stay_away_without_a_sampled_run():
    x = {"first_verdict_after_load_s": 216.0,
         "sampled": {"first_sampled_verdict_after_load_s": 523.1, "further_sampled_variant_s": 8.25}}
    lines = "\n".join(goal_lines({"kind": "gpu", "sections": {"extrapolation": x}}))
    assert ("| Kimi 61 layers, 8 GPUs, T=1.0 top-p 0.95: first sampled verdict after the load (s, extrapolated) "
            "| 523 | <= 300 | NOT met |") in lines
    assert "each further sampled variant, the repeat run in all (s, extrapolated) | 8.25 | <= 10 | met |" in lines
    assert "target kept loaded" not in lines                  # an e2e run made before the kept run existed
    x["sampled"]["further_sampled_variant_kept_s"] = 31.4
    lines = "\n".join(goal_lines({"kind": "gpu", "sections": {"extrapolation": x}}))
    assert ("each further sampled variant, the target kept loaded (diag run --watch; s, extrapolated) | 31.4 | "
            "<= 10 | NOT met |") in lines
    greedy_x = {"first_verdict_after_load_s": 216.0}
    greedy_only = "\n".join(goal_lines({"kind": "gpu", "sections": {"extrapolation": greedy_x}}))
    assert "sampled" not in greedy_only and "first verdict after the load" in greedy_only


def test_cli_e2e_decoding_flags():
    from diag.cli.bench import _decoding

    ns = lambda sampled, items: argparse.Namespace(e2e_sampled=sampled, e2e_decoding=items)  # noqa: E731
    assert _decoding(ns(False, [])) is None
    assert _decoding(ns(True, ["seeds=1"])) == {"temperature": (1.0,), "top_p": (0.95,), "seeds": 1}
    assert _decoding(ns(False, ["temperature=0.6", "top_p=[0.9, 0.95]"])) == {"temperature": (0.6,),
                                                                              "top_p": (0.9, 0.95)}
    with pytest.raises(DiagError, match="--e2e-decoding") as err:
        _decoding(ns(False, ["temprature=[1.0]"]))
    assert "temperature" in str(err.value)
    with pytest.raises(DiagError, match="not JSON"):
        _decoding(ns(False, ["temperature=one"]))
    with pytest.raises(DiagError, match="top_p") as err:                # checked before anything is written
        _decoding(ns(True, ["top_p=[1.5]"]))
    assert "--e2e-decoding" in str(err.value)
    with pytest.raises(DiagError, match="seed"):
        _decoding(ns(True, ["seeds=0"]))


def test_end_to_end_under_sampling_records_what_the_sampled_verdict_costs(tmp_path):
    """The demo pair (trained: it accepts) at T=1.0 top-p 0.95, 1 seed, 2 prompts x 8 tokens: the
    first run decodes every sampled loop, the cached run none, one more layout decodes the primary
    tree's loop again (its lanes changed) and answers the other tree's from the cache."""
    from diag.bench.e2e import SAMPLED, end_to_end
    from diag.run.shipped import DEFAULT_PROMPTS, shipped
    from diag.zoo import zoo_path

    target, drafter = zoo_path("llama-tiny", progress=False), zoo_path("llama-tiny-eagle3-embed", progress=False)
    e2e = end_to_end(target, drafter, "embed+L2+L4", 5, tmp_path, prompts=shipped(DEFAULT_PROMPTS), limit=2,
                     max_new_tokens=8, gpus=0, dtype="float32", trees=("chain-1", "chain-3"), log=lambda _: None,
                     whole_machine=False, decoding={**SAMPLED, "seeds": 1}, drafter_note="zoo demo pair")
    first, again, more, s = e2e["first"], e2e["cached"], e2e["one_more_layout"], e2e["sampled"]
    assert e2e["drafter"] == "zoo demo pair" and e2e["decoding"]["temperature"] == [1.0]
    assert first["sampled_trees_decoded"] == 2
    assert first["sampled_lanes"] == 3 + 1                # 3 layouts on chain-1, the best on chain-3
    assert first["sampled_rounds"] > 0 and first["sampled_s"] > 0
    assert again.get("sampled_trees_decoded", 0) == 0 and again["sampled_trees_cached"] == 2
    assert more["sampled_trees_decoded"] == 1 and more["sampled_lanes"] == 4 and more["sampled_trees_cached"] == 1
    assert s["first_sampled_s"] == first["sampled_s"] and s["further_variant_s"] == more["sampled_s"]
    assert s["first_seconds_per_round"] == pytest.approx(first["sampled_s"] / first["sampled_rounds"])
    assert s["further_lanes_decoded"] == 4 and s["further_rounds"] == more["sampled_rounds"]
    assert s["sampled_accept_length_min"] > 1.0 and s["greedy_accept_length_min"] > 1.0
    kept = e2e["one_more_layout_kept"]           # the same case on the first run's target, first
    assert kept["layout"] == e2e["one_more_layout"]["layout"]
    assert kept["target_kept"] == 1 and "target_load_s" not in kept and more["target_load_s"] > 0
    assert "target_kept" not in more               # its cache writes were undone: it decoded the same again
    assert (kept["sampled_trees_decoded"], kept["sampled_lanes"], kept["sampled_rounds"]) == (
        1, 4, more["sampled_rounds"])
    assert s["further_kept_targets"] == 1 and s["further_kept_variant_s"] == kept["sampled_s"]


def test_e2e_prompt_ids_are_the_runs_prompts_cut_to_the_shortest(tmp_path):
    from diag.bench.e2e import kimi_case
    from diag.bench.e2e_pair import e2e_prompt_ids
    from diag.run.case import check_case
    from diag.run.inputs import prepare
    from diag.run.shipped import DEFAULT_PROMPTS, shipped
    from diag.zoo import zoo_path

    target, drafter = zoo_path("llama-tiny", progress=False), zoo_path("llama-tiny-eagle3-embed", progress=False)
    case = kimi_case(target, drafter, ["embed+L2+L4"], prompts=shipped(DEFAULT_PROMPTS), limit=4, max_new_tokens=8,
                     gpus=0, dtype="float32")
    whole = [p for _, _, p in prepare(check_case(case)).prompts]
    cut = e2e_prompt_ids(case)
    m = min(len(p) for p in whole)
    assert len({len(p) for p in whole}) > 1 and [len(p) for p in cut] == [m] * 4
    assert all(c == w[len(w) - m:] for c, w in zip(cut, whole))


def test_round_slope_fit_worked_example():
    """bench/round_slope.py's docstring: 20 -> 70 ms (32 tokens) and 60 -> 260 ms (768 tokens) over
    10 added layers -> b 15 ms / 736 a token, a 5 ms - 32 b."""
    from diag.bench.round_slope import fit

    row = lambda s, t: {"seconds_per_round": s, "verified_tokens_per_round": t}  # noqa: E731
    base = {"small": row(0.020, 32), "large": row(0.060, 768)}
    grown = {"small": row(0.070, 32), "large": row(0.260, 768)}
    got = fit(base, grown, 10)
    assert got["seconds_per_layer_verified_token"] == pytest.approx(0.015 / 736)
    assert got["seconds_per_layer_round"] == pytest.approx(0.005 - 32 * 0.015 / 736)
    assert got["seconds_per_layer_round"] == pytest.approx(4.348e-3, rel=1e-3)
    noisy = fit(base, {"small": row(0.070, 32), "large": row(0.100, 768)}, 10)       # c_large 4 ms < c_small 5 ms
    assert noisy == {**noisy, "seconds_per_layer_round": 0.005, "seconds_per_layer_verified_token": 0.0}
    assert fit({"error": "no drafter"}, grown, 10) is None
    # H100, 2 -> 4 layers: the base probe's first chain-1 loop 0.167 s a round, the grown one's 0.035
    warm = fit({"small": row(0.167, 32), "large": row(0.144, 768)}, {"small": row(0.035, 32), "large": row(0.078, 768)}, 2)
    assert warm["seconds_per_layer_round"] is None and "<= 0" in warm["error"]
    assert warm["per_layer_round_small"] == pytest.approx(-0.066)
    from diag.bench.extrapolate import round_cost
    got = round_cost({"sampled_round_slope": warm}, 0.0044, 8)
    assert (got.a, got.b) == (0.0044, 0.0) and "greedy decode slope at batch 8: no decode-loop fit" in got.source
    assert "<= 0" in got.source


def test_round_slope_probe_runs_the_decode_loop_before_and_after_growing(tmp_path):
    """The grown section's probe on a 2-layer Kimi-shaped INT4 target at toy widths, then grown to 4
    layers (bench/gpu.grow): every row's rounds counted at both verify sizes, a fit made."""
    import torch

    from diag.bench.cpu import SMALL, SMALL_DRAFTER
    from diag.bench.gpu import grow
    from diag.bench.round_slope import LARGE, MIDDLE, SMALL as SMALL_PROBE, fit, probe
    from diag.drafter.checkpoint import load_drafter
    from diag.int4.load import load_packed_target
    from diag.zoo.kimi_shaped import kimi_shaped

    ks = kimi_shaped(tmp_path / "k", layers=2, seed=5, widths=SMALL, drafter_widths=SMALL_DRAFTER)
    model = load_packed_target(ks.target, dtype=torch.float32)
    drafter, _ = load_drafter(ks.drafter)
    base = probe(model, drafter, ks.layout, new_tokens=(8, 24))
    assert "error" not in base, base
    for name, (tree, rows) in (("small", SMALL_PROBE), ("middle", MIDDLE), ("large", LARGE)):
        r = base[name]
        assert (r["tree"], r["rows"]) == (tree, rows) and r["rounds"] >= 8 // 2 and r["seconds"] > 0
    assert base["small"]["verified_tokens_per_round"] <= 16 * 2 < base["middle"]["verified_tokens_per_round"] <= 32 * 2
    assert base["middle"]["verified_tokens_per_round"] < base["large"]["verified_tokens_per_round"]
    assert grow(model, 4) == 4
    grown = probe(model, drafter, ks.layout, new_tokens=(8, 24))
    for name in ("small", "middle", "large"):     # silent copies: the same decode, only the layers' cost added
        assert [grown[name][k] for k in ("rounds", "verified_tokens")] == [base[name][k] for k in ("rounds", "verified_tokens")]
    got = fit(base, grown, 2)
    # toy widths on a shared CPU: two layers' cost can be within the noise, which the fit says
    assert got is not None and ((got["seconds_per_layer_round"] or 0) > 0) != ("<= 0" in got.get("error", ""))
    assert "error" in got or [p[0] for p in got["points"]] == sorted(base[k]["verified_tokens_per_round"] for k in base)
    assert probe(model, None, ks.layout) == {"error": "no drafter: the costs probe could not load it"}


def test_bench_e2e_drafts_a_sampled_run_with_the_pair_trained_on_its_prompts(tmp_path):
    """`diag bench cpu|gpu --sections e2e --e2e-sampled` (bench/e2e_pair.bench_e2e) on a 2-layer
    Kimi-shaped pair at toy widths: the pair's drafter is trained on the run's cut prompts and its
    layouts (the one-more-layout's included), and the run is drafted by it, not by the random one."""
    import json

    from diag.bench.cpu import SMALL, SMALL_DRAFTER
    from diag.bench.e2e import SAMPLED
    from diag.bench.e2e_pair import bench_e2e
    from diag.bench.pair import META, PairRecipe
    from diag.zoo.kimi_shaped import kimi_shaped

    ks = kimi_shaped(tmp_path / "k", layers=2, seed=5, widths=SMALL, drafter_widths=SMALL_DRAFTER)
    e2e = bench_e2e(ks, 2, tmp_path / "e2e", prompts=2, new_tokens=4, evaluate={"trees": ("chain-1",)},
                    device="cpu", decoding={**SAMPLED, "seeds": 1}, drafter_widths={**SMALL, **SMALL_DRAFTER},
                    recipe=PairRecipe(steps=2, batch=2), whole_machine=False, pair_cache=tmp_path / "pairs")
    (pair,) = (tmp_path / "pairs").iterdir()
    meta = json.loads((pair / META).read_text())
    assert meta["prompts"] == 2 and meta["new_tokens"] == 4
    assert set(meta["greedy"]) == {*e2e["layouts"], e2e["one_more_layout"]["layout"]}
    assert e2e["drafter"].startswith("bench pair drafter (bench/e2e_pair.py)")
    assert "prompts cut to their last" in e2e["drafter"]
    report = json.loads((tmp_path / "e2e" / "e2e-first" / "report.json").read_text())
    assert str(pair) in json.dumps(report["drafter"])
    assert e2e["sampled"]["first_trees_decoded"] == 1 and e2e["sampled"]["first_rounds"] > 0
    greedy = bench_e2e(ks, 2, tmp_path / "e2e-greedy", prompts=2, new_tokens=4, evaluate={"trees": ("chain-1",)},
                       device="cpu", whole_machine=False, pair_cache=tmp_path / "pairs")
    assert "sampled" not in greedy and greedy["drafter"].startswith("kimi-shaped drafter, random weights")


def test_the_kept_variant_with_experts_split_takes_the_shards_saving_off_each_added_layer():
    """_split_variant's worked example: decode 42.3 s over 121 rounds of 45 tokens, 59 added
    layers, 2.45 ms saved a layer-round -> 24.8 s; saved() interpolates between the probe's token
    counts and keeps the nearest outside them."""
    from diag.bench.expert_split import saved
    from diag.bench.extrapolate import RoundCost, sampled_extrapolation

    split = {"shards": 8, "rows": [{"tokens": 64, "all_s": 2.9e-3, "shard_s": 0.45e-3, "saved_s": 2.45e-3},
                                   {"tokens": 768, "all_s": 9.0e-3, "shard_s": 1.5e-3, "saved_s": 7.5e-3}]}
    assert saved(split, 45) == saved(split, 64) == pytest.approx(2.45e-3)
    assert saved(split, 416) == pytest.approx((2.45e-3 + 7.5e-3) / 2)
    assert saved(split, 2000) == pytest.approx(7.5e-3) and saved({"rows": []}, 100) == 0.0
    kept_run = {"wall_s": 3.9, "sampled_s": 1.5, "sampled_rounds": 121, "sampled_verified_tokens": 45 * 121,
                "target_kept": 1}
    a = (42.3 - 1.5) / (59 * 121)                                   # so that the kept decode is 42.3 s
    e2e = {"layers": 2, "first": {"sampled_s": 6.0, "sampled_rounds": 100}, "one_more_layout": MORE,
           "one_more_layout_kept": kept_run}
    x = sampled_extrapolation(e2e, RoundCost(a, 0.0, "fit"), 100.0, 599.5e9, 15.5e9, split=split)
    assert x["further_kept_decode_s"] == pytest.approx(42.3)
    assert x["further_kept_split_decode_s"] == pytest.approx(42.3 - 59 * 121 * 2.45e-3) == pytest.approx(24.81, abs=0.01)
    assert x["further_sampled_variant_kept_split_s"] == pytest.approx(2.4 + 24.81, abs=0.01)
    assert x["goals"]["further_sampled_variant_kept_split_s"]["limit"] == 10.0
    assert "experts split over 8 GPUs" in x["terms"]["further_sampled_variant_kept_split_s"]
    none = sampled_extrapolation(e2e, RoundCost(a, 0.0, "fit"), 100.0, 599.5e9, 15.5e9, split={"error": "no CUDA"})
    assert "further_sampled_variant_kept_split_s" not in none and none["further_kept_split_note"] == "no CUDA"


def test_the_probe_separates_steady_rounds_from_each_loops_own_costs():
    """round_slope's worked example: 16 rows, 15 rounds in 0.2176 s and 47 in 0.5 s -> 8.82 ms a
    round and 0.085 s a loop; the fit's c from the small size's loop costs; the extrapolation
    adds (61 - K) * c per decode loop of the run."""
    from diag.bench.extrapolate import RoundCost, round_cost, sampled_extrapolation
    from diag.bench.round_slope import fit, steady

    loop = lambda s, r, t: {"seconds": s, "rounds": r, "verified_tokens": t, "seconds_per_round": s / r}  # noqa: E731
    small = steady(loop(0.2176, 15, 480), loop(0.5, 47, 1504))
    assert small["seconds_per_round"] == pytest.approx(0.2824 / 32) == pytest.approx(8.825e-3)
    assert small["loop_seconds"] == pytest.approx(0.2176 - 15 * 0.2824 / 32) == pytest.approx(0.0852, abs=1e-4)
    assert small["verified_tokens_per_round"] == pytest.approx(1504 / 47)
    base = {"small": small, "large": steady(loop(0.66, 15, 11520), loop(1.9, 47, 36096))}
    grown = {"small": steady(loop(0.38, 15, 480), loop(0.86, 47, 1504)),
             "large": steady(loop(1.10, 15, 11520), loop(3.2, 47, 36096))}
    got = fit(base, grown, 2)
    assert got["seconds_per_layer_loop"] == pytest.approx((grown["small"]["loop_seconds"] - small["loop_seconds"]) / 2)
    cost = round_cost({"sampled_round_slope": got}, 0.0044, 8)
    a, b, why, c = cost.a, cost.b, cost.source, cost.loop
    assert c == got["seconds_per_layer_loop"] and "each loop's own costs" in why
    run = {"sampled_s": 1.5, "sampled_rounds": 121, "sampled_verified_tokens": 5496, "sampled_decode_loops": 2}
    e2e = {"layers": 2, "first": run, "one_more_layout": MORE}
    with_c = sampled_extrapolation(e2e, RoundCost(a, b, why, c), 100.0, 599.5e9, 15.5e9)
    without = sampled_extrapolation(e2e, RoundCost(a, b, why), 100.0, 599.5e9, 15.5e9)
    assert with_c["first_sampled_s"] - without["first_sampled_s"] == pytest.approx(59 * c * 2)
    assert "2 decode loop(s)" in with_c["formulas"]["first_sampled_s"] and "loop" not in without["formulas"]["first_sampled_s"]
    assert fit(base, {**grown, "small": {**grown["small"], "loop_seconds": 0.0}}, 2)["seconds_per_layer_loop"] == 0.0


def test_grow_appends_silent_copies_that_read_every_weight_and_decode_what_the_base_decodes(kimi_small):
    """bench/gpu.grow: each copy of the last layer keeps its weights (the same GEMMs, the same
    routing) with its attention's o_proj, its shared experts' and its routed experts' down
    projections zeroed (the INT4 scales), so the grown model's logits equal the base model's
    bit for bit; silence refuses a layer it cannot silence whole."""
    import torch

    from diag.bench.gpu import grow, silence
    from diag.int4.load import load_packed_target

    model = load_packed_target(kimi_small.target, dtype=torch.float32)
    ids = torch.randint(10, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(ids).logits
    last = model.model.layers[-1]
    assert grow(model, 4) == 4 and model.config.num_hidden_layers == 4
    for new in model.model.layers[2:]:
        assert not new.self_attn.o_proj.weight.any() and not new.mlp.experts.down_proj_scale.any()
        assert not new.mlp.shared_experts.down_proj.weight.any()
        assert torch.equal(new.mlp.experts.gate_up_proj_packed, last.mlp.experts.gate_up_proj_packed)
        assert torch.equal(new.mlp.gate.weight, last.mlp.gate.weight)
        assert new.mlp.experts.down_proj_packed.data_ptr() != last.mlp.experts.down_proj_packed.data_ptr()
    assert last.self_attn.o_proj.weight.any() and last.mlp.experts.down_proj_scale.any()   # the base untouched
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)

    class NoMLPOut(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = torch.nn.Module()
            self.self_attn.o_proj = torch.nn.Linear(2, 2)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no MLP output projection on Sequential"):
        silence(NoMLPOut())
    with pytest.raises(ValueError, match="no self_attn.o_proj"):
        silence(torch.nn.Linear(2, 2))


def test_the_split_saving_comes_from_the_models_routing_where_the_probe_has_it():
    """expert_split.saved reads the probe's model_rows (the model's own router: the decode-loop fit
    was measured on it) by default, the uniform rows where asked or where there are none; the
    extrapolation names the routing and gives the uniform figure beside it. 59 layers x 121 rounds
    of 45 tokens: 42.3 - 7139 x 1.0e-3 = 35.16 s (model), 42.3 - 7139 x 2.45e-3 = 24.81 s (uniform)."""
    from diag.bench.expert_split import routing_of, saved
    from diag.bench.extrapolate import RoundCost, sampled_extrapolation

    uniform = [{"tokens": 64, "all_s": 2.9e-3, "shard_s": 0.45e-3, "saved_s": 2.45e-3}]
    model = [{"tokens": 64, "all_s": 1.6e-3, "shard_s": 0.6e-3, "saved_s": 1.0e-3}]
    split = {"shards": 8, "rows": uniform, "model_rows": model}
    assert saved(split, 45) == pytest.approx(1.0e-3) and routing_of(split) == "model"
    assert saved(split, 45, "uniform") == pytest.approx(2.45e-3)
    assert routing_of({"rows": uniform}) == "uniform" and saved({"rows": uniform}, 45) == pytest.approx(2.45e-3)
    kept_run = {"wall_s": 3.9, "sampled_s": 1.5, "sampled_rounds": 121, "sampled_verified_tokens": 45 * 121,
                "target_kept": 1}
    a = (42.3 - 1.5) / (59 * 121)
    e2e = {"layers": 2, "first": {"sampled_s": 6.0, "sampled_rounds": 100}, "one_more_layout": MORE,
           "one_more_layout_kept": kept_run}
    x = sampled_extrapolation(e2e, RoundCost(a, 0.0, "fit"), 100.0, 599.5e9, 15.5e9, split=split)
    assert x["further_kept_split_decode_s"] == pytest.approx(42.3 - 59 * 121 * 1.0e-3) == pytest.approx(35.16, abs=0.01)
    assert x["further_kept_split_routing"] == "model"
    assert x["further_sampled_variant_kept_split_uniform_routing_s"] == pytest.approx(2.4 + 24.81, abs=0.01)
    assert x["formulas"]["further_kept_split_decode_s"].endswith("(model routing)")
    y = sampled_extrapolation(e2e, RoundCost(a, 0.0, "fit"), 100.0, 599.5e9, 15.5e9, split={"shards": 8, "rows": uniform})
    assert y["further_kept_split_routing"] == "uniform"
    assert "further_sampled_variant_kept_split_uniform_routing_s" not in y


def test_the_models_routing_is_read_at_its_experts_and_taken_across_rows():
    """expert_split.model_routed: the experts module's inputs as the model's forward hands them
    (the forward stopped there: the layer after it never runs), tokens taken position by position
    across the rows: ids [2, 3], 4 tokens -> (row 0, pos 0), (1, 0), (0, 1), (1, 1)."""
    from diag.bench.expert_split import model_routed
    from test_sharded_experts import _packed

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(50, 32)
            self.router = torch.nn.Linear(32, 7, bias=False)
            self.experts = _packed(E=7, H=32, I=16)
            self.after = 0

        def forward(self, input_ids):
            x = self.embed(input_ids).reshape(-1, 32)
            w, idx = self.router(x).softmax(-1).topk(2, dim=-1)
            self.experts(x, idx, w)
            self.after += 1

    torch.manual_seed(0)
    m = Tiny()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    x, idx, w = model_routed(m, m.experts, ids, 4)
    assert m.after == 0
    assert torch.equal(x, m.embed(torch.tensor([1, 4, 2, 5])))
    want_w, want_idx = m.router(x).softmax(-1).topk(2, dim=-1)
    assert torch.equal(idx, want_idx) and torch.allclose(w, want_w)


def test_the_split_saving_is_capped_at_the_layer_round_less_the_shards_own_time():
    """_split_variant's H100 example: 64 tokens a round, the fit's layer-round 2.557 ms + 5.01 us a
    token = 2.878 ms; all 384 experts (uniform) 3.15 ms, a shard 0.708 ms: the probe's 2.44 ms saved
    is more than the round could lose; capped at 2.878 - 0.708 = 2.170 ms. 59 x 121 rounds (no
    per-loop term here): 21.71 - 7139 x 2.170e-3 = 6.22 s, not 21.71 - 7139 x 2.44e-3 = 4.29 s."""
    from diag.bench.extrapolate import RoundCost, sampled_extrapolation

    split = {"shards": 8, "rows": [{"tokens": 64, "all_s": 3.149e-3, "shard_s": 0.708e-3, "saved_s": 2.441e-3}]}
    a, b = 2.557e-3, 5.01e-6
    kept_run = {"wall_s": 4.37, "sampled_s": 1.17, "sampled_rounds": 121, "sampled_verified_tokens": 64 * 121,
                "target_kept": 1}
    e2e = {"layers": 2, "first": {"sampled_s": 6.0, "sampled_rounds": 100}, "one_more_layout": MORE,
           "one_more_layout_kept": kept_run}
    x = sampled_extrapolation(e2e, RoundCost(a, b, "fit"), 100.0, 599.5e9, 15.5e9, split=split)
    decode = 1.17 + 59 * (a * 121 + b * 64 * 121)
    assert x["further_kept_decode_s"] == pytest.approx(decode) == pytest.approx(21.71, abs=0.01)
    cap = a + b * 64 - 0.708e-3
    assert cap == pytest.approx(2.170e-3, abs=1e-6) and x["further_kept_split_saving_capped"] is True
    assert x["further_kept_split_decode_s"] == pytest.approx(decode - 59 * 121 * cap) == pytest.approx(6.22, abs=0.01)
    assert "capped at the fit's layer-round less the shard's time" in x["formulas"]["further_kept_split_decode_s"]
    goal = x["goals"]["further_sampled_variant_kept_split_s"]
    assert goal["met"] is None and goal["value"] < goal["limit"]          # an optimistic estimate decides nothing
    res = {"kind": "gpu", "sections": {"extrapolation": {"sampled": x}}}
    row = [r for r in goal_lines(res) if "split" in r]
    assert len(row) == 1 and row[0].endswith("| undecided (a term capped: optimistic) |")
    goal["met"] = True                                        # the same figure, decided
    assert [r for r in goal_lines(res) if "split" in r][0].endswith("| met |")


def test_the_round_fit_follows_three_sizes_where_the_line_through_two_misses_the_middle():
    """round_slope.layer_round's worked example: points (32, 2.53 ms), (64, 3.76), (768, 6.45) ->
    48 tokens 3.145 ms, 16 tokens 2.53 (the first point), 1000 tokens 7.336 (the last segment's
    line); fit makes the points from the three probe sizes, a dip raised to its neighbour; the
    extrapolation grows a run by rounds x L(its mean round) where the line through the small and
    large sizes alone would have put the 64-token round at 2.70 ms."""
    from diag.bench.extrapolate import round_cost, sampled_extrapolation
    from diag.bench.round_slope import MIDDLE, SIZES, fit, layer_round

    pts = [[32, 2.53e-3], [64, 3.76e-3], [768, 6.45e-3]]
    assert layer_round(pts, 48) == pytest.approx(3.145e-3)
    assert layer_round(pts, 16) == pytest.approx(2.53e-3) and layer_round(pts, 64) == pytest.approx(3.76e-3)
    assert layer_round(pts, 1000) == pytest.approx(6.45e-3 + 232 * 2.69e-3 / 704) == pytest.approx(7.336e-3, abs=1e-6)
    assert MIDDLE == ("chain-1", 32) and list(SIZES) == ["small", "middle", "large"]
    row = lambda s, t: {"seconds_per_round": s, "verified_tokens_per_round": t}  # noqa: E731
    base = {"small": row(0.020, 32), "middle": row(0.024, 64), "large": row(0.060, 768)}
    grown = {"small": row(0.02506, 32), "middle": row(0.03152, 64), "large": row(0.0729, 768)}
    got = fit(base, grown, 2)
    assert [p[0] for p in got["points"]] == [32, 64, 768]
    assert [p[1] for p in got["points"]] == pytest.approx([2.53e-3, 3.76e-3, 6.45e-3])
    assert got["per_layer_round_middle"] == pytest.approx(3.76e-3)
    line = got["seconds_per_layer_round"] + 64 * got["seconds_per_layer_verified_token"]
    assert line == pytest.approx(2.53e-3 + 32 * 3.92e-3 / 736) == pytest.approx(2.700e-3, abs=1e-6)
    dip = fit(base, {**grown, "middle": row(0.024 + 2 * 2.0e-3, 64)}, 2)      # 2.0 ms at 64 < 2.53 at 32: noise
    assert dip["points"][1][1] == pytest.approx(2.53e-3)
    cost = round_cost({"sampled_round_slope": got}, 0.0044, 8)
    assert "piecewise over 3 sizes" in cost.source and cost.per_layer_round(64) == pytest.approx(3.76e-3)
    two = round_cost({"sampled_round_slope": {k: v for k, v in got.items() if k != "points"}}, 0.0044, 8)
    assert two.per_layer_round(64) == pytest.approx(line)                  # no points: the line, as before
    kept_run = {"wall_s": 3.4, "sampled_s": 1.1, "sampled_rounds": 121, "sampled_verified_tokens": 64 * 121,
                "target_kept": 1}
    e2e = {"layers": 2, "first": {"sampled_s": 6.0, "sampled_rounds": 100, "sampled_verified_tokens": 26000},
           "one_more_layout": MORE, "one_more_layout_kept": kept_run}
    x = sampled_extrapolation(e2e, cost, 100.0, 599.5e9, 15.5e9)
    assert x["further_kept_decode_s"] == pytest.approx(1.1 + 59 * 121 * 3.76e-3) == pytest.approx(27.94, abs=0.01)
    assert x["first_sampled_s"] == pytest.approx(6.0 + 59 * 100 * layer_round(pts, 260))
    assert "at 64 verified tokens a round * 121 rounds" in x["formulas"]["further_kept_decode_s"]


def test_the_split_on_the_three_size_fit_is_a_lower_bound_that_decides_only_a_miss():
    """The H100's probe at 64 tokens (the model's routing): all 384 experts 3.50 ms, the slowest
    shard 0.646 ms; with the fit's 64-token round measured at 3.76 ms the saving 2.85 ms fits in it,
    nothing is capped: 27.94 - 59 x 121 x 2.85e-3 = 7.59 s of decode, 9.89 s in all. Measured on
    one GPU, the figure leaves out the GPUs' hand-off and launches: under the limit it is
    undecided (a lower bound), over it NOT met."""
    from diag.bench.extrapolate import RoundCost, sampled_extrapolation

    split = {"shards": 8, "rows": [{"tokens": 64, "all_s": 3.21e-3, "shard_s": 0.647e-3, "saved_s": 2.563e-3}],
             "model_rows": [{"tokens": 64, "all_s": 3.497e-3, "shard_s": 0.646e-3, "saved_s": 2.851e-3}]}
    cost = RoundCost(2.443e-3, 4.12e-6, "fit", 0.0, ((32, 2.53e-3), (64, 3.76e-3), (768, 6.45e-3)))
    kept_run = {"wall_s": 3.4, "sampled_s": 1.1, "sampled_rounds": 121, "sampled_verified_tokens": 64 * 121,
                "target_kept": 1}
    e2e = {"layers": 2, "first": {"sampled_s": 6.0, "sampled_rounds": 100}, "one_more_layout": MORE,
           "one_more_layout_kept": kept_run}
    x = sampled_extrapolation(e2e, cost, 100.0, 599.5e9, 15.5e9, split=split)
    assert x["further_kept_split_saving_capped"] is False
    assert x["further_kept_split_decode_s"] == pytest.approx(27.94 - 59 * 121 * 2.851e-3, abs=0.01)
    assert x["further_kept_split_decode_s"] == pytest.approx(7.59, abs=0.01)
    goal = x["goals"]["further_sampled_variant_kept_split_s"]
    assert goal["met"] is None and goal["value"] == pytest.approx(2.3 + 7.59, abs=0.01) and goal["value"] < goal["limit"]
    res = {"kind": "gpu", "sections": {"extrapolation": {"sampled": x}}}
    row = [r for r in goal_lines(res) if "split" in r]
    assert row[0].endswith("| undecided (a lower bound: the GPUs' hand-off and launches not measured) |")
    assert "further_sampled_variant_kept_split_eager_s" not in x                # no eager slope given
    eager = sampled_extrapolation(e2e, cost, 100.0, 599.5e9, 15.5e9, split=split, eager_layer=2.40e-3)
    split_round = 3.76e-3 - 2.851e-3                                              # 0.909 ms a layer-round
    assert eager["further_sampled_variant_kept_split_eager_s"] == pytest.approx(
        2.3 + 7.59 + 59 * 121 * (2.40e-3 - split_round), abs=0.01) == pytest.approx(20.53, abs=0.01)
    assert "max(0.0024 s eager a layer" in eager["formulas"]["further_sampled_variant_kept_split_eager_s"]
    from diag.bench.extrapolate import _eager_layer
    assert _eager_layer({"transformers_generate_steady_seconds_per_layer_step_by_batch": {"8": 2.4e-3, "16": 2.45e-3}},
                        8) == 2.4e-3
    assert _eager_layer({"transformers_generate_steady_seconds_per_layer_step_by_batch": {"16": 2.45e-3}}, 48) == 2.45e-3
    assert _eager_layer({}, 8) is None
    slow = sampled_extrapolation(e2e, RoundCost(2.443e-3, 4.12e-6, "fit", 0.0, ((32, 2.53e-3), (64, 4.76e-3),
                                                                                   (768, 6.45e-3))), 100.0, 599.5e9,
                                 15.5e9, split=split)
    assert slow["further_sampled_variant_kept_split_s"] > 10 and slow["goals"]["further_sampled_variant_kept_split_s"]["met"] is False


def test_one_gpu_of_n_issues_every_shard_but_computes_only_its_own():
    """expert_split.OneGpuOfN's worked example generalised: E 7 over 3 shards (3, 2, 2), busy 1 ->
    the output is the unsplit module's with every slot outside experts 3..4 weighted 0; one_gpu_of
    swaps each layer's experts and puts the very modules back."""
    from diag.bench.expert_split import OneGpuOfN, one_gpu_of, slowest_shard
    from test_sharded_experts import _packed

    module = _packed(E=7, H=32, I=16, seed=3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(9, 32, generator=gen)
    idx = torch.rand(9, 7, generator=gen).topk(3, dim=-1).indices
    w = torch.rand(9, 3, generator=gen)
    one = OneGpuOfN(module, 3, busy=1)
    assert [s.num_experts for s in one.shards] == [3, 2, 2]
    mine = (idx >= 3) & (idx < 5)
    assert mine.any() and (~mine).any()
    want = module(x, idx, torch.where(mine, w, torch.zeros_like(w)))
    assert torch.allclose(one(x, idx, w), want, atol=1e-6)
    assert torch.equal(OneGpuOfN(module, 3, busy=2)(x, torch.zeros_like(idx), w), torch.zeros_like(x))  # none its own

    class Layer(torch.nn.Module):
        def __init__(self, experts):
            super().__init__()
            self.mlp = torch.nn.Module()
            self.mlp.experts = experts
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    dense = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([Layer(module), Layer(dense)])
    with one_gpu_of(model, 3, busy=2) as n:
        assert n == 1 and isinstance(model.model.layers[0].mlp.experts, OneGpuOfN)
        assert model.model.layers[0].mlp.experts.busy == 2 and model.model.layers[1].mlp.experts is dense
    assert model.model.layers[0].mlp.experts is module
    split = {"model_rows": [{"tokens": 32, "shard_seconds": [1, 5, 2]}, {"tokens": 64, "shard_seconds": [1, 2, 3]}]}
    assert slowest_shard(split, 60) == 2 and slowest_shard(split, 40) == 1 and slowest_shard({}, 64) == 0


def test_the_split_figure_comes_from_the_loop_timed_as_one_gpu_of_the_split_where_measured():
    """extrapolate._split_measured's worked example: rest 2.3 s, the kept run's loop 1.1 s, 59
    added layers x 121 rounds at 2.1 ms eager -> 18.4 s, the goal decided (NOT met), the
    subtraction estimate kept beside it; 0.9 ms graphed -> 9.8 s. round_slope.split_fit: 40 ms a
    round at 2 layers, 52 ms at 4 -> 6 ms a layer-round."""
    from diag.bench.extrapolate import RoundCost, sampled_extrapolation
    from diag.bench.round_slope import split_fit

    row = lambda s: {"seconds_per_round": s, "verified_tokens_per_round": 64.0}   # noqa: E731
    base = {"graphs": row(0.020), "eager": row(0.040), "shards": 8, "busy": 3, "layers_split": 1}
    grown = {"graphs": row(0.021), "eager": row(0.052), "shards": 8, "busy": 3, "layers_split": 3}
    got = split_fit(base, grown, 2)
    assert got == {"tokens": 64.0, "shards": 8, "busy": 3, "base_layers_split": 1, "graphs": pytest.approx(0.0005),
                   "eager": pytest.approx(0.006)}
    assert split_fit(base, {"error": "x"}, 2) is None and split_fit(None, grown, 2) is None
    assert split_fit(base, {**grown, "graphs": row(0.019)}, 2)["graphs"] is None           # noise: no cost

    split = {"shards": 8, "rows": [{"tokens": 64, "all_s": 3.21e-3, "shard_s": 0.647e-3, "saved_s": 2.563e-3}]}
    cost = RoundCost(2.443e-3, 4.12e-6, "fit", 0.0, ((32, 2.53e-3), (64, 3.76e-3), (768, 6.45e-3)))
    kept_run = {"wall_s": 3.4, "sampled_s": 1.1, "sampled_rounds": 121, "sampled_verified_tokens": 64 * 121,
                "target_kept": 1}
    e2e = {"layers": 2, "first": {"sampled_s": 6.0, "sampled_rounds": 100}, "one_more_layout": MORE,
           "one_more_layout_kept": kept_run}
    loop = {"tokens": 64.0, "shards": 8, "busy": 3, "graphs": 0.9e-3, "eager": 2.1e-3}
    before = sampled_extrapolation(e2e, cost, 100.0, 599.5e9, 15.5e9, split=split)
    x = sampled_extrapolation(e2e, cost, 100.0, 599.5e9, 15.5e9, split=split, split_loop=loop)
    assert x["further_sampled_variant_kept_split_s"] == pytest.approx(2.3 + 1.1 + 59 * 121 * 2.1e-3) \
        == pytest.approx(18.39, abs=0.01)
    assert x["further_sampled_variant_kept_split_graphs_s"] == pytest.approx(2.3 + 1.1 + 59 * 121 * 0.9e-3) \
        == pytest.approx(9.83, abs=0.01)
    assert x["further_sampled_variant_kept_split_subtracted_s"] == before["further_sampled_variant_kept_split_s"]
    goal = x["goals"]["further_sampled_variant_kept_split_s"]
    assert goal["met"] is False and "undecided" not in goal and "slowest shard" in goal["note"]
    assert "121 rounds * 0.0021 s a layer-round (eager, one GPU of 8" in x["formulas"]["further_sampled_variant_kept_split_s"]
    res = {"kind": "gpu", "sections": {"extrapolation": {"sampled": x}}}
    assert [r for r in goal_lines(res) if "split" in r][0].endswith("| 18.4 | <= 10 | NOT met |")
    fast = sampled_extrapolation(e2e, cost, 100.0, 599.5e9, 15.5e9, split=split, split_loop={**loop, "eager": 0.8e-3})
    assert fast["goals"]["further_sampled_variant_kept_split_s"]["met"] is True          # measured: decided
    no_eager = sampled_extrapolation(e2e, cost, 100.0, 599.5e9, 15.5e9, split=split, split_loop={**loop, "eager": None})
    assert no_eager["further_sampled_variant_kept_split_s"] == before["further_sampled_variant_kept_split_s"]
    # a probe that ran the programs (as diag runs a target over several GPUs now): their figure decides,
    # 59 x 121 at 1.3 ms -> 12.68 s, the eager one beside it
    prog = sampled_extrapolation(e2e, cost, 100.0, 599.5e9, 15.5e9, split=split, split_loop={**loop, "program": 1.3e-3})
    assert prog["further_sampled_variant_kept_split_s"] == pytest.approx(2.3 + 1.1 + 59 * 121 * 1.3e-3) \
        == pytest.approx(12.68, abs=0.01)
    assert prog["further_sampled_variant_kept_split_eager_s"] == pytest.approx(18.39, abs=0.01)
    assert prog["further_kept_split_mode"] == "program" and x["further_kept_split_mode"] == "eager"
    assert "replayed as programs" in prog["terms"]["further_sampled_variant_kept_split_s"]
    assert prog["goals"]["further_sampled_variant_kept_split_s"]["met"] is False
    both = {**base, "program": row(0.030)}, {**grown, "program": row(0.033)}
    assert split_fit(*both, 2)["program"] == pytest.approx(0.0015)
    # the kept run's own MoE layer split as well (_split_measured's worked example): its 121 rounds at the
    # fit's 3.76 ms unsplit at 64 tokens become 0.9 ms ones -> 9.83 - 121 * 2.86 ms = 9.49 s, the goal met
    own = sampled_extrapolation(e2e, cost, 100.0, 599.5e9, 15.5e9, split=split,
                                split_loop={**loop, "eager": None, "program": 0.9e-3, "base_layers_split": 1})
    assert own["further_sampled_variant_kept_split_s"] == pytest.approx(9.83 - 121 * (3.76e-3 - 0.9e-3), abs=0.01) \
        == pytest.approx(9.49, abs=0.01)
    assert own["further_kept_split_own_layers"] == 1 and own["goals"]["further_sampled_variant_kept_split_s"]["met"]
    assert "- 1 own MoE layer(s) * 121 rounds * (0.00376 unsplit - 0.0009 split) s" \
        in own["formulas"]["further_sampled_variant_kept_split_s"]
    # extrapolate keeps them only where the probe's base is the kept run's target: as deep
    from diag.bench.extrapolate import _split_loop
    fitted = {"split_round_slope": split_fit(base, grown, 2), "base_layers": 2}
    assert _split_loop(fitted, 2)["base_layers_split"] == 1
    assert _split_loop({**fitted, "base_layers": 3}, 2)["base_layers_split"] is None


def test_split_probe_times_the_loop_graphed_and_with_the_target_eager(tmp_path):
    """round_slope.split_probe on a 2-layer Kimi-shaped INT4 target at toy widths (CPU: no graphs,
    both modes run the same eager loop): MIDDLE's rows at both lengths in each mode, the experts put
    back after; VerifyGraphs.eager_for turns a model's graphs off as a placement over devices does."""
    from diag.bench.cpu import SMALL, SMALL_DRAFTER
    from diag.bench.round_slope import MIDDLE, SPLIT_MODES, split_probe
    from diag.drafter.checkpoint import load_drafter
    from diag.int4.load import load_packed_target
    from diag.int4.packed import PackedExperts
    from diag.target.verify_graphs import VerifyGraphs
    from diag.zoo.kimi_shaped import kimi_shaped

    ks = kimi_shaped(tmp_path / "k", layers=2, seed=5, widths=SMALL, drafter_widths=SMALL_DRAFTER)
    model = load_packed_target(ks.target, dtype=torch.float32)
    drafter, _ = load_drafter(ks.drafter)
    experts = [m for m in model.modules() if isinstance(m, PackedExperts)]
    got = split_probe(model, drafter, ks.layout, 4, busy=1, new_tokens=(4, 8))
    assert "error" not in got, got
    assert got["shards"] == 4 and got["busy"] == 1 and got["layers_split"] == len(experts) >= 1
    for mode in SPLIT_MODES:
        assert (got[mode]["tree"], got[mode]["rows"]) == MIDDLE and got[mode]["long"]["rounds"] > got[mode]["rounds"]
    assert [m for m in model.modules() if isinstance(m, PackedExperts)] == experts
    assert split_probe(model, None, ks.layout, 4) == {"error": "no drafter: the costs probe could not load it"}
    graphs = VerifyGraphs()
    assert graphs.how(model) is None                       # on the CPU: eager
    graphs.programmed_for(model)
    assert graphs.how(model) == "program" and graphs.usable(model)
    graphs.eager_for(model)
    assert graphs.how(model) is None and graphs.usable(model) is False
