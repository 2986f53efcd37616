"""Reconciliation on the zoo's trained pair: per-request accept lengths a server produced with one
candidate (L1+L3+L5, every point one layer later, on chain-3), with engine noise, are attributed
to that candidate through the whole pipeline, not to the trained embed+L2+L4."""

import json
from dataclasses import replace

import pytest

from diag.run.shipped import shipped
from diag.replay.evaluation import one
from diag.run.case import Case, EvaluateSpec, ModelSpec, PromptSpec, ServerSpec, SpeedupSpec
from diag.run.pipeline import run_case
from test_server_responses import spec_meta


def _server(run):
    """The run's live-server section as report.json holds it (diag/diagnoses/live_serving/)."""
    from diag.diagnoses.typed import to_json
    return to_json(run.diagnoses["live_serving"])

pytestmark = pytest.mark.slow


def _case() -> Case:
    return Case(1, "server-zoo", "<flags>", ModelSpec("zoo:llama-tiny", "float32"),
                ModelSpec("zoo:llama-tiny-eagle3-embed", "float32"),
                PromptSpec(str(shipped("cases/prompts/mixed-48.jsonl").resolve()), max_new_tokens=64, limit=16),
                EvaluateSpec(layouts=("embed+L2+L4", "L1+L3+L5"), trees=("chain-3", "chain-1"),
                             bootstrap=1000), speedup=SpeedupSpec(measure=False))


def _responses(producer, path):
    """What SGLang 0.5.23 returns per request for the producer's trajectories; prompt i's accepted
    drafts moved by +1, -1, 0 in turn (numerics of another engine), within 0..S per round."""
    S, D = producer.shape.num_steps, producer.shape.num_draft_tokens
    lines = []
    for i, p in enumerate(producer.per_prompt):
        acc = min(max(p.accepted_sum + (1, -1, 0)[i % 3], 0), S * p.rounds)
        completion = 1 + acc + p.rounds
        lines.append(json.dumps({"text": "...", "meta_info": {"id": p.id, "prompt_tokens": 50,
                                                              **spec_meta("0.5.23", p.rounds, acc, D, completion, [])}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_per_request_accept_lengths_are_attributed_to_their_candidate(tmp_path):
    base = run_case(_case(), progress=False)
    producer = one(base.evaluations, base.reference, layout="L1+L3+L5")
    trained = base.best_layout()
    assert trained == "embed+L2+L4" and producer.tree == "chain-3"
    run = run_case(replace(_case(), server=ServerSpec(responses=str(_responses(producer, tmp_path / "r.jsonl")))),
                   progress=False)
    sec = _server(run)
    assert sec["observed"]["draft_tokens"] == [4] and len(sec["observed"]["requests"]) == 16
    rec = sec["reconciliation"]
    assert rec["mode"] == "per-request" and rec["closest"] == producer.key
    assert rec["explaining"] == [producer.key]
    trained_row = next(m for m in rec["matches"] if m["key"] == producer.key.replace("L1+L3+L5", trained))
    assert not trained_row["explains"] and trained_row["per_request_rms"] > rec["matches"][0]["per_request_rms"]
    v = next(v for v in run.verdicts if v.kind == "server-match")
    assert v.severity == "warning" and "`L1+L3+L5` (eagle3) on chain-3" in v.text
    assert f"Not the trained `{trained}`" in v.text and f"resolves to `{trained}`" in v.text
    sim = {s["tree"]: s for s in sec["simulate"]}
    assert sim["chain-3"]["sglang_env"]["SGLANG_SIMULATE_ACC_LEN"] == \
        f"{one(run.evaluations, run.reference, layout=trained).accept_length:.2f}"
