"""Assertions over a finished report, for diagnostic test suites (pytest or plain Python).

    from diag.assertions import assert_serving_layout_is_trained, assert_accept_length_at_least
    def test_deployment(diag_run):                     # the pytest plugin's session fixture
        assert_serving_layout_is_trained(diag_run)
        assert_accept_length_at_least(diag_run, 2.5, tree="chain-3")
        assert_accept_length_at_least(diag_run, 1.4, decoding="t1.0-p0.95-k-1")   # a sampled decoding

Every failure message quotes the numbers it compared and the report path, so a failing CI
run points straight at the report to attach to a ticket. The helpers read report.json
fields only (the same numbers as report.md and the terminal table); they compute nothing
but comparisons. A request the report cannot answer (no such variant) is the caller's
mistake and raises DiagError, not AssertionError. `decoding` (default: the decoding the server
runs, the report's reference) is "greedy" or a sampled decoding's name; under sampling the
numbers compared are the exact per-round expectations the verdicts rank by.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from diag.engines.decoding import parse_decoding
from diag.errors import DiagError
from diag.replay.evaluation import Evaluation, reference_axes, select
from diag.report.compare import load_report
from diag.trees import tree_shape

DECLARED_ROLE = "declared (diag_trained_layout)"


@dataclass(frozen=True)
class DiagReport:
    """A report dict and the directory it was written to (None when it came from memory)."""

    report: dict
    path: Path | None = None

    @classmethod
    def load(cls, path: str | Path) -> "DiagReport":
        rep, file = load_report(path)
        return cls(rep, file.parent)

    def __getitem__(self, key: str):
        return self.report[key]

    @property
    def where(self) -> str:
        return f"report: {self.path / 'report.md'}" if self.path else "report: (in memory, no path)"


def as_report(report) -> DiagReport:
    """DiagReport, a report dict, or a report directory / report.json path -> DiagReport."""
    if isinstance(report, DiagReport):
        return report
    if isinstance(report, dict):
        return DiagReport(report)
    if isinstance(report, (str, Path)):
        return DiagReport.load(report)
    raise DiagError("not a diag report", field="report", expected="DiagReport, report dict or path",
                    found=type(report).__name__)


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def assert_no_error_verdicts(report) -> None:
    r = as_report(report)
    errors = [v for v in r["verdicts"] if v["severity"] == "error"]
    if errors:
        lines = [f"{len(errors)} error verdict(s):"] + [f"  - {v['text']}" for v in errors]
        raise AssertionError("\n".join(lines + [r.where]))


def serving_candidate(rep: dict) -> dict | None:
    """The candidate the report says the server feeds (role "serving"), if any."""
    return next((c for c in rep["candidates"] if "serving" in c["roles"]), None)


def _verdict(rep: dict, *kinds: str) -> dict | None:
    return next((v for v in rep["verdicts"] if v["kind"] in kinds), None)


def _measured(rep: dict) -> str:
    v = _verdict(rep, "layout-mismatch", "layout-match")
    return f"measured: {v['text']}" if v else "measured: no layout verdict (no verify rounds)"


def _layout_verdicts_at(rep: dict, decoding: str) -> list[dict]:
    """The layout verdicts at another decoding than the report's reference, from the same rule
    (diag.run.verdicts.layout) over the report's evaluations."""
    from diag.run.verdicts.layout import layout_verdicts
    spec = rep["case"]["spec"]["evaluate"]
    run = SimpleNamespace(evaluations=[Evaluation.from_json(e) for e in rep["evaluations"]],
                          reference=reference_axes(rep).but(decoding=decoding),
                          candidates=[SimpleNamespace(label=c["label"], roles=c["roles"]) for c in rep["candidates"]],
                          case=SimpleNamespace(evaluate=SimpleNamespace(seed=spec["seed"], bootstrap=spec["bootstrap"])),
                          prompts=rep["prompts"])
    return [v.to_json() for v in layout_verdicts(run)]


def _decoding_name(rep: dict, decoding) -> str | None:
    """None (the reference) or a decoding's canonical name."""
    return None if decoding is None else parse_decoding(decoding, field="decoding").name


def assert_serving_layout_is_trained(report, *, decoding=None) -> None:
    """The server must feed the layout the drafter was trained on.

    Fails when (0) the drafter predicts nothing on any layout (a drafter-predicts-nothing
    verdict: no layout can be checked); (1) the measurement says so (a layout-mismatch
    verdict: the serving layout is not among the layouts statistically indistinguishable from
    the best); (2) the server runs
    --speculative-algorithm EAGLE (the drafter sees `final`, never a trained layout); or (3)
    the drafter's config states its trained layout (diag_trained_layout) and the serving
    layout differs, whether or not these prompts can tell the two apart. (1) is judged at
    `decoding` (default: the decoding the server runs)."""
    r = as_report(report)
    rep = r.report
    serving = serving_candidate(rep)
    if serving is None:
        raise AssertionError(f"the report names no serving layout\n{r.where}")
    floor = _verdict(rep, "drafter-predicts-nothing")
    if floor:
        raise AssertionError(f"the drafter predicts nothing on any layout\n{floor['text']}\n{r.where}")
    name = _decoding_name(rep, decoding)
    if name is not None and name != reference_axes(rep).decoding:
        if not select([Evaluation.from_json(e) for e in rep["evaluations"]], reference_axes(rep), decoding=name):
            raise DiagError("the report has no evaluation at this decoding", file=str(r.path), field="decoding",
                            expected=sorted({e.get("decoding", "greedy") for e in rep["evaluations"]}), found=name)
        rep = {**rep, "verdicts": _layout_verdicts_at(rep, name)}
    bad = _verdict(rep, "layout-mismatch")
    if bad:
        ev = bad["evidence"]
        raise AssertionError(
            f"serving layout {ev['serving']} is not the trained layout {ev['trained']}: accept length "
            f"{_f(ev['serving_accept_length'])} served vs {_f(ev['trained_accept_length'])} trained "
            f"(difference {ev['difference']:+.2f}, 95% CI [{ev['ci95'][0]:+.2f}, {ev['ci95'][1]:+.2f}] "
            f"over {ev['prompts']} prompts)\n{bad['text']}\n{r.where}")
    if serving["mode"] == "eagle":
        raise AssertionError(f"the server runs --speculative-algorithm {rep['case']['spec']['serving']['algorithm']}"
                             f": the drafter is fed {serving['layout']}, not a layout it was trained on\n"
                             f"{r.where}")
    declared = next((c for c in rep["candidates"] if DECLARED_ROLE in c["roles"]), None)
    if declared and declared["label"] != serving["label"]:
        raise AssertionError(
            f"serving layout {serving['label']} is not the trained layout {declared['label']} "
            f"(declared in the drafter config: {'; '.join(declared['rules'])})\n{_measured(rep)}\n{r.where}")


def find_evaluation(report, *, tree: str | None = None, layout: str | None = None, mode: str = "eagle3",
                    regime: str | None = None, decoding=None) -> dict:
    """The one evaluation matching the filters, at the report's reference for every axis not
    given. Defaults: the case's first tree, the serving layout, the reference regime
    (features and tokens both), the decoding the server runs."""
    r = as_report(report)
    rep = r.report
    if not rep["evaluations"]:
        raise DiagError("the report has no evaluations", file=str(r.path), field="evaluations",
                        expected="at least one variant", found="[]")
    where = reference_axes(rep).but(mode=mode)
    if tree:
        where = where.but(tree=tree_shape(tree).name)
    if regime:
        where = where.but(regime=regime, tokens_regime=regime)
    if decoding is not None:
        where = where.but(decoding=_decoding_name(rep, decoding))
    if layout is None:
        serving = serving_candidate(rep)
        layout = serving["label"] if serving else None
    where = where.but(layout=layout)
    evals = [Evaluation.from_json(e) for e in rep["evaluations"]]
    hits = select(evals, where)
    if len(hits) != 1:
        raise DiagError("no single evaluation matches", file=str(r.path), field="evaluations",
                        expected=f"one of {sorted(e.key for e in evals)}",
                        found=f"{where.key} ({len(hits)} matches)")
    return next(e for e in rep["evaluations"] if e["key"] == hits[0].key)


def assert_accept_length_at_least(report, minimum: float, *, tree: str | None = None,
                                  layout: str | None = None, mode: str = "eagle3",
                                  regime: str | None = None, decoding=None) -> None:
    """Trajectory accept length (bonus included) of one variant must reach `minimum`; under a
    sampled decoding, its exact expectation (the Monte-Carlo value is quoted beside it)."""
    r = as_report(report)
    e = find_evaluation(r, tree=tree, layout=layout, mode=mode, regime=regime, decoding=decoding)
    sampled = e.get("expected_accept_length") is not None
    got = e["expected_accept_length"] if sampled else e["accept_length"]
    if got is None or got < minimum:
        lo, hi = e["expected_accept_length_ci95"] if sampled else e["accept_length_ci95"]
        how = (f"exact expectation under {e['decoding']} over {len(e['seeds'])} seeds, Monte-Carlo "
               f"{_f(e['accept_length'])}; " if sampled else "")
        raise AssertionError(
            f"accept length {_f(got)} ({how}95% CI {_f(lo)}-{_f(hi)}, {e['trajectory']['rounds']} rounds) for "
            f"{e['layout']} {e['mode']} {e['tree']} {e['regime']} is below {minimum:.2f}\n{r.where}")


def assert_speculation_pays(report, *, tree: str | None = None, layout: str | None = None,
                            decoding=None) -> None:
    """Predicted speedup over plain decoding must exceed 1 for one variant (default: the
    serving layout on the case's first tree), from the report's speedup section: accept
    length against the break-even accept length at the run's step costs (DESIGN.md §6)."""
    r = as_report(report)
    e = find_evaluation(r, tree=tree, layout=layout, decoding=decoding)
    sp = r.report.get("speedup")
    row = next((x for x in (sp or {}).get("rows", []) if x["key"] == e["key"]), None)
    if row is None:
        raise DiagError("the report has no speedup row for this variant", file=str(r.path), field="speedup",
                        expected=f"a row with key {e['key']}", found="none (no step costs measured or given)")
    if row.get("speedup") is None or row["speedup"] <= 1.0:
        raise AssertionError(
            f"speculation does not pay for {e['layout']} on {e['tree']}: accept length {_f(row.get('accept_length'))}"
            f" vs break-even {_f(row['break_even_accept_length'])}, predicted {_f(row.get('speedup'))}x plain "
            f"decoding (costs {sp['source']})\n{r.where}")
