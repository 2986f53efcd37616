"""vLLM as a served engine: release names, the rule table read from the wheels, the served layout,
--speculative-config, logs and scrapes, the engine-sanity verdict, and differential tests that run
vLLM's own functions (rejection kernels under TRITON_INTERPRET, the log line, the default aux ids)
from its wheels against diag's port. Tests marked `wheel` read files from PyPI by HTTP range
(cached); they run on EXECUTED: the newest release and every release where a rule changes."""

from __future__ import annotations

import ast
import math

import pytest
import torch

from diag.engines.vllm import capture, detect, rejection, rules_gen, sanity
from diag.engines.vllm.releases import (NEWEST, RELEASES, rule, rule_change_releases, rule_row, span,
                                        vllm_release)
from diag.engines.vllm.table import ROWS
from diag.engines.vllm.spec_config import parse_launch, parse_spec_config
from diag.errors import DiagError
from diag.replay.sampling import verify_chain_rejection

EXECUTED = rule_change_releases(executed=True)
V1_SAMPLER = "vllm/v1/sample/rejection_sampler.py"


def test_release_names_and_errors():
    assert vllm_release("vllm-0.32.0").label == "vLLM 0.32.0"
    assert vllm_release(None).version == NEWEST == "0.34.0"
    assert RELEASES[0] == "0.8.5" and "0.9.0.1" in RELEASES and "0.8.5.post1" in RELEASES
    with pytest.raises(DiagError, match="unknown vLLM release") as e:
        vllm_release("vllm-0.8.4")
    assert "predates EAGLE-3" in str(e.value)
    with pytest.raises(DiagError, match="regenerate"):
        vllm_release("vllm-0.99.0")
    with pytest.raises(DiagError, match="not a vLLM release version"):
        vllm_release("vllm-latest")


def test_every_rule_covers_every_release_once():
    for name in {r.name for r in ROWS}:
        rows = [r for r in ROWS if r.name == name]
        covered = [v for r in rows for v in RELEASES[RELEASES.index(r.first):RELEASES.index(r.last) + 1]]
        assert covered == list(RELEASES), name
    assert EXECUTED[-1] == NEWEST and EXECUTED[0] == RELEASES[0]
    assert set(EXECUTED) <= set(rule_change_releases())


def test_rule_values_read_from_the_wheels():
    assert rule("aux_ids_source", "vllm-0.11.0")[0].startswith("always the model's default")
    assert rule("aux_ids_source", "vllm-0.32.0")[0] == "drafter config.json eagle_aux_hidden_state_layer_ids"
    assert rule("aux_default.llama", "vllm-0.32.0") == "(2, num_layers // 2, num_layers - 3)"
    assert rule("log_line", "vllm-0.8.5")[1] == "num_accepted_tokens / num_drafts"       # no bonus token
    assert rule("log_line", "vllm-0.9.0")[1] == "1 + num_accepted_tokens / num_drafts"
    assert span(rule_row("aux_capture.llama", "vllm-0.18.0")) == "0.18.0–0.34.0"


@pytest.mark.parametrize("eng, ids, want", [
    ("vllm-0.32.0", [0, 2, 4], "embed+L2+L4"), ("vllm-0.32.0", [4, 2, 0], "embed+L2+L4"),
    ("vllm-0.32.0", [1, 3, 6], "L1+L3+L6"), ("vllm-0.32.0", None, "L2+L3"),
    ("vllm-0.11.0", [0, 2, 4], "L2+L3"), ("vllm-0.17.1", [1, 3, 5], "L1+L3+L5")])
def test_served_layout(eng, ids, want):
    assert capture.served("llama", ids, 6, eng).layout == want


def test_served_layout_refusals():
    with pytest.raises(DiagError, match="cannot serve aux id 0"):
        capture.served("llama", [0, 2, 4], 6, "vllm-0.17.1")
    with pytest.raises(DiagError, match="never captures aux id 6"):
        capture.served("llama", [2, 4, 6], 6, "vllm-0.17.1")
    with pytest.raises(DiagError, match="no EAGLE-3 capture for deepseek"):
        capture.served("deepseek", [1, 2, 3], 6, "vllm-0.17.1")
    assert capture.served("deepseek", [1, 2, 6], 6, "vllm-0.25.0").layout == "L1+L2+L6"
    with pytest.raises(DiagError, match="never captures"):
        capture.served("deepseek", [1, 2, 6], 6, "vllm-0.24.0")


SPEC = '{"method": "eagle3", "model": "/d", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}'


def test_launch_commands():
    a = parse_launch(f"vllm serve /m --speculative-config '{SPEC}'", "vllm-0.32.0")
    b = parse_launch(f"python -m vllm.entrypoints.openai.api_server --model /m --speculative-config='{SPEC}'")
    c = parse_launch("vllm serve /m --speculative-config.method eagle3 --speculative-config.model /d "
                     "--speculative-config.num_speculative_tokens 3 --speculative-config.draft_tensor_parallel_size 1")
    assert a.target == b.target == c.target == "/m"
    assert a.spec == b.spec == c.spec and a.spec.num_speculative_tokens == 3 and a.spec.method == "eagle3"
    assert parse_launch("vllm serve /m").spec is None


def test_speculative_config_errors():
    with pytest.raises(DiagError, match="is not JSON: Expecting property name.* at character 1") as e:
        parse_launch("vllm serve /m --speculative-config \"{method: 'eagle3'}\"")
    assert "'{' ⟶ \"method: 'eagle3'}\"" in str(e.value)
    with pytest.raises(DiagError, match="a method diag does not model"):
        parse_spec_config({"method": "ngram", "num_speculative_tokens": 3})
    with pytest.raises(DiagError, match="an unknown method"):
        parse_spec_config({"method": "eagle4", "num_speculative_tokens": 3})
    with pytest.raises(DiagError, match="vLLM 0.8.5 does not know") as e:
        parse_spec_config({"method": "eagle3", "num_speculative_tokens": 3, "speculative_token_tree": "[(0,)]"},
                          "vllm-0.8.5")
    assert "speculative_token_tree" in str(e.value)
    with pytest.raises(DiagError, match="needs num_speculative_tokens"):
        parse_spec_config({"method": "eagle3", "model": "/d"})
    with pytest.raises(DiagError, match="not a vLLM launch command"):
        parse_launch("python -m sglang.launch_server --model /m")


LOG = """(APIServer pid=9993) INFO 12-04 19:29:18 [api_utils.py:347]  version 0.32.0
(EngineCore pid=10536) INFO 12-04 19:30:04 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: \
model='/m', speculative_config=SpeculativeConfig(method='eagle3', model='/d', num_spec_tokens=3), tokenizer='/m'
(APIServer pid=9993) INFO 12-04 19:30:30 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 2.76, \
Accepted throughput: 98.10 tokens/s, Drafted throughput: 167.40 tokens/s, Accepted: 981 tokens, Drafted: 1674 \
tokens, Per-position acceptance rate: 0.790, 0.600, 0.368, Avg Draft acceptance rate: 58.6%
"""


def test_log_release_spec_and_intervals():
    assert detect.release_from_log(LOG, source="server.log").version == "0.32.0"
    assert detect.spec_from_log(LOG) == ("eagle3", "/d", 3)
    (i,) = detect.log_intervals(LOG, "vllm-0.32.0", source="server.log")
    assert (i.drafts, i.accepted, i.per_position) == (558, 981, (0.79, 0.6, 0.368))
    assert detect.logged_accept_length(i, "vllm-0.32.0") == 2.76
    with pytest.raises(DiagError, match="unknown vLLM release"):
        detect.release_from_log("Initializing a V1 LLM engine (v0.7.3) with config", source="old.log")


SCRAPE = """vllm:spec_decode_num_drafts_total{engine="0",model_name="/zoo/llama-tiny"} 558.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/zoo/llama-tiny"} 1674.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/zoo/llama-tiny"} 981.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/zoo/llama-tiny",position="0"} 441.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/zoo/llama-tiny",position="1"} 335.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/zoo/llama-tiny",position="2"} 205.0
"""


def test_scrape_model_and_counters():
    c = detect.read_scrape(SCRAPE, source="metrics.txt", model="/other/llama-tiny")
    assert round(c.accept_length, 3) == 2.758 and c.num_speculative_tokens == 3
    with pytest.raises(DiagError, match="from another model") as e:
        detect.read_scrape(SCRAPE, source="metrics.txt", model="/zoo/qwen3-tiny")
    assert "/zoo/llama-tiny" in str(e.value)
    with pytest.raises(DiagError, match="no vLLM speculative-decoding counters"):
        detect.read_scrape('vllm:num_requests_running{model_name="m"} 0\n', source="metrics.txt")
    with pytest.raises(DiagError, match="not a vLLM /metrics scrape"):
        detect.read_scrape("sglang:num_running_reqs 0\n", source="metrics.txt")


def test_engine_sanity_verdict():
    runs = [sanity.Sampled(1.0, 1.05, 558), sanity.Sampled(0.3, 1.09, 558), sanity.Sampled(0.01, 1.01, 558)]
    v = sanity.check(runs, 2.76, 3, "vllm-0.32.0")
    assert v.defect and v.engine == "vLLM 0.32.0" and round(v.tolerance, 2) == 0.44
    assert "ENGINE DEFECT in vLLM 0.32.0" in v.message and "rejection_sampler.py" in v.message
    assert "fits none" in v.message and "layout" in v.message
    assert "If this server runs on CPU" in v.message and "int64 copy" in v.message
    cpu = sanity.check(runs, 2.76, 3, "vllm-0.32.0", platform="cpu")
    assert "This server runs on CPU: vLLM 0.32.0 has a known defect" in cpu.message
    assert "int64 copy" not in sanity.check(runs, 2.76, 3, "vllm-0.32.0", platform="cuda").message
    assert "int64 copy" not in sanity.check(runs, 2.76, 3, "vllm-0.34.0").message
    ok = sanity.check([sanity.Sampled(1.0, 1.3), sanity.Sampled(0.01, 2.70, 558)], 2.76, 3, "vllm-0.32.0",
                      greedy_source="diag's greedy prediction")
    assert ok.verdict == "OK" and "diag's greedy prediction" in ok.message
    assert sanity.check([sanity.Sampled(1.0, 1.05)], 2.76, 3, "vllm-0.32.0").verdict == "NO VERDICT"


def test_rejection_port_examples():
    g = rejection.greedy(torch.tensor([5, 7, 2]), torch.tensor([5, 7, 9]), 4)
    assert (g.tokens, g.accepted) == ((5, 7, 9), 2)
    assert rejection.greedy(torch.tensor([5, 7]), torch.tensor([5, 7]), 4).tokens == (5, 7, 4)
    p = torch.zeros(2, 5)
    p[0, 3], p[0, 0], p[1, 1], p[1, 4] = 0.6, 0.4, 0.8, 0.2
    s = rejection.sampled(torch.tensor([3, 1]), p, 2, torch.tensor([0.5, 0.9], dtype=torch.float64),
                          torch.ones(5))
    assert (s.tokens, s.accepted) == ((3, 4), 1)        # recovered: p_1 with token 1 zeroed -> 4
    assert math.isclose(rejection.expected_accept_length(torch.tensor([3, 1]), p), 2.08, rel_tol=1e-6)


# ---- differential tests: vLLM's own code from its wheels --------------------------------------------

def _vllm_v1_trials(version: str) -> list[dict]:
    """vLLM's v1 kernels on 12 seeded requests, in a subprocess with TRITON_INTERPRET=1 from the
    start (tests/vllm_v1_sampler.py says why): the test gave "@triton.jit outside a kernel" when
    an earlier test of the session had imported triton without it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).with_name("vllm_v1_sampler.py")
    done = subprocess.run([sys.executable, str(script), version], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.wheel
@pytest.mark.parametrize("version", [v for v in EXECUTED if rule_row("rejection_sampler", v).source == V1_SAMPLER])
def test_rejection_kernels_equal_the_port(version):
    for trial, row in enumerate(_vllm_v1_trials(version)):
        draft, probs = torch.tensor(row["draft"]), torch.tensor(row["probs"], dtype=torch.float32)
        u, e, bonus = torch.tensor(row["u"], dtype=torch.float64), torch.tensor(row["e"]), row["bonus"]
        k = len(draft)
        assert tuple(row["greedy"]) == rejection.greedy(draft, probs.argmax(-1), bonus).tokens, (version, trial)
        got = tuple(row["sampled"])
        assert got == rejection.sampled(draft, probs, bonus, u, 1.0 / e).tokens, (version, trial)
        # the decode loop's vLLM rule (diag.replay.sampling.verify_chain_rejection, "chain-rejection") accepts
        # the same drafts for the same coins
        tokens = torch.cat([torch.tensor([0]), draft])[None]
        loop = verify_chain_rejection(tokens, torch.cat([probs, probs[:1]])[None], u[None], torch.zeros(1))
        accepted = len(got) - 1 if len(got) <= k else k
        assert int(loop.accepted[0]) == accepted, (version, trial)


@pytest.mark.wheel
@pytest.mark.parametrize("version", EXECUTED)
def test_log_line_of_the_wheel_reads_back(version):
    import vllm_wheels

    class _Logger:
        def info(self, *a, **k):
            pass
    ns = vllm_wheels.load(version, rules_gen._METRICS, ["SpecDecodingStats", "SpecDecodingLogging"],
                          extra={"time": __import__("time"), "dataclass": __import__("dataclasses").dataclass,
                                 "field": __import__("dataclasses").field, "logger": _Logger(),
                                 "Optional": __import__("typing").Optional})
    stats = ns["SpecDecodingStats"].new(3)
    for a in (3, 1, 0, 2, 3, 1):
        stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=a)
    logging = ns["SpecDecodingLogging"]()
    logging.observe(stats)
    lines = []
    logging.log(log_fn=lambda fmt, *args: lines.append(fmt % args))
    (i,) = detect.log_intervals(lines[0], version, source=f"vllm-{version} log")
    assert (i.accepted, i.drafted, i.drafts) == (10, 18, 6)
    assert round(detect.logged_accept_length(i, version), 2) == round(1 + 10 / 6, 2)
    assert i.per_position == (round(5 / 6, 3), round(3 / 6, 3), round(2 / 6, 3))


@pytest.mark.wheel
@pytest.mark.parametrize("version", EXECUTED)
def test_default_aux_layers_and_table_equal_the_wheel(version):
    """The generator re-reads this release and finds the table's values; the default method runs."""
    import vllm_wheels
    facts = rules_gen.facts(version)
    for name, (value, _) in facts.items():
        assert rule(name, version) == value, (version, name)
    for family, (owner, _) in rules_gen.FAMILIES.items():
        if not rule(f"aux_default.{family}", version).startswith("("):
            continue
        src = facts[f"aux_default.{family}"][1]          # the file at this release (methods move)
        tree = vllm_wheels._tree(version, src)
        method = next(m for m in ("get_eagle3_default_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers")
                      if any(isinstance(n, ast.FunctionDef) and n.name == m for n in ast.walk(tree)))
        fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == method)
        ns = {}
        exec(compile(ast.Module(body=[fn], type_ignores=[]), src, "exec"), ns)
        fake = type("M", (), {"model": type("I", (), {"layers": [0] * 61})()})()
        assert tuple(ns[method](fake)) == capture.default_ids(family, 61, version) == (2, 30, 58)


def test_wheels_network_failure_is_a_diag_error(monkeypatch, tmp_path):
    from diag.engines.vllm import wheels
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(wheels, "INDEX", "http://127.0.0.1:9/pypi")     # nothing listens on port 9
    monkeypatch.setattr(wheels, "_TIMEOUT", 2)
    wheels._project.cache_clear()
    wheels.release_files.cache_clear()
    try:
        with pytest.raises(DiagError, match="cannot reach the package index") as e:
            wheels.read("0.32.0", "vllm/v1/spec_decode/metrics.py")
        assert "127.0.0.1:9" in str(e.value)
    finally:
        wheels._project.cache_clear()
        wheels.release_files.cache_clear()


@pytest.mark.wheel
def test_wheels_unknown_release_and_absent_member(tmp_path, monkeypatch):
    from diag.engines.vllm import wheels
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path))
    with pytest.raises(DiagError, match="unknown vLLM release"):
        wheels.read("0.99.0", "vllm/config.py")
    assert wheels.read("0.34.0", "vllm/v1/sample/rejection_sampler.py") is None      # moved in 0.34.0
    text = wheels.read_text("0.34.0", "vllm/v1/spec_decode/metrics.py")
    assert "SpecDecoding metrics" in text
    assert (tmp_path / "vllm-wheels/0.34.0/vllm/v1/spec_decode/metrics.py").read_text() == text


# ---- the EngineRules protocol ------------------------------------------------------------------------

LLAMA6 = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 6, "vocab_size": 1000}


def test_vllm_engine_rules():
    from diag.engines import EngineRules
    from diag.engines.vllm.rules import RULES as r
    from diag.layouts import layout
    engine = r.release
    rel = engine("vllm-0.32.0")
    assert isinstance(r, EngineRules) and rel.label == "vLLM 0.32.0" and engine("vllm-0.9.0.1").release == (0, 9, 0, 1)
    plan = r.serving_plan({"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}, LLAMA6, release=rel)
    assert str(plan.layout) == "embed+L2+L4" and "literally" in plan.rule and plan.fc_inputs == 3
    nested = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}}
    assert str(r.serving_plan(nested, LLAMA6, release=rel).layout) == "L1+L3+L5"          # 0.22.0-0.33.0
    late = r.serving_plan(nested, LLAMA6, release=engine("vllm-0.34.0"))          # nested ids: not read
    assert str(late.layout) == "L2+L3" and "feeds 2 states (L2+L3) to an fc built for 3" in late.crash
    renamed = {"eagle_config": {"layer_ids": [1, 3, 5]}}                           # what 0.34.0 reads
    assert str(r.serving_plan(renamed, LLAMA6, release=engine("vllm-0.34.0")).layout) == "L1+L3+L5"
    err = r.serving_plan({"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}, LLAMA6, release=engine("vllm-0.17.1"))
    assert "cannot serve aux id 0" in str(err)
    assert r.serving_ids(layout("embed+L2+L4"), LLAMA6, release=rel) == [0, 2, 4]
    fix = r.fix_for(layout("embed+L2+L4"), LLAMA6, release=engine("vllm-0.11.0"))
    assert fix.ids is None and fix.upgrade == ("0.18.0", [0, 2, 4])
    assert str(r.default_aux_layers(LLAMA6, release=rel)) == "L2+L3"
    assert r.resolve_tree(3, None, None, LLAMA6, release=rel).shape.name == "chain-3"
    assert r.resolve_tree(3, 4, 8, LLAMA6, release=rel).crash
    assert r.verification(rel).sampled == "chain-rejection"
    d = {"hidden_size": 64, "vocab_size": 1000, "draft_vocab_size": 1000}
    t = r.draft_tables(d, "eagle3", release=engine("vllm-0.11.0"))
    assert (t.embed, t.lm_head) == ("target", "target") and "0.11.0" in t.why        # the trained head unused
    assert (r.draft_tables(d, "eagle3", release=engine("vllm-0.9.0")).embed,
            r.draft_tables({**d, "target_hidden_size": 128}, "eagle3", release=engine("vllm-0.10.0")).embed) == \
        ("target", "drafter")
    t = r.draft_tables({**d, "draft_vocab_size": 300}, "eagle3", release=rel)
    assert (t.lm_head, t.uses_d2t) == ("drafter", True)
    assert r.draft_tables(d, "eagle3", release=rel).uses_d2t is False                   # 0.30.0+: same vocab
    assert plan.embed == "target" and "checkpoint has no embed_tokens" in plan.notes[0]
    assert r.accept_rate_formula(rel) == "draft_accept_rate"
    assert "Σa / (rounds·k)" in r.formula_label("draft_accept_rate")


def test_vllm_engine_launch_lint():
    from diag.engines.vllm.rules import RULES as r
    engine = r.release
    rel = engine("vllm-0.32.0")
    flags = r.parse_launch(f"vllm serve /m -tp 2 --speculative-config '{SPEC}'", release=rel)
    assert (flags.model_path, flags.draft_model_path, flags.num_steps, flags.tp_size) == ("/m", "/d", 3, 2)
    assert r.effective_config(flags, LLAMA6, release=rel).tree.shape.name == "chain-3"
    assert r.launch_argv("python -m vllm.entrypoints.openai.api_server --model /m") == ["--model", "/m"]
    (p,) = r.flag_problems(["/m", "--speculative-config", "{bad"], release=rel)
    assert p.severity == "error" and "not JSON" in p.message and p.parser == "vLLM 0.32.0"
    assert r.flag_problems(["/m", "--speculative-config", SPEC], release=rel) == []
    with pytest.raises(DiagError, match="another vLLM release"):
        r.read_log(LOG, source="server.log", release=engine("vllm-0.31.0"))
    assert r.read_log(LOG, source="server.log", release=rel)[0].drafts == 558


V2_SAMPLER = "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"


@pytest.mark.wheel
@pytest.mark.parametrize("version", [v for v in EXECUTED if rule_row("rejection_sampler", v).source == V2_SAMPLER])
def test_v2_rejection_sampler_greedy_equals_the_port(version):
    """Model runner v2's rejection_sample at temperature 0, batched (k = 1, 3, 4, 2), in a subprocess
    with TRITON_INTERPRET=1 from the start (tests/vllm_v2_sampler.py says why)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).with_name("vllm_v2_sampler.py")
    for seed in (0, 1):
        done = subprocess.run([sys.executable, str(script), version, str(seed)], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        for req in json.loads(done.stdout):
            k = len(req["draft"])
            want = rejection.greedy(torch.tensor(req["draft"]), torch.tensor(req["argmax"][:k]), req["argmax"][k])
            assert tuple(req["tokens"]) == want.tokens, (version, seed, req)


def test_lint_reads_speculative_config_through_the_protocol(tmp_path):
    """`diag lint --engine vllm-0.32.0 --launch "vllm serve ..."`: the launch line's JSON and keys are
    judged by vLLM 0.32.0's SpeculativeConfig, and the served layout by its capture rule."""
    from test_lint import write_drafter, write_target
    from diag.checks.lint import lint
    t, d = write_target(tmp_path / "t"), write_drafter(tmp_path / "d", eagle_aux_hidden_state_layer_ids=[1, 3, 5])
    bad = lint(str(d), str(t), "vllm serve t --speculative-config \"{method: 'eagle3'}\"", engine="vllm-0.32.0")
    (spec,) = [f for f in bad if f.code == "SPEC_CONFIG"]
    assert spec.severity == "error" and "character 1" in spec.message and spec.engine == "vllm-0.32.0"
    key = lint(str(d), str(t), "vllm serve t --speculative-config '{\"method\": \"eagle3\", \"model\": \"d\", "
               "\"num_speculative_tokens\": 3, \"speculative_token_tree\": \"[(0,)]\"}'", engine="vllm-0.32.0")
    assert any(f.code == "SPEC_CONFIG" and "speculative_token_tree" in f.fix for f in key)
    good = lint(str(d), str(t), f"vllm serve t --speculative-config '{SPEC}'", engine="vllm-0.32.0")
    assert not [f for f in good if f.code in ("SPEC_CONFIG", "TREE_REWRITE")]


def test_explain_counters():
    from diag.engines.vllm import explain
    e = explain.explain_scrape(detect.read_scrape(SCRAPE, source="m.txt"), "vllm-0.32.0")
    assert (e.k, round(e.accept_length, 3), round(e.draft_acceptance_rate, 3)) == (3, 2.758, 0.586)
    assert [round(x, 3) for x in e.at_position] == [0.79, 0.6, 0.367] and e.consistent
    assert [round(x, 3) for x in e.conditional] == [0.79, 0.76, 0.612]
    assert round(explain.explain(558, 1674, 981, [441, 335, 205], "vllm-0.8.5").logged_mean, 2) == 1.76
    bad = explain.explain(100, 300, 90, [20, 40, 30], "vllm-0.32.0")
    assert not bad.consistent and "INCONSISTENT: position 1" in bad.sentences[-1]
    lg = explain.explain_log(detect.log_intervals(LOG, "vllm-0.32.0", source="s.log"), "vllm-0.32.0", source="s.log")
    assert (lg.drafts, lg.accepted, lg.per_pos, lg.consistent) == (558, 981, (441, 335, 205), True)
    with pytest.raises(DiagError, match="chains of k drafts"):
        explain.explain(100, 250, 90, [], "vllm-0.32.0")


def test_cli_explain_reconciles_a_scrape(tmp_path, capsys):
    from diag.cli import main
    (tmp_path / "m.txt").write_text(SCRAPE)
    assert main(["explain", "--engine", "vllm-0.32.0", "--metrics", str(tmp_path / "m.txt")]) == 0
    assert "accept length 1 + 981/558 = 2.758" in capsys.readouterr().out
    (tmp_path / "s.log").write_text(LOG)
    assert main(["explain", "--engine", "vllm-0.31.0", "--server-log", str(tmp_path / "s.log")]) == 2
    assert "another vLLM release" in capsys.readouterr().err
    assert main(["explain", "--engine", "sglang-0.5.23", "--metrics", str(tmp_path / "m.txt")]) == 2
    assert "exports no counters" in capsys.readouterr().err


def test_detect_engine_from_server_output():
    assert detect.detect(log=LOG).name == "vllm-0.32.0"
    assert detect.detect(launch=f"vllm serve /m --speculative-config '{SPEC}'").release is None
    assert detect.detect(metrics=SCRAPE).name == "vllm"
    assert detect.detect(launch="python -m sglang.launch_server --model-path /m", metrics="sglang:x 1") is None
    detect.check_named("vllm-0.32.0", detect.detect(log=LOG))
    with pytest.raises(DiagError, match="not the engine named"):
        detect.check_named("sglang-0.5.23", detect.detect(metrics=SCRAPE))
    with pytest.raises(DiagError, match="another vLLM release"):
        detect.check_named("vllm-0.31.0", detect.detect(log=LOG))


@pytest.mark.wheel
@pytest.mark.parametrize("version", [v for v in EXECUTED if rule("cpu_expand", v).startswith("DEFECT")])
def test_cpu_expand_defect_executes_from_the_wheel(version):
    """vLLM's CPU wrapper _expand_kernel_impl, run from the wheel with a stand-in for the C++ op that
    writes in place as the Triton expand_kernel does: the float32 temperatures never reach the output."""
    import vllm_wheels

    def op(output, input_val, cu, replace_from, replace_to):          # expand_kernel's semantics
        start = 0
        for r, end in enumerate(cu.tolist()):
            v = input_val[r]
            output[start:end] = replace_to if v == replace_from else v
            start = end

    fake_torch = type("T", (), {"int64": torch.int64, "ops": type("O", (), {"_C": type("C", (), {
        "expand_kernel_impl": staticmethod(op)})})})
    ns = vllm_wheels.load(version, "vllm/utils/cpu_triton_utils.py", ["_ensure_int64", "_expand_kernel_impl"])
    ns["torch"] = fake_torch
    temperature = torch.tensor([0.3, 1.0, 0.01])
    out = torch.full((6,), -7.0)
    ns["_expand_kernel_impl"](out, temperature, torch.tensor([2, 4, 6]), 0, 1)
    assert out.tolist() == [-7.0] * 6                                  # nothing written: the defect
    ints = torch.zeros(6, dtype=torch.int64)
    ns["_expand_kernel_impl"](ints, torch.tensor([3, 0, 5]), torch.tensor([2, 4, 6]), 0, 1)
    assert ints.tolist() == [3, 3, 1, 1, 5, 5]                         # int64 outputs (top-k) are fine


def test_request_defaults():
    from diag.engines.vllm.rules import RULES as r
    rel = r.release("vllm-0.32.0")
    d = r.request_defaults({"temperature": 0.6, "top_p": 0.95, "repetition_penalty": 1.05}, release=rel)
    assert d.values == {"temperature": 0.6, "top_p": 0.95, "top_k": -1} and d.from_generation_config
    assert d.unmodelled == {"repetition_penalty": 1.05}
    plain = r.request_defaults({"temperature": 0.6}, "vllm", release=rel)
    assert plain.values == {"temperature": 1.0, "top_p": 1.0, "top_k": -1} and plain.source == "vLLM defaults"
    assert r.request_defaults(None, release=r.release("vllm-0.8.5")).values["top_k"] == -1
