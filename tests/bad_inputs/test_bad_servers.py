"""Live servers and saved server files a careless or unlucky user gives `diag probe` and
`diag run --server` (issues 32.4 and 35): a URL nothing answers, the wrong engine, a /metrics
scrape of another model, a server that is no inference engine, saved files given beside a
live server; and two saved-response shapes that must be usable (only completion_tokens and
spec_verify_ct; no request ids but the prompt text). The live servers are the local fakes of
tests/fake_servers.py, stopped after each entry."""

import json
import socket

import pytest

from bad_catalogue import Bad, Error, Handled
from fake_servers import Fake

_RUNNING: list[Fake] = []


@pytest.fixture(autouse=True)
def _stop_fakes():
    yield
    while _RUNNING:
        _RUNNING.pop().__exit__(None, None, None)


def fake(engine: str, **knobs) -> str:
    f = Fake(engine).__enter__()
    for k, v in knobs.items():
        setattr(f, k, v)
    _RUNNING.append(f)
    return f.url


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def probe(url, *extra):
    return lambda c: ["probe", "--server", url() if callable(url) else url, "--prompts",
                      c.lines("text.jsonl", [{"id": f"q{i}", "text": f"def f{i}(x):"} for i in range(3)]),
                      "--out", c.out, "--quiet", "--retries", "1", *extra]


def _no_engine(ctx):
    url = fake("sglang")
    _RUNNING[-1].get = lambda path: (404, {"detail": "Not Found"})
    return probe(url)(ctx)


def _foreign_out(ctx):
    ctx.out.mkdir()
    (ctx.out / "notes.txt").write_text("mine")
    return probe(fake("vllm"))(ctx)


def _two_fields(ctx):
    rows = [{"id": i, "meta_info": {"id": i, "completion_tokens": 8, "spec_verify_ct": 4}}
            for i in ("p0", "p1", "p2", "chat")]
    return ctx.run("--server-responses", ctx.lines("two.jsonl", rows))


def _by_text(ctx):
    prompts = {json.loads(x)["id"]: json.loads(x) for x in ctx.pair["prompts"].read_text().splitlines()}
    rows = [{"prompt": p["text"], "meta_info": {"id": f"uuid{n}", "completion_tokens": 8, "spec_verify_ct": 4,
                                                "spec_num_correct_drafts": 3, "spec_num_proposed_drafts": 8}}
            for n, p in enumerate(prompts.values()) if "text" in p]
    rows.append({"id": "chat", "meta_info": {"id": "chat", "completion_tokens": 8, "spec_verify_ct": 4,
                                             "spec_num_correct_drafts": 3, "spec_num_proposed_drafts": 8}})
    return ctx.run("--server-responses", ctx.lines("by_text.jsonl", rows))


def _noted(text):
    """The server section of report.json carries the note, and report.md shows it."""
    def check(ctx):
        assert text in json.dumps(ctx.report()["server"]), ctx.report()["server"]
        assert text in (ctx.out / "report.md").read_text()
    return check


CATALOGUE = [
    Bad("probe-unreachable-server", lambda c: probe(closed_port())(c),
        Error(("cannot reach http://127.0.0.1:", "Connection refused", "--server"))),
    Bad("probe-not-a-url", lambda c: probe("ftp://host/x")(c), Error(("not a server URL", "--server"))),
    Bad("probe-wrong-engine", lambda c: probe(fake("sglang"), "--engine", "vllm")(c),
        Error(("not the engine named", "--engine", "sglang 0.5.23"))),
    Bad("probe-wrong-release", lambda c: probe(fake("vllm"), "--engine", "vllm-0.31.0")(c),
        Error(("another release", "vllm 0.31.0", "vllm 0.32.0"))),
    Bad("probe-unknown-engine", lambda c: probe(fake("vllm"), "--engine", "tgi-2")(c),
        Error(("unknown engine", "tgi-2"))),
    Bad("probe-metrics-of-another-model", lambda c: probe(fake("vllm", metrics_model="Qwen3-8B"))(c),
        Error(("from another model", "Qwen3-8B", 'model_name="llama-tiny"'))),
    Bad("probe-server-is-no-engine", _no_engine, Error(("neither SGLang nor vLLM",))),
    Bad("probe-server-without-speculation", lambda c: probe(fake("vllm", counts={
        "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}, per_pos=[0, 0, 0],
        complete=lambda body: {"id": "c", "choices": [{"text": ""}], "usage": {"completion_tokens": 1}}))(c),
        Error(("not verified any draft", "--speculative-config"))),
    Bad("probe-out-is-a-users-folder", _foreign_out, Error(("refusing to replace", "notes.txt"))),
    Bad("probe-chat-prompts-without-target", lambda c: ["probe", "--server", fake("vllm"), "--prompts",
                                                       c.pair["prompts"], "--out", c.out, "--quiet"],
        Error(("chat prompts", "--target", "prompt chat"))),
    Bad("run-server-with-saved-files", lambda c: c.run("--server", fake("sglang"), "--server-info",
                                                       c.write("i.json", "{}")),
        Error(("--server", "--server-info"))),
    Bad("responses-with-two-fields-only", _two_fields,
        Handled(_noted("only completion_tokens and spec_verify_ct"))),
    Bad("responses-without-ids-paired-by-text", _by_text, Handled(_noted("paired with prompts by their text"))),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_servers(bad, outcome):
    outcome(bad)
