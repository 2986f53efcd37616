"""`diag run --engine sglang-0.5.23 --engine vllm-0.32.0` (issue 32, deliverable 3): both engines' served
layouts evaluated from one target pass, and which engine runs the drafter as it was trained.

The demo pair's drafter was trained on embed+L2+L4 and its config writes vLLM's ids [0, 2, 4]:
SGLang 0.5.23 adds 1 to each (L1+L3+L5), vLLM 0.32.0 reads them literally (embed+L2+L4)."""

import json
from dataclasses import replace

import jsonschema
import pytest

from diag.cli.main import main
from diag.errors import DiagError
from diag.run.case import parse_case, read_case, with_engine
from diag.run.shipped import shipped
from test_report import SCHEMA

BASE = {"version": 1, "name": "two", "target": {"path": "zoo:llama-tiny"}, "drafter": {"path": "zoo:x"},
        "prompts": {"file": "p.jsonl"}}


def test_engines_are_named_in_a_list_the_first_served():
    c = parse_case({**BASE, "serving": {"engine": ["0.5.23", "vllm-0.32.0"]}}, "c.toml")
    assert c.serving.engine == "sglang-0.5.23" and c.serving.engines == ("sglang-0.5.23", "vllm-0.32.0")
    c = parse_case({**BASE, "serving": {"engine": "vllm-0.32.0", "engines": ["sglang-0.5.23"]}}, "c.toml")
    assert c.serving.engines == ("vllm-0.32.0", "sglang-0.5.23")
    one = parse_case({**BASE, "serving": {"engine": "0.5.23"}}, "c.toml")
    assert one.serving.engines == () and with_engine(one, ["vllm-0.32.0"]).serving == \
        replace(one.serving, engine="vllm-0.32.0")
    with pytest.raises(DiagError) as err:
        parse_case({**BASE, "serving": {"engines": ["sglang-0.5.23", "vllm-9.9.9"]}}, "c.toml")
    assert err.value.field == "serving.engines" and err.value.file == "c.toml"


@pytest.mark.slow
def test_one_pass_says_which_engine_runs_the_drafter_as_trained(tmp_path):
    out = tmp_path / "two"
    assert main(["run", str(shipped("cases/demo.toml")), "--engine", "sglang-0.5.23", "--engine", "vllm-0.32.0",
                 "--limit", "8", "--tree", "chain-3", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    jsonschema.validate(rep, SCHEMA)
    sec = rep["engines"]
    rows = {r["engine"]: r for r in sec["rows"]}
    assert sec["trained_layout"] == "embed+L2+L4" and sec["tree"] == "chain-3"
    assert rows["sglang-0.5.23"]["served"] == "L1+L3+L5" and not rows["sglang-0.5.23"]["as_trained"]
    assert rows["vllm-0.32.0"]["served"] == "embed+L2+L4" and rows["vllm-0.32.0"]["as_trained"]
    assert rows["vllm-0.32.0"]["accept_length"] == sec["trained_accept_length"]
    assert rows["sglang-0.5.23"]["difference"] < -1.0
    v = next(v for v in rep["verdicts"] if v["kind"] == "engines")
    assert v["text"].startswith("vLLM 0.32.0 runs the drafter as it was trained (`embed+L2+L4`")
    assert "SGLang 0.5.23 feeds `L1+L3+L5` (eagle3)" in v["text"]
    md = (out / "report.md").read_text()
    assert "## Engines compared" in md and "| vLLM 0.32.0 | `embed+L2+L4` (eagle3) |" in md
    served = {c["label"]: c["roles"] for c in rep["candidates"]}
    assert "served by vllm-0.32.0" in served["embed+L2+L4"] and "served by sglang-0.5.23" in served["L1+L3+L5"]


def test_a_single_engine_run_has_no_engines_section():
    case = read_case(shipped("cases/demo.toml"))
    assert case.serving.engines == ()
    from diag.report.envelope import case_hash
    assert case_hash(case) == case_hash(replace(case, serving=replace(case.serving, engines=())))
    assert case_hash(case) != case_hash(with_engine(case, ["sglang-0.5.23", "vllm-0.32.0"]))
