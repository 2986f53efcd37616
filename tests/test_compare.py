"""`diag compare`: matched variants with both intervals and B - A, verdict changes,
provenance differences, and the command line, on hand-made reports."""

import copy
import json

import pytest
from hypothesis import given, settings, strategies as st

from diag.cli.main import main
from diag.errors import DiagError
from diag.report.compare import _as_rounds, compare, load_report, render_markdown, render_terminal
from diag.stats import accept_length_ci, paired_bootstrap_diff


def evaluation(layout: str, per_prompt: list[tuple[str, int, int]], tree: str = "chain-3") -> dict:
    rounds = sum(r for _, r, _ in per_prompt)
    acc = 1 + sum(s for _, _, s in per_prompt) / rounds
    return {"key": f"{layout}|eagle3|{tree}|as-loaded", "layout": layout, "mode": "eagle3", "tree": tree,
            "regime": "as-loaded", "tokens_regime": "as-loaded", "accept_length": acc,
            "accept_length_ci95": [acc - 0.1, acc + 0.1], "trajectory": {"rounds": rounds},
            "per_prompt": [{"id": i, "rounds": r, "accepted_sum": s} for i, r, s in per_prompt]}


def report(evals: list[dict], verdicts: list[dict], torch: str = "2.13.0") -> dict:
    return {"kind": "diag-report", "schema_version": "1.0", "created": "2026-01-01T00:00:00+00:00",
            "case": {"name": "demo", "hash": "0123456789abcdef"},
            "provenance": {"diag_version": "0.1.0", "git": "a" * 40,
                           "machine": {"python": "3.11", "torch": torch, "transformers": "5.24.0", "cuda": None,
                                       "gpus": []}},
            "target": {"path": "/t", "config_hash": "1111111111111111", "quantization": None},
            "drafter": {"path": "/d", "format": "sglang-eagle3", "config": "2222222222222222"},
            "prompts": {"file": "p.jsonl", "sha256": "3333333333333333", "count": 8},
            "target_pass": {"source": "greedy", "max_new_tokens": 64, "continuation_tokens": 512,
                            "reference_regime": "as-loaded"},
            "verdicts": verdicts, "evaluations": evals}


PROMPTS = [f"p{i}" for i in range(8)]
MISMATCH = {"kind": "layout-mismatch", "severity": "error", "text": "LAYOUT MISMATCH: ...", "evidence": {}}
MATCH = {"kind": "layout-match", "severity": "ok", "text": "matches", "evidence": {}}
EAGLE = {"kind": "eagle-algorithm", "severity": "warning", "text": "If served with EAGLE ...", "evidence": {}}


@pytest.fixture()
def pair():
    """A: served L1+L3+L5 at ~1.3; B: fixed to embed+L2+L4 at ~2.5, same prompts; B also got
    a new torch and lost a variant."""
    a = report([evaluation("L1+L3+L5", [(p, 20, 6 + i % 3) for i, p in enumerate(PROMPTS)]),
                evaluation("embed+L2+L4", [(p, 20, 30) for p in PROMPTS]),
                evaluation("L2+L3+L4", [(p, 20, 10) for p in PROMPTS])], [MISMATCH, EAGLE])
    b = report([evaluation("L1+L3+L5", [(p, 20, 28 + i % 3) for i, p in enumerate(PROMPTS)]),
                evaluation("embed+L2+L4", [(p, 20, 30) for p in PROMPTS]),
                evaluation("embed+L2+L4", [(p, 10, 5) for p in PROMPTS], tree="chain-1")],
               [MATCH, {**EAGLE, "severity": "error"}], torch="2.11.0")
    return a, b


def by_key(cmp: dict) -> dict:
    return {v["key"]: v for v in cmp["variants"]}


def test_matched_variants_carry_both_arms_and_the_paired_difference(pair):
    cmp = compare(*pair)
    v = by_key(cmp)["L1+L3+L5|eagle3|chain-3|as-loaded"]
    assert v["a"]["accept_length"] == pytest.approx(1 + (6 + 7 + 8 + 6 + 7 + 8 + 6 + 7) / 160)
    assert v["b"]["accept_length"] == pytest.approx(1 + (28 + 29 + 30 + 28 + 29 + 30 + 28 + 29) / 160)
    assert v["difference"] == pytest.approx(v["b"]["accept_length"] - v["a"]["accept_length"])
    assert v["paired"] and v["significant"] and v["difference_ci95"][0] > 0
    same = by_key(cmp)["embed+L2+L4|eagle3|chain-3|as-loaded"]
    assert same["difference"] == 0 and same["difference_ci95"] == [0.0, 0.0] and not same["significant"]
    assert cmp["only_a"] == ["L2+L3+L4|eagle3|chain-3|as-loaded"]
    assert cmp["only_b"] == ["embed+L2+L4|eagle3|chain-1|as-loaded"]


def test_different_prompts_give_an_unpaired_difference_without_interval(pair):
    a, b = pair
    b = copy.deepcopy(b)
    for e in b["evaluations"]:
        for p in e["per_prompt"]:
            p["id"] = "other-" + p["id"]
    v = by_key(compare(a, b))["L1+L3+L5|eagle3|chain-3|as-loaded"]
    assert not v["paired"] and v["difference_ci95"] is None and v["difference"] > 1
    assert "unpaired" in render_terminal(compare(a, b))


def test_verdict_changes(pair):
    changes = {v["kind"]: v for v in compare(*pair)["verdicts"]}
    assert changes["layout-mismatch"]["change"] == "disappeared" and changes["layout-mismatch"]["b"] is None
    assert changes["layout-match"]["change"] == "appeared"
    assert changes["eagle-algorithm"]["change"] == "severity"
    assert (changes["eagle-algorithm"]["a"]["severity"], changes["eagle-algorithm"]["b"]["severity"]) == \
        ("warning", "error")
    assert compare(pair[0], pair[0])["verdicts"][0]["change"] == "same"


def test_provenance_differences(pair):
    a, b = pair
    b["drafter"]["config"] = "4444444444444444"
    diffs = {d["field"]: (d["a"], d["b"]) for d in compare(a, b)["provenance"]}
    assert diffs == {"torch": ("2.13.0", "2.11.0"), "drafter config hash": ("2222222222222222", "4444444444444444")}
    assert compare(a, a)["provenance"] == []


def test_markdown_and_terminal_quote_the_numbers(pair):
    cmp = compare(*pair, a_path="ra/report.json", b_path="rb/report.json")
    md = render_markdown(cmp)
    v = by_key(cmp)["L1+L3+L5|eagle3|chain-3|as-loaded"]
    row = (f"| `L1+L3+L5` | eagle3 | chain-3 | as-loaded | {v['a']['accept_length']:.2f} | "
           f"[{v['a']['ci95'][0]:.2f}, {v['a']['ci95'][1]:.2f}] | {v['b']['accept_length']:.2f} |")
    assert row in md
    assert f"{v['difference']:+.2f} [{v['difference_ci95'][0]:+.2f}, {v['difference_ci95'][1]:+.2f}] *" in md
    assert "- torch: A `2.13.0` → B `2.11.0`" in md
    assert "**layout-mismatch** disappeared" in md
    assert "ra/report.json" in render_terminal(cmp)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=5),
       st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=5))
def test_rounds_from_sums_resample_exactly_like_the_rounds(ra, rb):
    """What report.json keeps per prompt (rounds, accepted_sum) is all the bootstrap needs."""
    n = min(len(ra), len(rb))
    ra, rb = ra[:n], rb[:n]
    pa = [{"rounds": len(r), "accepted_sum": sum(r)} for r in ra]
    pb = [{"rounds": len(r), "accepted_sum": sum(r)} for r in rb]
    if sum(map(len, ra)) and sum(map(len, rb)):
        assert paired_bootstrap_diff(_as_rounds(pa), _as_rounds(pb), seed=3, n=200) == \
            paired_bootstrap_diff(ra, rb, seed=3, n=200)
        assert accept_length_ci(_as_rounds(pa), seed=1, n=100) == accept_length_ci(ra, seed=1, n=100)


def write(tmp_path, name: str, rep: dict):
    d = tmp_path / name
    d.mkdir()
    (d / "report.json").write_text(json.dumps(rep))
    return d


def test_cli_prints_json_and_writes_markdown(pair, tmp_path, capsys):
    da, db = write(tmp_path, "a", pair[0]), write(tmp_path, "b", pair[1])
    out = tmp_path / "ticket" / "compare.md"
    assert main(["compare", str(da), str(db / "report.json"), "--json", "--out", str(out)]) == 0
    cmp = json.loads(capsys.readouterr().out)
    assert cmp["kind"] == "diag-compare" and cmp["a"]["path"] == str(da / "report.json")
    assert out.read_text() == render_markdown(cmp)
    assert main(["compare", str(da), str(db)]) == 0
    assert "L1+L3+L5|eagle3|chain-3|as-loaded" in capsys.readouterr().out


def test_bad_inputs_are_user_errors(pair, tmp_path, capsys):
    with pytest.raises(DiagError, match="no report found"):
        load_report(tmp_path / "missing")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(DiagError, match="not valid JSON"):
        load_report(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"kind": "something-else"}))
    with pytest.raises(DiagError, match="not a diag report"):
        load_report(tmp_path / "y.json")
    future = write(tmp_path, "future", {**pair[0], "schema_version": "3.0"})
    assert main(["compare", str(future), str(future)]) == 2
    assert "unsupported report schema version" in capsys.readouterr().err
