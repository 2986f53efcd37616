"""Each prompt-side effect on the zoo's trained pairs (issue 14), visible in the report and absent
in its control:

  rendering   llama-tiny-think served with thinking on, its drafter trained thinking off
              -> RENDERING MISMATCH; served as trained -> rendering-match
  coverage    llama-tiny-eagle3-nows (no whitespace tokens in its hot vocabulary)
              -> DRAFT VOCABULARY LIMITS ACCEPTANCE; the embed drafter it came from -> ok
  datasets    the same pair in `diag compare`: the code category loses most
  loops       prompts whose continuations repeat a line -> LOOPS INFLATE; plain code -> no warning
  long ctx    llama-tiny-eagle3-short (27 training positions) on a 1024-token ladder -> marked;
              llama-tiny-eagle3-embed (131 positions) on the same ladder -> not marked
"""

import json
from pathlib import Path

import pytest

from diag.cli.main import main
from diag.zoo import zoo_path

pytestmark = pytest.mark.slow


def _run(tmp_path, name, *args) -> tuple[dict, str]:
    out = tmp_path / name
    assert main(["run", *args, "--out", str(out), "--quiet", "--tree", "chain-3"]) == 0
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def _verdicts(rep: dict) -> dict:
    return {v["kind"]: v for v in rep["verdicts"]}


def _pair(drafter: str, *extra) -> list[str]:
    return ["--target", str(zoo_path("llama-tiny", progress=False)),
            "--drafter", str(zoo_path(drafter, progress=False)), "--layout", "embed+L2+L4", *extra]


# ---- renderings ---------------------------------------------------------------------------

def test_thinking_on_costs_a_drafter_trained_thinking_off(tmp_path):
    rep, md = _run(tmp_path, "think", "cases/thinking.toml")
    v = _verdicts(rep)["rendering-mismatch"]
    assert v["severity"] == "warning" and v["evidence"]["ci95"][1] < 0
    assert v["evidence"]["serving"] == "chat+think" and v["evidence"]["trained"] == "chat+nothink"
    rows = {r["rendering"]: r for r in rep["renderings"]["rows"]}
    assert set(rows) == {"chat+think", "chat+nothink", "raw"}
    ex = rows["chat+nothink"]["differs_from_serving"]["examples"][0]
    assert ex["serving"] == "" and ex["other"].startswith("</think>")      # the switch, decoded
    assert "## Prompt renderings" in md and "RENDERING MISMATCH" in md
    # control: served as trained
    rep, _ = _run(tmp_path, "think-control", "cases/thinking.toml", "--serving-rendering", "chat+nothink")
    kinds = _verdicts(rep)
    assert "rendering-mismatch" not in kinds and kinds["rendering-match"]["severity"] == "ok"


# ---- coverage, datasets --------------------------------------------------------------------

@pytest.fixture(scope="module")
def coverage_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("coverage")
    return (_run(d, "nows", *_pair("llama-tiny-eagle3-nows")), _run(d, "embed", *_pair("llama-tiny-eagle3-embed")),
            d)


def test_a_hot_vocabulary_without_whitespace_limits_acceptance(coverage_pair):
    (nows, md), (embed, _), _ = coverage_pair
    v = _verdicts(nows)["vocabulary-coverage"]
    assert v["severity"] == "warning" and v["evidence"]["rejected_at_uncovered"]["ci95"][0] > 0.10
    assert all(t["text"].strip() == "" for t in nows["coverage"]["top_uncovered"][:3])
    assert "## Draft-vocabulary coverage" in md and "DRAFT VOCABULARY LIMITS ACCEPTANCE" in md
    control = _verdicts(embed)
    assert "vocabulary-coverage" not in control and control["vocabulary-coverage-ok"]["severity"] == "ok"
    assert nows["coverage"]["ceiling_measured"] < embed["coverage"]["ceiling_measured"] - 0.3
    assert nows["coverage"]["uncovered"]["share"] > 5 * embed["coverage"]["uncovered"]["share"]


def test_acceptance_by_dataset_in_the_report_and_in_compare(coverage_pair, capsys):
    (nows, _), (embed, md), d = coverage_pair
    assert "## Acceptance by dataset" in md
    cats = {c["category"] for c in embed["evaluations"][0]["by_category"]}
    assert {"code", "chat", "math"} <= cats
    assert main(["compare", str(d / "embed"), str(d / "nows"), "--json"]) == 0
    cmp = json.loads(capsys.readouterr().out)
    (var,) = [v for v in cmp["variants"] if v["layout"] == "embed+L2+L4" and v["mode"] == "eagle3"]
    by = {c["category"]: c for c in var["by_category"]}
    assert by["code"]["paired"] and by["code"]["significant"] and by["code"]["difference"] < 0
    # The dataset whose continuations hold the most whitespace (the tokens nows cannot propose) loses
    # more than the one holding the least: which datasets those are is the target's doing (measured:
    # math 33% uncovered, -1.14; code 8%, -0.38; chat 24%, -0.46), the order is diag's to get right.
    share = {c["category"]: c["uncovered"]["share"] for c in nows["coverage"]["by_category"]}
    most, least = max(share, key=share.get), min(share, key=share.get)
    assert share[most] > share[least] + 0.1 and by[most]["difference"] < by[least]["difference"]
    assert main(["compare", str(d / "embed"), str(d / "nows"), "--markdown"]) == 0
    table = capsys.readouterr().out.split("## Accept length by dataset")[1]
    assert "| `embed+L2+L4` | eagle3 | code |" in table and " *" in table


# ---- loops --------------------------------------------------------------------------------

def _prompts(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_looping_continuations_inflate_accept_length(tmp_path):
    code = [json.loads(line) for line in open("cases/prompts/mixed-48.jsonl")][:8]
    loops = [{"id": f"loop-{n}", "category": "loop", "text": f"    self.{n} = {n}\n" * 8}
             for n in ("name", "path", "data", "size", "mode", "args", "text", "line")]
    # The DeepSeek pair: its drafter leans on the tokens, so a loop is where it does best (measured
    # 3.81 inside loops, 2.37 without). The llama-tiny drafter trained against the target's
    # distribution reads the states and does better outside loops (3.28 against 3.06): no warning.
    pair = ["--target", str(zoo_path("deepseek-tiny", progress=False)),
            "--drafter", str(zoo_path("deepseek-tiny-eagle3", progress=False)), "--layout", "embed+L2+L3"]
    rep, md = _run(tmp_path, "loops", *pair, "--prompts", _prompts(tmp_path / "p.jsonl", code + loops))
    v = _verdicts(rep)["loops"]
    assert v["severity"] == "warning" and rep["loops"]["difference"]["ci95"][0] > 0
    assert rep["loops"]["in_loops"]["accept_length"] > rep["loops"]["without_loops"]["accept_length"] + 0.5
    assert "## Loops" in md and "LOOPS INFLATE ACCEPT LENGTH" in md
    rep, _ = _run(tmp_path, "llama", *_pair("llama-tiny-eagle3-embed", "--prompts",
                                            _prompts(tmp_path / "p2.jsonl", code + loops)))
    assert _verdicts(rep).get("loops", {"severity": "info"})["severity"] == "info"
    assert rep["loops"]["difference"]["ci95"][0] <= 0


# ---- long context -------------------------------------------------------------------------

LADDER = """version = 1
name = "long-context"
[target]
path = "{target}"
[drafter]
path = "{drafter}"
[prompts]
file = "{prompts}"
limit = 4
max_new_tokens = 64
[evaluate]
layouts = ["embed+L2+L4"]
trees = ["chain-3"]
[long_context]
length = 1024
file = "{text}"
rungs = 4
per_rung = 4
"""


def test_a_short_context_drafter_falls_below_half_at_long_context(tmp_path):
    # measured: short (27 training positions) 1.89, 1.30, 1.30, 1.30 at prompts of 16, 320, 640,
    # 960 tokens; the embed drafter (227 positions, the control) 2.23, 1.96, 1.92, 1.45
    corpus = zoo_path("stdlib-corpus", progress=False)
    text = tmp_path / "heldout.txt"
    text.write_text("\n\n".join(json.loads(line)["text"] for line in open(corpus / "heldout.jsonl")))
    reports = {}
    for drafter in ("llama-tiny-eagle3-short", "llama-tiny-eagle3-embed"):
        case = tmp_path / f"{drafter}.toml"
        case.write_text(LADDER.format(target=zoo_path("llama-tiny", progress=False), text=text,
                                      drafter=zoo_path(drafter, progress=False),
                                      prompts=Path("cases/prompts/mixed-48.jsonl").resolve()))
        reports[drafter] = _run(tmp_path, drafter, str(case))
    (rep, md), (control, _) = reports["llama-tiny-eagle3-short"], reports["llama-tiny-eagle3-embed"]
    sec = rep["long_context"]
    assert sec["falls_below_half_at"] is not None and sec["rungs"][-1]["below_half"]
    assert _verdicts(rep)["long-context"]["severity"] == "warning"
    assert "## Long context" in md and "plots/long_context.png" in md
    # the control (trained on 227 positions) holds where the short drafter has fallen, and falls
    # later: at 960 tokens, past four times its training length
    falls = control["long_context"]["falls_below_half_at"]
    assert falls is None or falls > sec["falls_below_half_at"]
    assert not any(r["below_half"] for r in control["long_context"]["rungs"][:3])
