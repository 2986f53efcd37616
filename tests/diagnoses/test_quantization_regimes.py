"""Quantization regimes compared: the section's report.json shape (keys absent for a regime the
run did not evaluate), its round trip, verdicts, Markdown and drift plot, and the per-regime
numbers on hand-made passes."""

import json
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from diag.diagnoses.quantization_regimes import (QuantizationRegimes, RegimesSection, argmax_agreement,
                                                 drift_table, point_order)
from diag.diagnoses.typed import from_json, to_json

POINTS = ["embed", "L2", "L3", "final"]
MOVED = {"embed": (1.0, 0.0), "L2": (0.97, 0.2), "L3": (0.95, 0.3), "final": (0.9, 0.4)}
REPORT = {   # report.json's "regimes", key for key in the order it is written
    "reference": "as-loaded", "layout": "embed+L2+L3", "tree": "chain-2", "points": POINTS,
    "regimes": [{"regime": "as-loaded", "argmax_agreement": 1.0,
                 "drift": {p: {"cosine": 1.0, "relative_l2": 0.0} for p in POINTS},
                 "accept_length": 1.5, "accept_length_ci95": [1.2, 1.8]},
                {"regime": "w4a16-g32", "argmax_agreement": 0.93,
                 "drift": {p: {"cosine": c, "relative_l2": r} for p, (c, r) in MOVED.items()},
                 "accept_length": 1.25, "accept_length_ci95": [1.1, 1.4],
                 "vs_reference": {"difference": -0.25, "ci95": [-0.4, -0.1]}},
                {"regime": "fp8", "argmax_agreement": 0.99,                  # not evaluated on the layout
                 "drift": {p: {"cosine": 0.99, "relative_l2": 0.1} for p in POINTS}}],
    "cross": [{"features": "w4a16-g32", "tokens": "as-loaded", "accept_length": 1.3},
              {"features": "as-loaded", "tokens": "w4a16-g32", "accept_length": 1.45},
              {"features": "as-loaded", "tokens": "as-loaded", "accept_length": 1.5}],
}
Q = QuantizationRegimes()


def test_round_trip_keeps_absent_keys_absent():
    sec = from_json(RegimesSection, REPORT)
    assert sec.regimes[2].evaluated is None and sec.regimes[0].evaluated.vs_reference is None
    assert sec.regimes[1].drift["L3"].cosine == 0.95 and sec.crossed("as-loaded", "w4a16-g32") == 1.45
    assert json.dumps(to_json(sec)) == json.dumps(REPORT)             # same keys, same order
    assert Q.read({"regimes": REPORT}) == sec and Q.key == "regimes" and Q.name == "quantization_regimes"


def test_schema_from_the_types():
    schema = Q.schema()
    assert schema["required"] == ["reference", "layout", "tree", "points", "regimes", "cross"]
    row = schema["properties"]["regimes"]["items"]
    assert row["required"] == ["regime", "argmax_agreement", "drift"]
    assert set(row["properties"]) == {"regime", "argmax_agreement", "drift", "accept_length",
                                      "accept_length_ci95", "vs_reference"}
    v = jsonschema.Draft202012Validator(schema)
    assert not list(v.iter_errors(REPORT))
    assert list(v.iter_errors({**REPORT, "points": ["layer2"]}))
    bad_drift = {**REPORT, "regimes": [{**REPORT["regimes"][0], "drift": {"layer2": {"cosine": 1.0,
                                                                                       "relative_l2": 0.0}}}]}
    assert list(v.iter_errors(bad_drift))


def test_verdict_names_the_worst_point_of_the_layout_and_the_cross_matrix():
    sec = from_json(RegimesSection, REPORT)
    (v,) = Q.verdicts(sec)                     # the reference and the unevaluated fp8 say nothing
    assert v.kind == "quantization" and v.severity == "warning"          # [-0.4, -0.1] lies below zero
    assert "accept length 1.25 vs 1.50 on embed+L2+L3, chain-2 (difference -0.25" in v.text
    assert "largest drift of the layout's points at L3 (cosine 0.9500" in v.text      # final is not in the layout
    assert "give 1.30 (the inputs moved)" in v.text and "give 1.45 (the answers moved)" in v.text
    assert v.evidence == REPORT["regimes"][1]


def test_markdown_and_plot(tmp_path: Path):
    sec = from_json(RegimesSection, REPORT)
    (plot,) = Q.plots(sec, {"regimes": REPORT}, tmp_path)
    assert plot["file"] == "plots/drift.png" and (tmp_path / "plots" / "drift.png").read_bytes()[:4] == b"\x89PNG"
    md = Q.markdown(sec, {"regimes": REPORT, "plots": [plot]})
    assert md[0] == "## Quantization regimes"
    assert "| w4a16-g32 | 0.930 | 1.25 | -0.25 [-0.40, -0.10] | 1.000 / 0.000 | 0.970 / 0.200 |" in "\n".join(md)
    assert "| fp8 | 0.990 | – | – |" in "\n".join(md)
    assert f"![{plot['title']}](plots/drift.png)" in md


def test_agreement_and_drift_on_hand_made_passes():
    ref = SimpleNamespace(argmax=[torch.tensor([1, 2, 3, 4])], states={"L1": [torch.ones(4, 2)]})
    other = SimpleNamespace(argmax=[torch.tensor([1, 2, 0, 4])], states={"L1": [2 * torch.ones(4, 2)]})
    assert argmax_agreement(ref, other) == 0.75
    d = drift_table(ref, other, ["L1"])["L1"]
    assert d.cosine == pytest.approx(1.0) and d.relative_l2 == pytest.approx(1.0)    # |2x - x| / |x|
    assert sorted(["final", "L10", "embed", "L2"], key=point_order) == ["embed", "L2", "L10", "final"]
