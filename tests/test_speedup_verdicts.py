"""Issue 16.8: step costs measured on this machine are a measurement with its spread, never a
verdict. Over 18 identical runs they gave 0.17x to 3.35x and flipped "SPECULATION DOES NOT PAY";
now two identical runs give the same verdicts, a break-even below 1 is flagged as a measurement
error, and user costs that imply one are refused."""

from dataclasses import replace

import pytest

import tiny
from diag.diagnoses.pricing.model import StepCosts
from diag.diagnoses.pricing.section import speedup_section
from diag.diagnoses.pricing.verdicts import MEASURED, speedup_verdicts
from diag.diagnoses.protocol import Offered
from diag.errors import DiagError
from diag.run.case import check_case, parse_case, read_case
from diag.run.pipeline import run_case
from test_reconcile import candidates

MS = 1e-3
TRAINED = "embed+L3+L31"


def _priced(costs, basis="measured"):
    evals = candidates()
    keys = tuple(e.key for e in evals if e.layout == TRAINED and e.mode == "eagle3")
    return speedup_section(evals, costs, "measured by diag", basis=basis, trained_layout=TRAINED, trained_keys=keys)


@pytest.mark.parametrize("verify_ms", [40.0, 12.0])       # 0.2x-ish and 1.7x-ish at accept length 2.5
def test_measured_costs_give_one_fixed_verdict_whatever_they_say(verify_ms):
    costs = StepCosts(10 * MS, 1 * MS, {2: verify_ms * MS, 4: verify_ms * MS, 5: verify_ms * MS})
    sec = _priced(costs)
    (v,) = speedup_verdicts(sec)
    assert (v.kind, v.severity, v.text, v.evidence) == ("speedup", "info", MEASURED, {"costs_basis": "measured"})
    user = speedup_verdicts(replace(sec, basis="user"))
    assert user[0].kind == ("speedup" if verify_ms > 20 else "tree-choice")
    assert TRAINED in user[0].text and user[0].evidence["layout"] == TRAINED


def test_a_server_calibrated_speedup_offered_by_another_section_silences_them():
    sec = replace(_priced(StepCosts(10 * MS, 1 * MS, {2: 40 * MS})), basis="user")

    class Calibrated:
        calibrated_speedup = {"basis": "server"}

    assert speedup_verdicts(sec, Offered({"x": Calibrated()})) == []
    assert speedup_verdicts(sec, Offered({"x": sec}))        # nothing offered: the user's costs decide


def test_break_even_below_one_is_a_measurement_error():
    costs = StepCosts(10 * MS, 0.5 * MS, {2: 4 * MS, 4: 6 * MS, 5: 30 * MS})
    rows = {r.tree: r for r in _priced(costs).rows}
    assert rows["chain-1"].measurement_error and rows["chain-1"].break_even_accept_length < 1
    assert not rows["s3-k4-d5"].measurement_error


def test_user_costs_cheaper_than_a_decode_step_are_refused():
    data = {"version": 1, "name": "c", "target": {"path": "t"}, "drafter": {"path": "d"},
            "prompts": {"file": "p.jsonl"}, "evaluate": {"layouts": ["embed+L2+L4"]},
            "speedup": {"t_decode_ms": 11.0, "t_draft_ms": 1.0, "t_verify_ms": {"4": 9.0}}}
    with pytest.raises(DiagError, match="cannot cost less than one plain decode step") as e:
        check_case(parse_case(data, "case.toml"))          # case values are checked after the overrides
    assert "speedup.t_verify_ms.4" in str(e.value) and "case.toml" in str(e.value) and "9.0" in str(e.value)


def test_two_identical_runs_give_the_same_verdicts(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    case = read_case(tiny.write_case(tmp_path / "case.toml", tiny.make_target(tmp_path / "t"),
                                     tiny.make_drafter(tmp_path / "d"), tiny.make_prompts(tmp_path / "p.jsonl", n=2),
                                     trees=["chain-2", "s2-k2-d4"]))
    a, b = (run_case(case, progress=False, use_cache=False) for _ in range(2))
    sa, sb = a.diagnoses["pricing"], b.diagnoses["pricing"]
    assert sa.basis == sb.basis == "measured"
    assert sa.spread.t_decode.min <= sa.spread.t_decode.median <= sa.spread.t_decode.max
    assert [v.to_json() for v in a.verdicts] == [v.to_json() for v in b.verdicts]
    assert not any("SPECULATION DOES NOT PAY" in v.text for v in a.verdicts + b.verdicts)
