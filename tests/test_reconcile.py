"""Reconciling the live server with diag's candidates, on hand-made Evaluation records: the seed's
numbers (90 / 82.3 tok/s at accept length 2.2 on (3, 4, 5); "accept len: 1.68, accept rate:
0.84" with --speculative-num-steps 1 --speculative-num-draft-tokens 16), the concurrency cap,
and bad server input, each a clear error."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from diag.errors import DiagError
from diag.metrics import AcceptCounts
from diag.replay.evaluation import ANY, Axes, Evaluation, PromptRounds
from diag.diagnoses.live_serving.calibrate import server_costs
from diag.run.case import Case, ModelSpec, PromptSpec, ServerSpec, ServingSpec
from diag.diagnoses.live_serving.inputs import read_server
from diag.diagnoses.live_serving.section import server_section
from diag.diagnoses.live_serving.verdicts import calibrated_verdicts, server_verdicts
from diag.diagnoses.typed import to_json as J
from diag.stats import accept_length_ci
from diag.trees import TreeShape, tree_shape
from test_server_log import PREFIX, msg_0_5_6, msg_0_5_11
from test_server_responses import response

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"]}
REF = Axes(layout=ANY, mode="eagle3", tree="chain-3", regime="as-loaded", tokens_regime="as-loaded")


def evaluation(layout: str, tree: str, per_prompt: dict[str, list[int]], mode: str = "eagle3") -> Evaluation:
    shape = tree_shape(tree)
    rounds = [per_prompt[k] for k in per_prompt]
    flat = [a for r in rounds for a in r]
    point, lo, hi = accept_length_ci(rounds, seed=0, n=400)
    counts = AcceptCounts.from_accepted(flat, shape.num_steps, shape.num_draft_tokens)
    return Evaluation(Axes(layout, mode, shape.name, "as-loaded", "as-loaded"), shape, counts, counts, point, (lo, hi),
                      (), tuple(PromptRounds(k, tuple(v)) for k, v in per_prompt.items()))


def prompts(n: int, pattern) -> dict[str, list[int]]:
    """n prompts of 30 rounds, round j of prompt i accepting pattern(i, j) drafts."""
    return {f"p{i:02d}": [pattern(i, j) for j in range(30)] for i in range(n)}


def candidates() -> list[Evaluation]:
    """A Kimi-like scan: trained embed+L3+L31, the +1-shifted L3+L31+L59 the old rule serves, on three trees."""
    trained1 = prompts(24, lambda i, j: int((i + j) % 10 < 9))          # 1.90 on chain-1
    shifted1 = prompts(24, lambda i, j: int((i * 7 + j) % 25 < 17))      # 1.68 on chain-1
    trained3 = prompts(24, lambda i, j: (i + j) % 3 + (j % 2))           # 2.5 on chain-3
    shifted3 = prompts(24, lambda i, j: (i + j) % 2)
    return [evaluation("embed+L3+L31", "chain-1", trained1), evaluation("L3+L31+L59", "chain-1", shifted1),
            evaluation("embed+L3+L31", "chain-3", trained3), evaluation("L3+L31+L59", "chain-3", shifted3),
            evaluation("embed+L3+L31", "s3-k4-d5", {k: [min(3, a + 1) for a in v] for k, v in trained3.items()})]


def case(tmp_path: Path, launch: str | None = None, limit=None, **server) -> Case:
    return Case(1, "seed", str(tmp_path / "case.toml"), ModelSpec("t"), ModelSpec("d"),
                PromptSpec("p.jsonl", limit=limit), serving=ServingSpec(launch=launch), server=ServerSpec(**server))


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return name


IDS = [f"p{i:02d}" for i in range(24)]


def test_seed_accept_len_1_68_rate_0_84_is_a_depth_1_chain(tmp_path):
    """0.5.8 logs the legacy rate L / D: 1.68 / 0.84 fits D = 2 only; the launch's
    num_steps 1 with 16 draft tokens ran as chain-1; the server matches the shifted layout."""
    log = write(tmp_path, "server.log", "\n".join(PREFIX + msg_0_5_6(n, 10, 0.01, L, L / 2, 56.8, 0)
                                                  for n, L in [(8, 1.67), (8, 1.68), (16, 1.68), (8, 1.69)]))
    launch = ("python -m sglang.launch_server --model-path K --speculative-algorithm EAGLE3 "
              "--speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 16")
    obs = read_server(case(tmp_path, launch, engine="sglang-0.5.8", log=log), IDS, KIMI)
    assert obs.shape == TreeShape(1, 1, 2) and obs.draft_tokens == (2,)
    assert obs.rate_formula == "sglang_accept_rate_legacy" and obs.accept_length.value == pytest.approx(1.68, abs=1e-9)
    evals = candidates()
    sec = server_section(obs, evals, REF, "embed+L3+L31", seed=0, n_boot=400)
    rec = J(sec)["reconciliation"]
    assert rec["mode"] == "aggregate" and rec["explaining"] == ["L3+L31+L59|eagle3|chain-1|as-loaded"]
    assert all(not m["shape_ok"] for m in rec["matches"] if m["axes"]["tree"] != "chain-1")
    (v,) = server_verdicts(sec)
    assert v.kind == "server-match" and v.severity == "warning"
    assert "`L3+L31+L59` (eagle3) on chain-1 (S=1, K=1, D=2)" in v.text
    assert "the requested 16 is ignored" in v.text and "Not the trained `embed+L3+L31`" in v.text
    assert "intended tree chain-3 would give 2.50" in v.text


def test_seed_pair_cannot_come_from_0_5_23():
    """The same printed pair under 0.5.11+'s (L-1)/(D-1) fits no D: an error naming the release."""
    from diag.engines.sglang.server_log import read_server_log
    from diag.diagnoses.live_serving.observation import log_draft_tokens
    from diag.engines import rules
    from diag.engines.sglang.server_releases import server_release
    log = read_server_log(PREFIX + msg_0_5_11(8, 10, 0.01, 1.68, 0.84, 56.8, 0), source="s.log",
                          release=server_release("0.5.23"))
    with pytest.raises(DiagError, match="fit no tree") as e:
        log_draft_tokens(log.speculative, log.rate_formula, "SGLang 0.5.23", "s.log", rules().log_draft_tokens)
    assert "other formula fits D = [2]" in str(e.value) and "line 1" in str(e.value)
    assert "(SGLang 0.5.23)" in str(e.value)


def test_seed_90_vs_82_3_tok_s_at_2_2_on_s3_k4_d5(tmp_path):
    """The server's round costs 2.41 plain steps: speculation runs at 0.91x; the trained layout on the same
    tree (2.9 here) is priced exactly, other trees between the two cost splits."""
    c = server_costs(90.0, 82.3, 2.2, TreeShape(3, 4, 5))
    assert c.t_decode * 1e3 == pytest.approx(11.111, abs=1e-3) and c.round * 1e3 == pytest.approx(26.731, abs=1e-3)
    assert c.break_even == pytest.approx(2.4058, abs=1e-4)
    lo, hi = c.round_bounds(TreeShape(1, 1, 2))
    assert (lo * 1e3, hi * 1e3) == (pytest.approx(15.016, abs=1e-3), pytest.approx(16.318, abs=1e-3))
    assert c.round_bounds(TreeShape(3, 4, 5)) == (pytest.approx(c.round), pytest.approx(c.round))
    obs = read_server(case(tmp_path, baseline_tokens_per_second=90.0, tokens_per_second=82.3, accept_length=2.2,
                           tree="s3-k4-d5"), IDS, KIMI)
    evals = candidates()
    sec = server_section(obs, evals, REF, "embed+L3+L31", seed=0, n_boot=400)
    row = next(r for r in J(sec)["speedup"]["rows"] if r["key"] == evals[-1].key)
    assert row["exact"] and row["tokens_per_second"][0] == pytest.approx(evals[-1].accept_length / c.round)
    (v,) = calibrated_verdicts(sec)
    assert "82.3 tok/s at accept length 2.20 on s3-k4-d5 against 90.0 tok/s plain (0.91x)" in v.text
    assert "= 2.41 plain steps" in v.text
    speeds = {r["tree"]: r["speedup"] for r in J(sec)["speedup"]["rows"] if r["axes"]["layout"] == "embed+L3+L31"}
    best = max(speeds, key=lambda t: speeds[t][1])
    assert v.kind == ("tree-choice" if speeds[best][0] > 1 else "speedup") and best in v.text


def test_seed_56_8_tok_s_at_1_68_on_chain_1_never_pays(tmp_path):
    """56.8 tok/s at accept length 1.68 on chain-1 against 90: a round costs 2.66 plain steps, above
    the 2 tokens a depth-1 chain can ever emit: SPECULATION DOES NOT PAY."""
    obs = read_server(case(tmp_path, baseline_tokens_per_second=90.0, tokens_per_second=56.8, accept_length=1.68,
                           tree="chain-1"), IDS, KIMI)
    evals = [e for e in candidates() if e.tree == "chain-1"]
    sec = server_section(obs, evals, REF.but(tree="chain-1"), "embed+L3+L31", seed=0, n_boot=400)
    assert J(sec)["speedup"]["costs"]["break_even_accept_length"] == pytest.approx(90 * 1.68 / 56.8)
    (v,) = calibrated_verdicts(sec)
    assert v.kind == "speedup" and v.severity == "warning" and v.text.startswith("SPECULATION DOES NOT PAY")


def test_a_round_cheaper_than_a_plain_step_is_a_measurement_error():
    with pytest.raises(DiagError, match="measurement error") as e:
        server_costs(90.0, 250.0, 2.2, TreeShape(3, 4, 5))
    assert "server.tokens_per_second" in str(e.value)


def test_concurrency_above_the_cap(tmp_path):
    log = write(tmp_path, "s.log", "\n".join(PREFIX + msg_0_5_11(n, 10, 0.01, 2.2, 0.3, 82.3 * n, q)
                                             for n, q in [(30, 0), (48, 12), (48, 16)]))
    obs = read_server(case(tmp_path, log=log, concurrency=64, tree="s3-k4-d5"), IDS, KIMI)
    assert obs.load.lines_capped_with_queue == 2 and obs.max_running_requests == 48
    sec = server_section(obs, candidates(), REF, "embed+L3+L31", seed=0, n_boot=200)
    assert J(sec)["concurrency"]["served_fraction"] == 0.75
    v = next(v for v in server_verdicts(sec) if v.kind == "server-concurrency")
    assert "queues 16" in v.text and "75%" in v.text and "2 of 3 decode lines" in v.text


def test_no_candidate_explains_the_server(tmp_path):
    log = write(tmp_path, "s.log", PREFIX + msg_0_5_11(8, 10, 0.01, 1.20, 0.20, 40.0, 0))
    obs = read_server(case(tmp_path, log=log), IDS, KIMI)
    assert obs.draft_tokens == (2,)
    sec = server_section(obs, candidates(), REF, "embed+L3+L31", seed=0, n_boot=200)
    (v,) = server_verdicts(sec)
    assert v.kind == "server-unexplained" and "lies in the engine" in v.text


def _responses(tmp_path, ids, version="0.5.23"):
    return write(tmp_path, "r.jsonl", "\n".join(json.dumps(response(version, i, 30, 20, 2)) for i in ids))


def test_responses_whose_prompts_do_not_match_the_case_are_errors(tmp_path):
    with pytest.raises(DiagError, match="match none of the case's prompt ids") as e:
        read_server(case(tmp_path, responses=_responses(tmp_path, ["a1b2c3", "d4e5f6"])), IDS, KIMI)
    assert "rid" in str(e.value)
    with pytest.raises(DiagError, match="do not cover the case's prompts") as e:
        read_server(case(tmp_path, responses=_responses(tmp_path, IDS[:20])), IDS, KIMI)
    assert "4 missing" in str(e.value)
    with pytest.raises(DiagError, match="prompts the case does not replay"):
        read_server(case(tmp_path, responses=_responses(tmp_path, IDS + ["q1"])), IDS, KIMI)
    obs = read_server(case(tmp_path, responses=_responses(tmp_path, IDS + ["q1"]), limit=24), IDS, KIMI)
    assert len(obs.requests) == 24 and any("1 responses are for prompts outside" in n for n in obs.notes)


def test_sources_that_disagree_are_errors(tmp_path):
    log = write(tmp_path, "s.log", "\n".join([
        "server_args=ServerArgs(speculative_num_steps=3, speculative_eagle_topk=4, speculative_num_draft_tokens=5)",
        PREFIX + msg_0_5_11(8, 10, 0.01, 2.2, 0.3, 82.3, 0)]))
    with pytest.raises(DiagError, match="disagree on the tree"):
        read_server(case(tmp_path, log=log, tree="chain-3"), IDS, KIMI)
    info = write(tmp_path, "info.json", json.dumps({"internal_states": [{"avg_spec_accept_length": 2.0}],
                                                    "version": "0.5.8"}))
    with pytest.raises(DiagError, match="different SGLang releases"):
        read_server(case(tmp_path, server_info=info, engine="sglang-0.5.23"), IDS, KIMI)
    with pytest.raises(DiagError, match="server file not found"):
        read_server(case(tmp_path, log="missing.log"), IDS, KIMI)
    with pytest.raises(DiagError, match="at least 1"):
        read_server(case(tmp_path, accept_length=0.9), IDS, KIMI)


def test_server_info_names_the_release_when_the_case_does_not(tmp_path):
    info = write(tmp_path, "info.json", json.dumps({"internal_states": [{"avg_spec_accept_length": 1.68}],
                                                    "version": "0.5.8", "speculative_num_steps": 1,
                                                    "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2}))
    obs = read_server(replace(case(tmp_path, server_info=info)), IDS, KIMI)
    assert obs.release == "0.5.8" and obs.shape == TreeShape(1, 1, 2)
