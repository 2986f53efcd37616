"""A run under a sampled decoding, end to end on tests/tiny.py checkpoints: the decode loop runs
on the target the pass loaded (one load; a cached pass loads it once more, only for the loop),
report.json validates with the decoding axis and the exact expectation, report.md shows greedy
and sampled side by side, verdicts and assertions read the served decoding."""

import json
from collections import defaultdict
from pathlib import Path

import jsonschema
import pytest

import tiny
from types import SimpleNamespace as NS
from diag.assertions import (assert_accept_length_at_least, assert_serving_layout_is_trained,
                             find_evaluation)
from diag.diagnoses.hooks import report_schema
from diag.errors import DiagError
from diag.replay.evaluation import Evaluation, select
from diag.report.markdown import render
from diag.report.writer import write_report
from diag.run import target_passes
from diag.run.case import read_case
from diag.run.pipeline import run_case
from diag.run.verdicts import floor

SCHEMA = report_schema(json.loads((Path(__file__).resolve().parents[1] / "diag" / "schema" / "report.schema.json").read_text()))
SERVED = "t1.0-p0.9-k-1"


def write(tmp, name, decoding):
    case = tiny.write_case(tmp / f"{name}.toml", tiny.make_target(tmp / "t"), tiny.make_drafter(tmp / "d"),
                           tiny.make_prompts(tmp / "p.jsonl", n=3), modes=["eagle3", "eagle"],
                           trees=["chain-2", "s2-k2-d4"])
    case.write_text(case.read_text() + "[decoding]\n" + decoding + "\n")
    return read_case(case)


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sampled")
    mp = pytest.MonkeyPatch()
    mp.setenv("DIAG_CACHE_DIR", str(tmp / "cache"))
    # tests/tiny.py's random pair sits near the floor (accept length ~1.03, 95% top ~1.08): these
    # tests are about which decoding the layout and EAGLE verdicts read, so only an exact 1.00
    # counts as the floor here (the floor verdict has its own tests in tests/bad_inputs)
    mp.setattr(floor, "FLOOR_TOP", 1.0)
    loads = []
    real = target_passes.load_target
    mp.setattr(target_passes, "load_target", lambda path, **kw: (loads.append(str(path)), real(path, **kw))[1])
    case = write(tmp, "case", "temperature = 1.0\ntop_p = 0.9\nseeds = 2")
    run = run_case(case, progress=False)
    first_loads = len(loads)
    again = run_case(case, progress=False)
    path, rep = write_report(run, tmp / "out", argv=["diag", "run"])
    yield dict(run=run, again=again, rep=rep, path=path, first_loads=first_loads, loads=len(loads), tmp=tmp)
    mp.undo()


def test_one_target_load_and_a_cached_pass_loads_it_only_for_the_loop(sampled_run):
    assert sampled_run["first_loads"] == 1
    assert sampled_run["loads"] == 1          # the repeat run: passes and sampled loops from the caches
    again = sampled_run["again"]
    assert all(r["cached"] for r in again.target_pass["regimes"].values())
    assert [e.key for e in again.evaluations] == [e.key for e in sampled_run["run"].evaluations]
    assert "sampled_s" in again.timings


def test_served_decoding_is_the_reference_and_the_verdicts_use_it(sampled_run):
    run = sampled_run["run"]
    assert run.reference.decoding == SERVED
    at_ref = select(run.evaluations, run.reference)
    assert {e.layout for e in at_ref} == {c.label for c in run.candidates if c.mode == "eagle3"}
    assert all(e.sampled and e.seeds == (0, 1) and e.expected_accept_length >= 1.0 for e in at_ref)
    # scope "verdicts": every candidate on the first tree, the best one on the others
    other = select(run.evaluations, run.reference, tree="s2-k2-d4")
    assert len(other) == 1 and other[0].layout == run.best_layout()
    assert select(run.evaluations, run.reference, mode="eagle")
    trained = next(v for v in run.verdicts if v.kind == "trained-layout")
    assert trained.evidence["decoding"] == SERVED and f"under {SERVED}" in trained.text
    assert any(v.kind == "sampled-acceptance" for v in run.verdicts)
    eagle = next(v for v in run.verdicts if v.kind == "eagle-algorithm")
    assert eagle.evidence["decoding"] == SERVED
    # greedy stays complete: every candidate on every tree
    assert len(select(run.evaluations, run.reference, decoding="greedy", tree="s2-k2-d4")) == \
        len([c for c in run.candidates if c.mode == "eagle3"])


def test_report_validates_and_renders_greedy_beside_sampled(sampled_run):
    rep, path = sampled_run["rep"], sampled_run["path"]
    on_disk = json.loads((path / "report.json").read_text())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(on_disk)]
    assert not errors, errors
    assert on_disk["decoding"]["served"]["name"] == SERVED and on_disk["reference"]["decoding"] == SERVED
    assert not on_disk["decoding"]["lossy"]
    md = (path / "report.md").read_text()
    assert md == render(rep)
    assert "## Greedy vs sampled acceptance" in md and f"**{SERVED}**" in md
    section = md.split("## Greedy vs sampled acceptance")[1].split("\n## ")[0]
    sampled_keys = [e["key"] for e in on_disk["evaluations"] if e["decoding"] != "greedy"]
    assert section.count(f"| {SERVED} |") == len(sampled_keys)
    from diag.report.sections.acceptance import by_tree
    greedy = {**on_disk, "evaluations": [e for e in on_disk["evaluations"] if e["decoding"] == "greedy"]}
    assert by_tree(on_disk) == by_tree(greedy) and "\n".join(by_tree(on_disk)) in md   # the tree table stays greedy
    back = [Evaluation.from_json(e) for e in on_disk["evaluations"]]
    assert [(e.key, e.expected_accept_length) for e in back] == \
        [(e.key, e.expected_accept_length) for e in sampled_run["run"].evaluations]


def test_samples_carry_seed_and_expectation(sampled_run):
    rows = [json.loads(x) for x in (sampled_run["path"] / "samples.jsonl").read_text().splitlines()]
    mine = [r for r in rows if "@" in r["variant"]]
    assert mine and all("seed" in r and 0.0 <= r["expected"] <= 2.0 for r in mine)
    by = defaultdict(list)
    for r in mine:
        by[(r["variant"], r["prompt"], r["seed"])].append(r)
    for rs in by.values():
        assert [r["round"] for r in rs] == list(range(len(rs)))
        for prev, nxt in zip(rs, rs[1:]):
            assert nxt["position"] == prev["position"] + prev["accepted"] + 1


def test_assertions_take_a_decoding(sampled_run):
    rep = sampled_run["rep"]
    assert find_evaluation(rep)["decoding"] == SERVED
    assert find_evaluation(rep, decoding="greedy")["decoding"] == "greedy"
    served = find_evaluation(rep)
    assert_accept_length_at_least(rep, 1.0)
    with pytest.raises(AssertionError, match=f"exact expectation under {SERVED} over 2 seeds"):
        assert_accept_length_at_least(rep, served["expected_accept_length"] + 0.5)
    with pytest.raises(DiagError, match="no single evaluation"):
        find_evaluation(rep, decoding="t0.5-p1.0-k-1")
    for dec in (None, "greedy"):
        try:
            assert_serving_layout_is_trained(rep, decoding=dec)
        except AssertionError as err:                             # tiny random pair: may mismatch
            assert "serving layout" in str(err)
    with pytest.raises(DiagError, match="no evaluation at this decoding"):
        assert_serving_layout_is_trained(rep, decoding="t0.5-p1.0-k-1")


def test_every_tree_in_one_loop_gives_what_one_loop_per_tree_gives(tmp_path, monkeypatch):
    """DIAG_MIX_TREES=1 (the default on CUDA): both trees' lanes in one decode loop, padded to
    the wider tree; every sampled evaluation equals the one loop per tree's (the CPU's default),
    and the timings say one loop decoded both trees."""
    monkeypatch.setattr(floor, "FLOOR_TOP", 1.0)                 # tiny's random pair: see sampled_run
    case = write(tmp_path, "mix", 'temperature = 1.0\ntop_p = 0.9\nseeds = 2\nscope = "all"')
    got = {}
    for mix in ("0", "1"):
        monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / f"cache{mix}"))
        monkeypatch.setenv("DIAG_MIX_TREES", mix)
        run = run_case(case, progress=False)
        evs = [e for e in run.evaluations if e.sampled]
        got[mix] = (sorted((e.key, e.accept_length, e.trajectory_rounds, e.expected_accept_length) for e in evs),
                    run.timings["sampled_decode_loops"], run.timings["sampled_trees_decoded"])
    assert [x[:3] for x in got["0"][0]] == [x[:3] for x in got["1"][0]] and len(got["0"][0]) >= 4
    for x, y in zip(got["0"][0], got["1"][0]):                   # the verify's float sums batch otherwise
        assert abs(x[3] - y[3]) < 1e-6, x[0]
    assert (got["0"][1], got["0"][2]) == (2, 2) and (got["1"][1], got["1"][2]) == (1, 2)
    assert run.timings["sampled_mla_latent_layers"] == 0          # tiny is Llama: no MLA to switch


def test_lossy_thresholds_are_said(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    case = write(tmp_path, "lossy", "temperature = 1.0\nthreshold_acc = 0.5\nseeds = 1\nscope = \"all\"")
    run = run_case(case, progress=False)
    assert run.reference.decoding == "t1.0-p1.0-k-1-ts1.0-ta0.5"
    assert any(v.kind == "lossy-verification" and v.severity == "warning" for v in run.verdicts)
    assert any("lossy" in n for n in run.notes)
    sampled = [e for e in run.evaluations if e.sampled]
    assert len(sampled) == len(run.candidates) * 2                   # scope "all": every candidate x 2 trees
    path, rep = write_report(run, tmp_path / "out", argv=["diag"])
    assert "**Lossy verification**" in (path / "report.md").read_text() and rep["decoding"]["lossy"]


def test_a_greedy_run_runs_no_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    case = read_case(tiny.write_case(tmp_path / "g.toml", tiny.make_target(tmp_path / "t"),
                                     tiny.make_drafter(tmp_path / "d"), tiny.make_prompts(tmp_path / "p.jsonl", n=2)))
    run = run_case(case, progress=False)
    assert run.reference.decoding == "greedy" and not any(e.sampled for e in run.evaluations)
    assert "sampled_s" not in run.timings
    assert "Greedy vs sampled" not in render(write_report(run, tmp_path / "o", argv=["diag"])[1])


def test_graphs_that_cannot_be_captured_are_named_in_the_notes_and_change_no_number(tmp_path, monkeypatch):
    """A loop whose CUDA graphs fail to capture (here: every capture on the CPU, made to try)
    runs its verify and its draft eagerly; the run's notes name both, and its accept lengths are
    the ones a run without graphs gives (its verify on fixed widths, as on CUDA: the same tokens)."""
    import torch

    from diag.replay.decode_loop import DecodeLoop
    from diag.target import tree_forward
    from diag.target.verify_graphs import VerifyGraphs

    case = write(tmp_path, "graphs", 'temperature = 1.0\nseeds = 1\nscope = "all"')
    got = {}
    for tried in (False, True):
        monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / f"cache{tried}"))
        if tried:
            monkeypatch.setattr(DecodeLoop, "_graphs_possible", lambda self: True)
            monkeypatch.setattr(VerifyGraphs, "usable", lambda self, model: self.failure is None)
            monkeypatch.setattr(torch.cuda, "is_available", lambda: False)       # no device to synchronise
            monkeypatch.setattr(tree_forward, "_fixed", lambda kv, fixed: True)  # the verify on fixed widths, as on CUDA
        run = run_case(case, progress=False)
        got[tried] = (sorted((e.key, e.accept_length) for e in run.evaluations if e.sampled), run.notes)
    assert got[True][0] == got[False][0] and got[True][0]
    notes = [n for n in got[True][1] if "CUDA graphs were turned off" in n]
    assert any("the verify's" in n for n in notes) and any("the draft's" in n for n in notes)
    assert not [n for n in got[False][1] if "CUDA graphs" in n]


def test_the_decode_loop_drafts_with_the_loaded_targets_tables_and_decodes_what_the_lazy_ones_decode(
        tmp_path, monkeypatch):
    """run/sampled.loaded_tables: the loop takes the loaded target's own embedding and head (no row
    gathered on the host, no second read of the head), the run's lazy tables where the model holds
    its own on the meta device; a run decodes the same either way (the same tensors)."""
    import torch

    from diag.run import sampled as run_sampled

    model = torch.nn.Module()
    own_e, own_h = torch.nn.Embedding(4, 2), torch.nn.Linear(2, 4, bias=False)
    model.get_input_embeddings, model.get_output_embeddings = (lambda: own_e), (lambda: own_h)
    assert run_sampled.loaded_tables(model, "lazy-e", "lazy-h") == (own_e, own_h)
    own_h.weight = torch.nn.Parameter(torch.empty(4, 2, device="meta"))          # offloaded: the lazy one
    assert run_sampled.loaded_tables(model, "lazy-e", "lazy-h") == (own_e, "lazy-h")

    case = write(tmp_path, "tables", 'temperature = 1.0\nseeds = 1\nscope = "all"')
    got, real = {}, run_sampled.loaded_tables
    for lazy in (False, True):
        monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / f"cache{lazy}"))
        monkeypatch.setattr(run_sampled, "loaded_tables", (lambda m, e, h: (e, h)) if lazy else real)
        run = run_case(case, progress=False)
        got[lazy] = sorted((e.key, e.accept_length, e.expected_accept_length) for e in run.evaluations if e.sampled)
    assert got[False] == got[True] and got[False]


def _stand_in(name: str, rows: list[list[float]], sampled: bool = True):
    flat = [x for r in rows for x in r]
    return NS(layout=name, sampled=sampled, judged_rounds=rows, judged_accept_length=1 + sum(flat) / len(flat))


def _rows(base: float, swing: float = 0.0, prompts: int = 40) -> list[list[float]]:
    """Per prompt 4 rounds' expectations around `base`, spread +-0.6 across prompts; prompt i
    moved by swing * (-1)**i (an even count: the mean stays `base`, a paired difference varies)."""
    return [[base + swing * (-1) ** i + 0.3 * ((7 * i + j) % 5 - 2) for j in range(4)] for i in range(prompts)]


def test_the_lead_of_near_tied_sampled_layouts_is_one_no_batch_can_swap():
    """replay/evaluation.lead, its docstring's example: A 3.101 and B 3.104 are tied (the paired
    interval reaches zero), C 2.0 is lower. A batch's noise that moves B below A does not move the
    lead; the drafter's config's layout wins a tie; a lower layout wins nothing; greedy is best()."""
    from diag.replay.evaluation import best, lead
    a, b, c = _stand_in("A", _rows(2.101)), _stand_in("B", _rows(2.104, 0.2)), _stand_in("C", _rows(1.0, 0.2))
    b_moved = _stand_in("B", _rows(2.099, 0.2))
    assert best([a, b, c]) is b and best([a, b_moved, c]) is a           # the plain best flips
    assert lead([a, b, c], seed=0, n_boot=500) is a
    assert lead([a, b_moved, c], seed=0, n_boot=500) is a
    assert lead([a, b, c], seed=0, n_boot=500, prefer={"B"}) is b
    assert lead([a, b_moved, c], seed=0, n_boot=500, prefer={"B"}) is b_moved
    assert lead([a, b, c], seed=0, n_boot=500, prefer={"C"}) is a           # C is not tied with the best
    assert lead([c, b, a], seed=0, n_boot=500) is b                         # order: the case's candidates'
    g = [_stand_in("A", _rows(2.101), False), _stand_in("B", _rows(2.104, 0.2), False)]
    assert lead(g, seed=0, n_boot=500) is g[1]
    assert lead([], seed=0, n_boot=500) is None


def test_the_lead_is_remembered_for_the_same_evaluations_and_asked_again_for_others(monkeypatch):
    """lead() answers a question it was asked (the same objects, seed, draws, preference) without a
    bootstrap; other objects, even equal ones, or another preference are asked again."""
    import diag.replay.evaluation as ev
    calls = []
    real = ev.tie_interval
    monkeypatch.setattr(ev, "tie_interval", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(ev, "_leads", [])
    a, b, c = _stand_in("A", _rows(2.101)), _stand_in("B", _rows(2.104, 0.2)), _stand_in("C", _rows(1.0, 0.2))
    assert ev.lead([a, b, c], seed=0, n_boot=300) is a and len(calls) == 2
    assert ev.lead((x for x in [a, b, c]), seed=0, n_boot=300) is a and len(calls) == 2    # remembered
    assert ev.lead([a, b, c], seed=0, n_boot=300, prefer={"B"}) is b and len(calls) == 4   # another question
    a2 = _stand_in("A", _rows(2.101))
    assert ev.lead([a2, b, c], seed=0, n_boot=300) is a2 and len(calls) == 6              # other objects
    assert ev.lead([a, b, c], seed=1, n_boot=300) is a and len(calls) == 8                 # another seed
    for i in range(ev.LEAD_MEMO):                                                          # pushed out
        ev.lead([a, b, c], seed=10 + i, n_boot=300)
    n = len(calls)
    ev.lead([a, b, c], seed=0, n_boot=300)
    assert len(calls) == n + 2


def _moved(e, name: str, by: list[float], net: float):
    """e's rounds as layout `name`'s, prompt i's expectations moved by by[i] plus a constant that
    moves the pooled expectation by `net`: paired with e, a difference no interval can separate."""
    from dataclasses import replace
    n = [len(p.expected) for p in e.per_prompt]
    c = net - sum(d * k for d, k in zip(by, n)) / sum(n)
    per = tuple(replace(p, expected=tuple(x + d + c for x in p.expected)) for p, d in zip(e.per_prompt, by))
    flat = [x for p in per for x in p.expected]
    return replace(e, axes=e.axes.but(layout=name), per_prompt=per, expected_accept_length=1 + sum(flat) / len(flat))


def test_the_trained_verdict_and_the_sampled_trees_read_the_same_layout_whichever_twin_is_higher(sampled_run):
    """Two layouts 0.001 apart with per-prompt differences of +-0.2 (tied): whichever reads higher
    (a batch's noise), the trained-layout verdict, best_layout (the layout the sampled trees are
    decoded on) name the first of them in the case's candidates (the drafter's config reads both),
    and the verdict says the other is higher by a tie."""
    from dataclasses import replace
    from diag.run.candidates import config_reads
    from diag.run.verdicts.layout import layout_verdicts
    run = sampled_run["run"]
    at_ref = select(run.evaluations, run.reference)
    plain = [c for c in run.candidates if c.mode == "eagle3"]
    assert len(plain) >= 2 and config_reads(plain[0].roles) == config_reads(plain[1].roles)   # neither wins by it
    first, second = plain[0].label, plain[1].label
    plain = [c.label for c in plain]
    e = next(x for x in at_ref if x.layout == first)
    rest = [x for x in run.evaluations if x not in at_ref]
    by = [0.2 * (-1) ** i for i in range(len(e.per_prompt))]
    for higher, lower in ((second, first), (first, second)):
        pair = [_moved(e, lower, [0.0] * len(by), 0.0), _moved(e, higher, by, 0.001)]
        twin = replace(run, evaluations=rest + sorted(pair, key=lambda x: plain.index(x.layout)))
        assert twin.best_layout() == first
        trained = next(v for v in layout_verdicts(twin) if v.kind == "trained-layout")
        assert trained.evidence["best"] == first and trained.evidence["highest"] == higher
        assert trained.text.startswith(f"The drafter was trained on layout {first}:")
        assert (f"tied with the highest, {second}" in trained.text) == (higher == second)
