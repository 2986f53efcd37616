"""The live_serving diagnosis (diag/diagnoses/live_serving/, report key `server`): the seed's
numbers through prepare-free pieces, the typed section through report.json and its schema, the
verdicts (the calibrated speedup last, offered to the pricing diagnosis), ENGINE DEFECT leading,
and the Markdown of the read-back section."""

import json
from dataclasses import replace

from pathlib import Path

import jsonschema

import diag
from diag.diagnoses.hooks import report_schema

from diag.diagnoses.live_serving import LiveServing
from diag.diagnoses.live_serving.inputs import read_server
from diag.diagnoses.live_serving import parts
from diag.diagnoses.live_serving.parts import Sanity
from diag.diagnoses.live_serving.section import ServerSection, server_section
from diag.diagnoses.pricing.verdicts import speedup_verdicts
from diag.diagnoses.protocol import Offered
from diag.diagnoses.typed import from_json, to_json
from test_reconcile import IDS, KIMI, REF, candidates, case
from test_speedup_verdicts import StepCosts, _priced


def _seed(tmp_path):
    """The seed's rates on the hand-made candidates, every axis concrete (as a run's records are)."""
    obs = read_server(case(tmp_path, baseline_tokens_per_second=90.0, tokens_per_second=82.3, accept_length=2.2,
                           tree="s3-k4-d5"), IDS, KIMI)
    concrete = {"rendering": "auto", "decoding": "greedy"}
    evals = [replace(e, axes=e.axes.but(**concrete)) for e in candidates()]
    return server_section(obs, evals, REF.but(**concrete), "embed+L3+L31", seed=0, n_boot=200,
                          served_layout="embed+L3+L31")


def test_the_section_round_trips_through_report_json(tmp_path):
    sec = _seed(tmp_path)
    back = json.loads(json.dumps(to_json(sec)))
    assert list(back) == ["observed", "reconciliation", "trained_layout", "trained", "speedup", "concurrency",
                          "simulate", "sanity"]
    assert back["trained"][0] == {"key": "embed+L3+L31|eagle3|chain-1|as-loaded", "tree": "chain-1",
                                  "accept_length": sec.trained[0].accept_length,
                                  "accept_length_ci95": list(sec.trained[0].accept_length_ci95)}
    full = report_schema(json.loads((Path(diag.__file__).parent / "schema" / "report.schema.json").read_text()))
    # the section's parts name the report's shared definitions (axes): validated inside the whole schema
    schema = {"$defs": full["$defs"], "$ref": "#/$defs/server"}
    assert full["$defs"]["server"] == LiveServing().schema()
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(back))
    assert list(jsonschema.Draft202012Validator(schema).iter_errors({**back, "trained_keys": []}))
    read = LiveServing().read({"server": back})
    assert read == from_json(ServerSection, back) and to_json(read) == back and read.trained_keys == ()
    md = LiveServing().markdown(read, {})
    assert md[:2] == ["## The live server", ""]
    assert any(line.startswith("Speedup calibrated from the server: plain 90.0 tok/s, speculative 82.3 tok/s")
               for line in md)
    # the benchmark settings: every engine's (diag/engines/simulate.py), each part worded by its engine
    # (EngineRules.simulation_legend, simulation_cell)
    assert [r["tree"] for r in back["simulate"]] == [t["tree"] for t in back["trained"]]
    assert ("Benchmark the server at diag's predicted acceptance of `embed+L3+L31` (SGLang: environment of the "
            "launch; vLLM: the speculative config):") in md
    chain3 = next(line for line in md if line.startswith("- chain-3 (accept length 2.50): "))
    assert chain3.startswith("- chain-3 (accept length 2.50): `SGLANG_SIMULATE_ACC_LEN=2.50 "
                             "SGLANG_SIMULATE_ACC_METHOD=match-expected python -m sglang.launch_server ...`; vLLM "
                             "`--speculative-config '{\"num_speculative_tokens\": 3, ")


def test_every_part_is_typed_and_the_schema_comes_from_the_types(tmp_path):
    """The seed's section read back from report.json: each part a dataclass of parts.py, read by
    attribute; the engines' simulation fields kept as one spread map in the row's place."""
    back = json.loads(json.dumps(to_json(_seed(tmp_path))))
    read = LiveServing().read({"server": back})
    assert isinstance(read.observed, parts.Observed) and isinstance(read.speedup, parts.Calibration)
    assert read.observed.tree == parts.ServerTree("s3-k4-d5", 3, 4, 5, "server.tree")
    c = read.speedup.costs
    assert (c.shape, round(c.round_s * 1e3, 2), round(c.break_even_accept_length, 2)) == ("s3-k4-d5", 26.73, 2.41)
    assert isinstance(read.speedup.rows[0], parts.PricedRow) and isinstance(read.reconciliation.matches[0], parts.Match)
    row = read.simulate[0]
    assert isinstance(row, parts.SimulateRow) and list(to_json(row)) == list(back["simulate"][0])
    assert list(back["simulate"][0])[:3] == ["key", "tree", "accept_length"] and list(back["simulate"][0])[-1] == "notes"
    assert set(row.engines) == set(back["simulate"][0]) - {"key", "tree", "accept_length", "notes"} != set()
    schema = LiveServing().schema()
    assert "schema.json" not in {p.name for p in (Path(diag.__file__).parent / "diagnoses" / "live_serving").iterdir()}
    assert schema["properties"]["speedup"]["oneOf"][1]["properties"]["costs"]["properties"]["shape"]["pattern"]
    full = report_schema(json.loads((Path(diag.__file__).parent / "schema" / "report.schema.json").read_text()))
    check = jsonschema.Draft202012Validator({"$defs": full["$defs"], "$ref": "#/$defs/server"})
    bad = json.loads(json.dumps(back))
    bad["speedup"]["costs"]["round_s"] = -1.0
    assert list(check.iter_errors(bad))
    bad = json.loads(json.dumps(back))
    del bad["simulate"][0]["notes"]
    assert list(check.iter_errors(bad))
    # the engines' fields are checked by each engine's schema (EngineRules.simulation_schema)
    for change in ({"unknown": 1}, {"sglang_env": {"OTHER": "1"}}, {"vllm_flag": 3}):
        bad = json.loads(json.dumps(back))
        bad["simulate"][0].update(change)
        assert list(check.iter_errors(bad)), change
    bad = json.loads(json.dumps(back))
    del bad["simulate"][0]["vllm_speculative_config"]
    assert list(check.iter_errors(bad))


def test_the_calibrated_speedup_comes_last_and_silences_the_user_costs(tmp_path):
    sec = _seed(tmp_path)
    verdicts = LiveServing().verdicts(sec)
    assert "82.3 tok/s at accept length 2.20 on s3-k4-d5 against 90.0 tok/s plain (0.91x)" in verdicts[-1].text
    assert sec.calibrated_speedup is sec.speedup and sec.speedup.basis == "server"
    user = replace(_priced(StepCosts(10e-3, 1e-3, {2: 40e-3})), basis="user")
    assert speedup_verdicts(user, Offered({"live_serving": sec, "pricing": user})) == []
    assert speedup_verdicts(user, Offered({"pricing": user}))


def test_an_engine_defect_leads(tmp_path):
    sec = replace(_seed(tmp_path), sanity=Sanity("ENGINE DEFECT", "E 1", 2.7, "g", None, 0.4, "m"))
    (v,) = LiveServing().leading(sec)
    assert (v.kind, v.severity, v.text) == ("engine-defect", "error", "m")


def test_the_engine_answers_what_the_live_server_reads():
    """The live server's files are read through the engine protocol (EngineRules): the release
    that wrote them, the baseline log, the running-request default, the log line's fits."""
    import pytest
    from diag.engines import engine, rules
    from diag.errors import DiagError
    sglang, vllm = rules("sglang-0.5.23"), engine("vllm-0.32.0")
    assert sglang.output_release("sglang-0.5.8", field="server.engine", file="c.toml").label == "SGLang 0.5.8"
    with pytest.raises(DiagError, match="cannot read server output") as e:
        sglang.output_release("0.5.1", field="server.engine", file="c.toml")
    assert e.value.field == "server.engine" and e.value.file == "c.toml"
    assert sglang.spec_max_running_requests(engine("sglang-0.5.23")) == 48
    assert (2, "sglang_accept_rate_legacy") in sglang.log_draft_tokens(1.68, 0.84)     # the seed's 0.5.8 line
    assert rules(vllm).output_release("vllm-0.32.0", field="server.engine", file=None) == vllm
    assert rules(vllm).spec_max_running_requests(vllm) is None
    with pytest.raises(DiagError, match="no vLLM baseline log"):
        rules(vllm).read_baseline_log("", source="b.log")
