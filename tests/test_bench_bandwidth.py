"""The greedy decode step against the bytes it must read (diag/bench/bandwidth.py), on the
H100's own grown figures (reports/bench/gpu-h100-repeat2.json) and on made-up ones."""

import pytest

from diag.bench.bandwidth import decode_step_bandwidth, expected_experts, routed_bytes


def test_kimis_routed_experts_and_the_experts_a_batch_reaches():
    assert routed_bytes(384, 2048, 7168, 32) == 9_512_681_472          # the H200 experts section's int4_bytes
    assert expected_experts(384, 128) == pytest.approx(108.97, abs=0.01)
    assert expected_experts(384, 1) == pytest.approx(1.0)
    assert expected_experts(4, 10_000) == pytest.approx(4.0)


def _grown(seconds: dict) -> dict:
    return {"layers": 4, "base_layers": 2, "weight_bytes": 35_118_268_928,
            "base_capture": {"weight_bytes": 15_501_179_904},
            "generate_seconds_per_layer_step_by_batch": seconds}


def test_the_h100s_decode_step_reads_a_fifth_of_the_copy_bandwidth():
    """The module docstring's worked example: batch 16, 4.922 ms a layer-step on the H100."""
    got = decode_step_bandwidth(_grown({"16": 0.004921955882812412}), 2_988_754_020_013.9077,
                                routed=routed_bytes(384, 2048, 7168, 32), experts=384, top_k=8, routed_from="kimi")
    row = got["by_batch"]["16"]
    assert got["layer_bytes"] == 9_808_544_512 and got["rest_bytes"] == 295_863_040
    assert row["step_bytes"] == pytest.approx(2.995e9, rel=1e-3)
    assert row["bytes_per_second"] == pytest.approx(6.086e11, rel=1e-3)
    assert got["fraction_of_copy_bandwidth_min"] == pytest.approx(0.2036, abs=1e-4) and not got["goal_met"]


def test_the_worst_batch_decides_and_a_step_at_the_floor_meets_the_goal():
    routed, copy = 8e9, 2e12
    floor48 = (1e9 + routed * expected_experts(64, 48 * 4) / 64) / copy           # the step's bytes / bandwidth
    grown = {**_grown({"48": floor48 * 1.6, "8": -1.0}), "weight_bytes": 15_501_179_904 + 2 * 9e9}
    got = decode_step_bandwidth(grown, copy, routed=int(routed), experts=64, top_k=4, routed_from="test")
    assert got["by_batch"]["48"]["fraction_of_copy_bandwidth"] == pytest.approx(1 / 1.6)
    assert got["by_batch"]["8"]["bytes_per_second"] is None                       # a negative slope is no rate
    assert not got["by_batch"]["48"]["host_bound"]
    fast = decode_step_bandwidth({**grown, "generate_seconds_per_layer_step_by_batch": {"48": floor48 / 1.05}}, copy,
                                 routed=int(routed), experts=64, top_k=4, routed_from="test")
    assert fast["by_batch"]["48"]["host_bound"]                                   # past the copy: the host's slope
    assert got["fraction_of_copy_bandwidth_min"] == pytest.approx(0.625) and got["goal_met"]
    assert list(got["by_batch"]) == ["8", "48"]


def test_a_gpu_result_gets_its_decode_step_against_the_bandwidth_and_the_goal_line(tmp_path):
    """gpu._finish (a bench run's end, and `diag bench combine`) adds the section from grown and
    the ceilings; a run before `added_layer` was recorded takes Kimi's routed bytes and says so."""
    import json
    from pathlib import Path

    from diag.bench.gpu import _finish
    from diag.bench.render import goal_lines
    res = json.loads((Path(__file__).parents[1] / "reports/bench/gpu-h100-repeat2.json").read_text())
    res["sections"].pop("decode_bandwidth", None)
    _finish(res, tmp_path / "r.json")
    got = res["sections"]["decode_bandwidth"]
    assert got["routed_from"].startswith("Kimi's widths") and got["fraction_of_copy_bandwidth_min"] == \
        pytest.approx(0.2036, abs=1e-4)
    assert "| greedy decode step: bytes read / copy bandwidth, worst batch | 0.204 | >= 0.5 | NOT met |" \
        in goal_lines(res)
    assert json.loads((tmp_path / "r.json").read_text())["sections"]["decode_bandwidth"] == got


def test_transformers_generate_beside_the_graphed_step_gets_its_own_rates(tmp_path):
    """A grown section that timed transformers' generate beside the pipeline's graphed step
    (transformers_generate_seconds_per_layer_step_by_batch) gets the same rows for it, under
    decode_bandwidth.transformers_generate; the goal reads the pipeline's step."""
    from diag.bench.gpu import _decode_bandwidth

    grown = {**_grown({"16": 0.0025}), "transformers_generate_seconds_per_layer_step_by_batch": {"16": 0.005},
             "added_layer": {"routed_bytes": routed_bytes(384, 2048, 7168, 32), "experts": 384, "top_k": 8}}
    got = _decode_bandwidth(grown, 2e12)
    ours, theirs = got["by_batch"]["16"], got["transformers_generate"]["by_batch"]["16"]
    assert ours["step_bytes"] == theirs["step_bytes"]
    assert ours["bytes_per_second"] == pytest.approx(2 * theirs["bytes_per_second"])
    assert got["fraction_of_copy_bandwidth_min"] == pytest.approx(ours["step_bytes"] / 0.0025 / 2e12)


def test_the_decode_steps_bandwidth_reads_the_steady_step_where_measured():
    """gpu._decode_bandwidth takes the grown section's steady step (the call's prefill and graph
    capture taken out: generate_steady_seconds_per_layer_step_by_batch) where the run measured it,
    the whole call's step before, and names which it read."""
    from diag.bench.gpu import _decode_bandwidth

    grown = {**_grown({"8": 0.0016}), "generate_steady_seconds_per_layer_step_by_batch": {"8": 0.0012},
             "added_layer": {"routed_bytes": routed_bytes(384, 2048, 7168, 32), "experts": 384, "top_k": 8}}
    got = _decode_bandwidth(grown, 3e12)
    assert got["timed_by"] == "generate_steady_seconds_per_layer_step_by_batch"
    assert got["by_batch"]["8"]["seconds_per_layer_step"] == 0.0012
    assert got["by_batch"]["8"]["fraction_of_copy_bandwidth"] == pytest.approx(
        got["by_batch"]["8"]["step_bytes"] / 0.0012 / 3e12)
    del grown["generate_steady_seconds_per_layer_step_by_batch"]
    old = _decode_bandwidth(grown, 3e12)
    assert old["timed_by"] == "generate_seconds_per_layer_step_by_batch"
    assert old["by_batch"]["8"]["seconds_per_layer_step"] == 0.0016
