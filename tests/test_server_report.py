"""`diag run --server-*` end to end on tiny random checkpoints: report.json's `server` section
validates against the schema, report.md renders it, and bad server files stop the run before any
target weight is loaded."""

import json

import jsonschema
import pytest

import tiny
from diag.cli.main import main
from diag.run import target_passes
from test_reconcile import write
from test_report import SCHEMA
from test_server_log import PREFIX, msg_0_5_11
from test_server_responses import METRICS, response

IDS = ["p0", "p1", "p2", "p3", "chat"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("srv")
    return d, tiny.make_target(d / "t"), tiny.make_drafter(d / "d"), tiny.make_prompts(d / "p.jsonl", n=4)


def _args(d, t, dr, p, out, *extra):
    return ["run", "--target", str(t), "--drafter", str(dr), "--prompts", str(p), "--out", str(out), "--quiet",
            "--max-new-tokens", "12", "--layout", "embed+L2+L3", "--layout", "L1+L2+L3", "--tree", "chain-2",
            "--no-cache", *extra]


def test_server_section_validates_and_renders(pair, monkeypatch, tmp_path):
    d, t, dr, p = pair
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    log = write(tmp_path, "s.log", "\n".join(
        ["[2026-03-01 09:59:00] server_args=ServerArgs(speculative_algorithm='EAGLE3', speculative_num_steps=2, "
         "speculative_eagle_topk=1, speculative_num_draft_tokens=3, max_running_requests=48)"]
        + [PREFIX + msg_0_5_11(n, 10, 0.01, L, (L - 1) / 2, 40.0 * n, q) for n, L, q in [(4, 1.10, 0), (48, 1.12, 9)]]))
    resp = write(tmp_path, "r.jsonl", "\n".join(json.dumps(response("0.5.23", i, 5, 1, 3)) for i in IDS))
    out = tmp_path / "rep"
    code = main(_args(d, t, dr, p, out, "--server-log", str(tmp_path / log), "--server-responses", str(tmp_path / resp),
                      "--server-baseline-tps", "30", "--server-tps", "28", "--server-accept-length", "1.2",
                      "--server-concurrency", "64"))
    assert code == 0
    rep = json.loads((out / "report.json").read_text())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(rep)]
    assert not errors, errors
    sec = rep["server"]
    assert sec["observed"]["tree"]["name"] == "chain-2" and sec["reconciliation"]["mode"] == "per-request"
    assert sec["speedup"]["basis"] == "server" and sec["concurrency"]["capped"]
    kinds = {v["kind"] for v in rep["verdicts"]}
    assert "server-concurrency" in kinds and kinds & {"server-match", "server-unexplained"}
    md = (out / "report.md").read_text()
    assert "## The live server" in md and "SGLANG_SIMULATE_ACC_LEN=" in md and "per-request RMS" in md


def test_bad_server_files_stop_before_the_target_loads(pair, monkeypatch, tmp_path, capsys):
    d, t, dr, p = pair
    loads = []
    monkeypatch.setattr(target_passes, "load_target", lambda *a, **k: loads.append(a))
    plain = write(tmp_path, "plain.log", PREFIX + msg_0_5_11(8, 10, 0.01, None, None, 90.0, 0))
    wrong = write(tmp_path, "r.jsonl", "\n".join(json.dumps(response("0.5.23", f"x{i}", 5, 1, 3)) for i in range(5)))
    metrics = write(tmp_path, "m.txt", METRICS)
    for flag, path, message in [("--server-log", plain, "no speculative decode line"),
                                ("--server-responses", wrong, "match none of the case's prompt ids"),
                                ("--server-metrics", metrics, "disagree on the tree")]:
        extra = [flag, str(tmp_path / path)] + (["--server-tree", "chain-2"] if flag == "--server-metrics" else [])
        assert main(_args(d, t, dr, p, tmp_path / "out", *extra)) == 2
        assert message in capsys.readouterr().err
    assert loads == [] and not (tmp_path / "out").exists()


def test_validate_reads_the_server_section(pair, tmp_path, capsys):
    d, t, dr, p = pair
    write(tmp_path, "s.log", "\n".join(PREFIX + msg_0_5_11(8, 10, 0.01, 1.5, 0.25, 40.0, 0) for _ in range(3)))
    case = tiny.write_case(tmp_path / "case.toml", t, dr, p)
    case.write_text(case.read_text() + '[server]\nengine = "sglang-0.5.23"\nlog = "s.log"\ntree = "chain-2"\n')
    assert main(["validate", str(case)]) == 0
    assert "server: SGLang 0.5.23; log " in capsys.readouterr().out
    case.write_text(case.read_text().replace('tree = "chain-2"', 'tree = "chain-3"'))
    assert main(["validate", str(case)]) == 2
    assert "the server's sources disagree" in capsys.readouterr().err
    case.write_text(case.read_text().replace('tree = "chain-3"', 'trees = "chain-3"'))
    assert main(["validate", str(case)]) == 2
    assert "server.trees" in capsys.readouterr().err
