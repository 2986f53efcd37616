"""What code outside the engine packages asks through the protocol instead of naming an engine:
the accept rates reports carry, lint's cross-check, `diag explain`'s logged pair, the listing
order of registered layer-id conventions."""

import json
from pathlib import Path

import pytest

from diag.engines import conventions, engine, families, family_rules, report_rates, report_rates_texts, rules
from diag.errors import DiagError
from diag.metrics import AcceptCounts, summary
from diag.report.sections.head import primary_table


def test_reported_rates_are_the_engines_in_registry_order():
    rates = report_rates()
    assert [r.field for r in rates] == [r.field for f in families() for r in family_rules(f).report_rates]
    assert len({r.field for r in rates}) == len(rates) and len({r.column for r in rates}) == len(rates)
    c = AcceptCounts.from_accepted([0, 2, 2, 1], 3, 4)
    sm = summary(c, tuple((r.field, r.rate) for r in rates))
    keys = list(sm)
    # the rates sit after the accept lengths and before the per-depth acceptance, as report.json has them
    between = keys[keys.index("accept_length_no_bonus") + 1: keys.index("acceptance_at_depth")]
    assert between == [r.field for r in rates]
    assert sm["sglang_accept_rate"] == pytest.approx(5 / 12) and sm["sglang_accept_rate_legacy"] == pytest.approx(9 / 16)
    assert "sglang_accept_rate" not in summary(c)          # no engine asked: no engine's rate
    assert report_rates_texts() == ("SGLang's accept rate as 0.5.11+ and as ≤ 0.5.10 log it",)


def test_the_head_table_has_a_column_per_reported_rate():
    """reports/examples/demo's head table: one column per ReportRate, its cells the rate fields."""
    rep = json.loads((Path(__file__).resolve().parents[1] / "reports/examples/demo/report.json").read_text())
    lines = primary_table(rep)
    cols = [c.strip() for c in next(line for line in lines if line.startswith("| layout")).strip("|").split("|")]
    rates = report_rates()
    assert cols[6: 6 + len(rates)] == [r.column for r in rates] == ["sglang rate", "legacy rate"]
    assert any(t in lines[2] for t in report_rates_texts())


def test_each_engine_answers_the_cross_check_its_own_way():
    sg, vl = rules("sglang-0.5.23"), rules("vllm-0.32.0")
    argv = ["--model-path", "t", "--speculative-algorithm", "EAGLE3"]
    eff = sg.effective_config(sg.parse_launch(["python", "-m", "sglang.launch_server", *argv],
                                              release=engine("sglang-0.5.23")), None, release=engine("sglang-0.5.23"))
    problems = sg.cross_check(eff, argv)
    assert problems and problems[0].code.startswith("SGLANG_")       # unavailable here, or what ServerArgs said
    assert vl.cross_check(eff, argv) == []


def test_explain_logged_goes_to_the_family_that_logs_the_pair():
    e = rules("sglang-0.5.10").explain_logged(1.68, 0.84, num_steps=None, topk=None, num_draft_tokens=None,
                                              architecture="LlamaForCausalLM", decimals=2,
                                              release=engine("sglang-0.5.10"))
    assert e.to_json()["consistent"] == [{"num_draft_tokens": 2, "formula": "sglang_accept_rate_legacy"}]
    assert e.engine_fits is True
    with pytest.raises(DiagError, match="counters"):
        rules("vllm-0.32.0").explain_logged(1.68, 0.84, num_steps=None, topk=None, num_draft_tokens=None,
                                            architecture="LlamaForCausalLM", decimals=2, release=None)


def test_registered_conventions_list_in_registry_order_whatever_imported_first(monkeypatch):
    before = list(conventions.all_conventions())
    monkeypatch.setattr(conventions, "_REGISTERED", dict(reversed(list(conventions._REGISTERED.items()))))
    assert list(conventions.all_conventions()) == before
    assert before.index("sglang-llama") < before.index("vllm") < before.index("eagle-reference")
