"""The pipeline's order and its one target load (issue 11.4): the step costs are measured on the
target the pass already loaded; a run whose passes all come from the cache loads no target and
says the costs were not measured. Also: results are typed records looked up with `select`."""

import pytest

import tiny
from diag.replay.evaluation import ANY, Evaluation, select
from diag.run import target_passes
from diag.run.case import read_case
from diag.run.pipeline import run_case


def _priced(run):
    """The run's speedup section as report.json holds it (diag/diagnoses/pricing/), or None."""
    from diag.diagnoses.typed import to_json
    sec = run.diagnoses.get("pricing")
    return None if sec is None else to_json(sec)


@pytest.fixture()
def counted(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    loads = []
    real = target_passes.load_target

    def load(path, **kw):
        loads.append(str(path))
        return real(path, **kw)

    monkeypatch.setattr(target_passes, "load_target", load)
    case = tiny.write_case(tmp_path / "case.toml", tiny.make_target(tmp_path / "t"),
                           tiny.make_drafter(tmp_path / "d"), tiny.make_prompts(tmp_path / "p.jsonl", n=2),
                           trees=["chain-2", "s2-k2-d4"])
    return read_case(case), loads


def test_one_target_load_measures_the_costs(counted):
    case, loads = counted
    run = run_case(case, progress=False)
    assert len(loads) == 1
    assert _priced(run) is not None and _priced(run)["source"].startswith("measured by diag")
    assert {r["key"] for r in _priced(run)["rows"]} == {e.key for e in run.evaluations}


def test_cached_passes_load_no_target_and_reuse_the_costs_measured_before(counted, tmp_path):
    """The second run loads no target and prices its trees with the first run's costs
    (run/cost_cache.py); once those are gone, it says the costs were not measured."""
    case, loads = counted
    first = run_case(case, progress=False)
    again = run_case(case, progress=False)
    assert len(loads) == 1
    assert _priced(first) is not None and "earlier run" not in _priced(first)["source"]
    assert _priced(again) is not None and "by an earlier run" in _priced(again)["source"]
    assert [r["key"] for r in _priced(again)["rows"]] == [r["key"] for r in _priced(first)["rows"]]
    for f in (tmp_path / "cache" / "costs").glob("*.json"):
        f.unlink()
    bare = run_case(case, progress=False)
    assert len(loads) == 1 and _priced(bare) is None
    assert any("step costs not measured" in n for n in bare.notes)


def test_costs_are_timed_and_not_measured_twice(counted, tmp_path, monkeypatch):
    """The first run times its step costs (target_costs_s) and its generation batch (CPU: at
    most 16: every prompt of this case); a later run that must load the target again (its passes
    are gone) reuses the costs remembered for the same checkpoints instead of measuring."""
    import shutil
    from diag.diagnoses import pricing

    case, loads = counted
    first = run_case(case, progress=False)
    assert first.timings["target_costs_s"] > 0
    assert first.timings["target_generate_batch"] == min(16, first.target_pass["sequences"])
    assert first.timings["target_capture_microbatches"] >= 1         # the pass's token-budget batches
    for d in (tmp_path / "cache").iterdir():
        if d.name != "costs":
            shutil.rmtree(d) if d.is_dir() else d.unlink()
    monkeypatch.setattr(pricing, "measure_costs", lambda *a, **k: pytest.fail("measured again"))
    again = run_case(case, progress=False)
    assert len(loads) == 2 and "target_costs_s" not in again.timings
    assert _priced(again) is not None and "by an earlier run" in _priced(again)["source"]


def test_results_are_typed_and_selected_at_the_reference(counted):
    case, _ = counted
    run = run_case(case, progress=False, use_cache=False)
    assert all(isinstance(e, Evaluation) for e in run.evaluations)
    ref = run.reference
    assert ref.layout is ANY and ref.mode == "eagle3" and ref.tree == "chain-2"
    at_ref = select(run.evaluations, ref)
    assert {e.tree for e in at_ref} == {"chain-2"} and {e.mode for e in at_ref} == {"eagle3"}
    assert {e.layout for e in select(run.evaluations, ref, tree="s2-k2-d4")} == \
        {c.label for c in run.candidates if c.mode == "eagle3"}
    # report.json round trip: the same keys and numbers come back as records
    back = [Evaluation.from_json(e.to_json()) for e in run.evaluations]
    assert [(e.key, e.accept_length, e.trajectory.accepted_hist) for e in back] == \
        [(e.key, e.accept_length, e.trajectory.accepted_hist) for e in run.evaluations]


@pytest.mark.parametrize("breakage, message", [
    (lambda c: c.update(architectures=["Eagle3DeepseekV2ForCausalLM"], q_lora_rank=8, kv_lora_rank=8,
                        qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4), "missing a weight"),
    (lambda c: c.update(fc_norm=True), "missing a weight"),
    (lambda c: c.update(architectures=["DeepseekV3ForCausalLMNextN"]), "not an EAGLE-3 drafter"),
])
def test_drafter_architecture_and_weights_fail_before_any_target_weight(tmp_path, monkeypatch, breakage, message):
    """The drafter's architecture, weight names and shapes come from config.json and the
    safetensors headers, checked before the target's tokenizer, embeddings or pass."""
    import json

    from diag.errors import DiagError
    from diag.run import pipeline
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    drafter = tiny.make_drafter(tmp_path / "d")
    cfg = json.loads((drafter / "config.json").read_text())
    breakage(cfg)
    (drafter / "config.json").write_text(json.dumps(cfg))

    def no_target_weights(*a, **k):
        raise AssertionError("a target weight was read before the drafter was checked")

    monkeypatch.setattr(target_passes, "load_target", no_target_weights)
    monkeypatch.setattr(pipeline, "target_tables", no_target_weights)
    case = tiny.write_case(tmp_path / "case.toml", tiny.make_target(tmp_path / "t"), drafter,
                           tiny.make_prompts(tmp_path / "p.jsonl", n=2))
    with pytest.raises(DiagError, match=message) as err:
        run_case(read_case(case), progress=False)
    assert str(drafter) in (err.value.file or "")
