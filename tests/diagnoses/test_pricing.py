"""The pricing diagnosis (diag/diagnoses/pricing/, report key `speedup`): the worked example of
a priced row, the typed section through report.json (internal fields left out) and its generated
schema, the verdict on user costs, the Markdown and the plot."""

import json
from dataclasses import replace

import jsonschema
import pytest

from diag.diagnoses import DIAGNOSES
from diag.diagnoses.pricing import Pricing
from diag.diagnoses.pricing.model import StepCosts
from diag.diagnoses.pricing.section import CostSpread, Spread, SpeedupSection, speedup_section
from diag.diagnoses.typed import from_json, to_json
from test_reconcile import candidates

MS = 1e-3
TRAINED = "embed+L3+L31"


def _section(basis="user"):
    """The hand-made candidates with every axis concrete (as a run's records are), priced."""
    evals = [replace(e, axes=e.axes.but(rendering="auto", decoding="greedy")) for e in candidates()]
    keys = tuple(e.key for e in evals if e.layout == TRAINED)
    costs = StepCosts(11.1 * MS, 3 * MS, {2: 12 * MS, 4: 13 * MS, 5: 14 * MS})
    return evals, speedup_section(evals, costs, "user (case [speedup])", basis=basis, trained_layout=TRAINED,
                                  trained_keys=keys)


def test_the_section_round_trips_through_report_json_without_its_internal_fields():
    evals, sec = _section()
    row = next(r for r in sec.rows if r.key == evals[2].key)             # embed+L3+L31 on chain-3
    # t_verify(4) 13 ms + 3 steps x 3 ms = 22 ms a round; break-even 22 / 11.1 = 1.98
    assert row.round_cost_s == pytest.approx(22 * MS) and row.break_even_accept_length == pytest.approx(22 / 11.1)
    back = json.loads(json.dumps(to_json(sec)))
    assert list(back) == ["source", "basis", "costs", "spread", "repeats", "rows"]
    assert list(back["rows"][0])[:3] == ["shape", "round_cost_s", "t_verify_s"] and back["costs"]["t_verify"]["4"] == 13 * MS
    assert not list(jsonschema.Draft202012Validator(Pricing().schema()).iter_errors(back))
    again = from_json(SpeedupSection, back)
    assert again.rows == sec.rows and again.trained_keys == () and again.trained_layout is None
    assert Pricing().read({"speedup": back}) == again


def test_measured_costs_keep_their_spread_typed():
    """costs.py's spread (seconds, each cost's min / median / max) as CostSpread, written back unchanged."""
    evals, _ = _section()
    spread = {"t_decode": {"min": 0.0029, "median": 0.0034, "max": 0.0073},
              "t_draft": {"min": 0.0006, "median": 0.0007, "max": 0.0050},
              "t_verify": {"2": {"min": 0.0035, "median": 0.0074, "max": 0.0086}},
              "t_draft_extend": {"min": 0.0005, "median": 0.0006, "max": 0.0009}}
    sec = speedup_section(evals, StepCosts(2.9 * MS, 0.6 * MS, {2: 3.5 * MS}), "measured", basis="measured",
                          spread=spread, repeats=5)
    assert isinstance(sec.spread, CostSpread) and sec.spread.t_verify["2"] == Spread(0.0035, 0.0074, 0.0086)
    back = json.loads(json.dumps(to_json(sec)))
    assert back["spread"] == spread and list(back["spread"]) == list(spread)
    assert Pricing().read({"speedup": back}) == sec
    check = jsonschema.Draft202012Validator(Pricing().schema())
    assert not list(check.iter_errors(back))
    back["spread"]["t_verify"]["x"] = back["spread"]["t_verify"]["2"]
    assert list(check.iter_errors(back))
    assert any("Measured on this machine, 5 calls each (decode 2.90 / 3.40 / 7.30 ms" in line
               for line in Pricing().markdown(sec, {"evaluations": [], "reference": {}}))


def test_user_costs_give_a_tree_choice_or_speculation_does_not_pay():
    _, sec = _section()
    (v,) = Pricing().verdicts(sec)
    assert v.kind == "tree-choice" and f"on {TRAINED}" in v.text
    assert [s[0] for s in v.evidence["shapes"]] == ["chain-1", "chain-3", "s3-k4-d5"]


def test_markdown_and_plot_from_the_read_back_section(tmp_path):
    evals, sec = _section()
    rep = {"evaluations": [e.to_json() for e in evals], "candidates": [],
           "reference": {"layout": None, "mode": "eagle3", "tree": "chain-3", "regime": "as-loaded",
                         "tokens_regime": "as-loaded", "rendering": "auto", "decoding": "greedy"},
           "plots": [{"file": "plots/speedup.png", "title": "T"}]}
    read = Pricing().read({"speedup": to_json(sec)})
    md = Pricing().markdown(read, rep)
    assert md[0] == "## Will speculation pay?" and "![T](plots/speedup.png)" in md
    assert any(line.startswith("| chain-3 | 22.00 ms | 1.98 |") for line in md)
    (made,) = Pricing().plots(read, rep, tmp_path)
    assert made["file"] == "plots/speedup.png" and (tmp_path / made["file"]).read_bytes()[:4] == b"\x89PNG"


def test_its_report_key_is_speedup_and_it_sits_first_on_the_serving_side():
    d = next(d for d in DIAGNOSES if d.name == "pricing")
    assert d.key == "speedup" and DIAGNOSES[0] is d
