"""`diag bench combine` (diag/bench/combine.py) on the committed H100 results: a load run and an
e2e + grown run of one lease each, combined into one result with the extrapolation."""

import json
import shutil
from pathlib import Path

import pytest

from diag.cli import main
from diag.errors import DiagError

BENCH = Path(__file__).resolve().parents[1] / "reports" / "bench"
LOAD, E2E = BENCH / "gpu-h100-load.json", BENCH / "gpu-h100-e2e-sampled.json"


def test_combine_takes_each_section_from_the_first_run_that_measured_it(tmp_path):
    from diag.bench.combine import combine

    got = combine([LOAD, E2E])
    load, e2e = json.loads(LOAD.read_text()), json.loads(E2E.read_text())
    assert got["sections"]["load"] == load["sections"]["load"]
    assert got["sections"]["checkpoint"] == load["sections"]["checkpoint"]       # the first file's
    assert got["sections"]["e2e"] == e2e["sections"]["e2e"]
    assert [(r["file"], r["sections"]) for r in got["combined_from"]] == [
        (LOAD.name, ["ceilings", "checkpoint", "load"]), (E2E.name, ["e2e", "checkpoint_load", "grown"])]
    # the decode-loop fit is computed again from the probe rows: this H100's came out negative (no fit)
    assert got["sections"]["grown"]["sampled_round_slope"]["seconds_per_layer_round"] is None
    assert "<= 0" in got["sections"]["grown"]["sampled_round_slope"]["error"]


def test_combine_writes_the_extrapolation_over_the_combined_sections(tmp_path):
    out = tmp_path / "c.json"
    assert main(["bench", "combine", str(LOAD), str(E2E), "--out", str(out)]) == 0
    x = json.loads(out.read_text())["sections"]["extrapolation"]
    load = json.loads(LOAD.read_text())["sections"]["load"]
    assert x["load_s"] == pytest.approx(x["kimi_bytes"] / load["first_run_bytes_per_s"], rel=1e-6)
    s = x["sampled"]
    assert s["slope"].startswith("the greedy decode slope at batch 8: no decode-loop fit")
    assert s["first_sampled_verdict_after_load_s"] == pytest.approx(s["greedy_verdict_after_load_s"] + s["first_sampled_s"])
    assert set(s["goals"]) == {"first_sampled_verdict_after_load_s", "further_sampled_variant_s"}
    from diag.bench.render import render
    assert f"combined from: {LOAD.name} (git 9d5093a, " in render([out])


def test_combine_refuses_other_devices_and_files_that_are_not_results(tmp_path, capsys):
    from diag.bench.combine import combine

    h200 = BENCH / "gpu-h200-repeat.json"
    with pytest.raises(DiagError) as err:
        combine([LOAD, h200])
    assert err.value.field == "machine.gpu" and err.value.file == str(h200) and "H200" in err.value.found
    other = tmp_path / "x.json"
    other.write_text(json.dumps({"rows": []}))
    with pytest.raises(DiagError) as err:
        combine([LOAD, other])
    assert err.value.file == str(other) and "not a bench result" in err.value.message
    cut = tmp_path / "cut.json"                   # a call stopped at its limit: its e2e is not taken
    e2e = json.loads(E2E.read_text())
    cut.write_text(json.dumps({**e2e, "sections": {"e2e": {**e2e["sections"]["e2e"], "incomplete": "stopped"}}}))
    got = combine([LOAD, cut])
    assert "e2e" not in got["sections"] and got["combined_from"][1]["sections"] == []
    with pytest.raises(DiagError, match="at least two"):
        combine([LOAD])
    old = tmp_path / "old.json"
    shutil.copy(E2E, old)
    old.write_text(json.dumps({**json.loads(E2E.read_text()), "bench_version": -1}))
    with pytest.raises(DiagError) as err:
        combine([LOAD, old])
    assert err.value.field == "bench_version"
    capsys.readouterr()
    assert main(["bench", "combine", str(LOAD), str(E2E)]) != 0
    assert "field:    --out" in capsys.readouterr().err
