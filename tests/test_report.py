"""report.json against its JSON Schema, the schema's README, report.md as a ticket reads it,
and the plots: from a real run on tests/tiny.py checkpoints, plus hand-made sections."""

import copy
import json
import re
from pathlib import Path

import jsonschema
import markdown
import pytest

import tiny
from diag.run.case import read_case
from diag.run.pipeline import run_case
from diag.diagnoses.hooks import report_schema
from diag.report.envelope import SCHEMA_VERSION
from diag.report.markdown import render
from diag.report.plots import make_plots
from diag.report.writer import write_report

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "diag" / "schema"
SCHEMA = report_schema(json.loads((SCHEMA_DIR / "report.schema.json").read_text()))   # + the diagnoses
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    case = tiny.write_case(d / "case.toml", tiny.make_target(d / "t"), tiny.make_drafter(d / "d"),
                           tiny.make_prompts(d / "p.jsonl", n=3), modes=["eagle3", "eagle"],
                           trees=["chain-2", "s2-k2-d4"])
    run = run_case(read_case(case), progress=False, use_cache=False)
    path, rep = write_report(run, d / "out", argv=["diag", "run", str(case)])
    return path, rep


def validator():
    return jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def regimes_section() -> dict:
    """By hand, in diag/diagnoses/quantization_regimes.py's shape: one regime besides the reference."""
    points = ["embed", "L2", "L3", "final"]
    moved = {"embed": (1.0, 0.0), "L2": (0.97, 0.2), "L3": (0.95, 0.3), "final": (0.9, 0.4)}
    return {"reference": "as-loaded", "layout": "embed+L2+L3", "tree": "chain-2", "points": points,
            "regimes": [{"regime": "as-loaded", "argmax_agreement": 1.0, "accept_length": 1.5,
                         "accept_length_ci95": [1.2, 1.8],
                         "drift": {p: {"cosine": 1.0, "relative_l2": 0.0} for p in points}},
                        {"regime": "w4a16-g32", "argmax_agreement": 0.93, "accept_length": 1.25,
                         "accept_length_ci95": [1.1, 1.4], "vs_reference": {"difference": -0.25, "ci95": [-0.4, -0.1]},
                         "drift": {p: {"cosine": c, "relative_l2": r} for p, (c, r) in moved.items()}}],
            "cross": [{"features": "w4a16-g32", "tokens": "as-loaded", "accept_length": 1.3}]}


def test_schema_is_valid_draft_2020_12_and_versions_agree():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["properties"]["schema_version"]["const"] == SCHEMA_VERSION


def test_real_report_validates(written):
    path, rep = written
    on_disk = json.loads((path / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(rep, default=str))
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator().iter_errors(on_disk)]
    assert not errors, errors
    assert on_disk["speedup"] is None or on_disk["speedup"]["rows"]


@pytest.mark.parametrize("mutate, where", [
    (lambda r: r.pop("verdicts"), "verdicts"),
    (lambda r: r.update(surprise=1), "surprise"),
    (lambda r: r["verdicts"][0].update(severity="fatal"), "fatal"),
    (lambda r: r["evaluations"][0]["trajectory"].update(rounds=-1), "-1"),
    (lambda r: r["evaluations"][0].update(tree="chain three"), "chain three"),
    (lambda r: r.update(regimes={**regimes_section(), "points": ["layer2"]}), "layer2"),
    (lambda r: r.update(schema_version="1.0"), f"'{SCHEMA_VERSION}' was expected"),
    (lambda r: r["drafter"].update(variant="eagle4"), "eagle4"),
    (lambda r: r["drafter"]["options"].pop("fc_norm"), "fc_norm"),
    (lambda r: r["evaluations"][0]["axes"].update(decoding="sample"), "sample"),
    (lambda r: r["evaluations"][0]["axes"].update(sampling=True), "sampling"),
    (lambda r: r.pop("reference"), "reference"),
])
def test_schema_rejects_what_the_code_never_writes(written, mutate, where):
    rep = json.loads((written[0] / "report.json").read_text())
    mutate(rep)
    errors = [e.message for e in validator().iter_errors(rep)]
    assert errors and any(where in m for m in errors), errors


def test_hand_made_sections_validate(written):
    rep = json.loads((written[0] / "report.json").read_text())
    rep["regimes"] = regimes_section()
    assert not list(validator().iter_errors(rep))


def _property_names(node, out: set) -> set:
    if isinstance(node, dict):
        out |= set(node.get("properties", {}))
        for v in node.values():
            _property_names(v, out)
    elif isinstance(node, list):
        for v in node:
            _property_names(v, out)
    return out


def test_readme_documents_every_field():
    readme = (SCHEMA_DIR / "README.md").read_text()
    documented = set(re.findall(r"`([a-z_0-9]+)`", readme))
    missing = sorted(_property_names(SCHEMA, set()) - documented)
    assert not missing, f"fields without documentation in diag/schema/README.md: {missing}"
    assert f"schema_version` | `\"{SCHEMA_VERSION}\"" in readme


def test_markdown_opens_with_verdicts_and_one_table_then_what_ran(written):
    path, rep = written
    text = (path / "report.md").read_text()
    assert text == render(rep)
    heads = [h for h in re.findall(r"^## (.+)$", text, flags=re.M)]
    assert heads[:3] == ["Verdicts", "Accept length on chain-2", "What was run"]
    assert heads.index("Acceptance by tree shape") > heads.index("What was run")
    html = markdown.markdown(text, extensions=["tables"])
    assert html.count("<table>") >= 3
    assert "<h2>Verdicts</h2>" in html and html.index("<h2>Verdicts</h2>") < html.index("<table>")
    first = html[:html.index("<h2>What was run</h2>")]
    assert first.count("<table>") == 1                  # the first screen: verdicts, then one table
    primary = [e for e in rep["evaluations"] if e["tree"] == "chain-2"]
    assert len(primary) >= 2 and all(f"<strong>{e['accept_length']:.2f}</strong>" in first for e in primary)
    for v in rep["verdicts"]:
        assert v["text"].split(":")[0] in text
    assert rep["provenance"]["machine"]["torch"] in text and rep["prompts"]["sha256"] in text
    assert "serving: sglang-0.5.23, --speculative-algorithm EAGLE3, feeds `L1+L2+L3`" in text


def test_every_linked_plot_exists_and_is_a_png(written):
    path, rep = written
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (path / "report.md").read_text())
    assert links == [p["file"] for p in rep["plots"]]
    assert {"plots/acceptance_at_depth.png", "plots/accept_hist.png", "plots/by_position.png"} <= set(links)
    for link in links:
        assert (path / link).read_bytes()[:8] == PNG


def test_plots_are_byte_for_byte_repeatable(written, tmp_path):
    rep = copy.deepcopy(written[1])
    rep["regimes"] = regimes_section()
    first, second = make_plots(rep, tmp_path / "a"), make_plots(rep, tmp_path / "b")
    assert first == second
    for p in first:
        assert (tmp_path / "a" / p["file"]).read_bytes() == (tmp_path / "b" / p["file"]).read_bytes()


def _speedup_section(rep: dict) -> dict:
    rows = []
    for e in rep["evaluations"]:
        rows.append({"shape": e["tree"], "round_cost_s": 0.02, "t_verify_s": 0.012, "t_verify_measured": True,
                     "break_even_accept_length": 1.5 + 0.1 * e["num_draft_tokens"], "break_even_reachable": True,
                     "max_speedup": 2.0, "plain_tokens_per_second": 90.0, "accept_length": e["accept_length"],
                     "speedup": 0.9, "tokens_per_second": 80.0, "key": e["key"], "layout": e["layout"],
                     "mode": e["mode"], "tree": e["tree"], "regime": e["regime"],
                     "tokens_regime": e["tokens_regime"], "rendering": e["rendering"], "decoding": e["decoding"],
                     "num_steps": e["num_steps"],
                     "topk": e["topk"], "num_draft_tokens": e["num_draft_tokens"], "measurement_error": False})
    return {"source": "user (case [speedup])", "basis": "user", "spread": None, "repeats": None, "rows": rows,
            "costs": {"t_decode": 0.011, "t_draft": 0.003, "t_verify": {"3": 0.012}, "t_draft_extend": 0.0}}


def test_conditional_plots_appear_only_with_their_sections(written, tmp_path):
    rep = copy.deepcopy(written[1])
    rep["speedup"], rep["regimes"] = None, None
    files = [p["file"] for p in make_plots(rep, tmp_path / "none")]
    assert "plots/drift.png" not in files and "plots/speedup.png" not in files
    rep["regimes"], rep["speedup"] = regimes_section(), _speedup_section(rep)
    assert not list(validator().iter_errors(json.loads(json.dumps(rep))))
    files = [p["file"] for p in make_plots(rep, tmp_path / "all")]
    assert files[-2:] == ["plots/speedup.png", "plots/drift.png"]
    md = render({**rep, "plots": make_plots(rep, tmp_path / "all")})
    assert "## Quantization regimes" in md
    assert "| w4a16-g32 | 0.930 | 1.25 | -0.25 [-0.40, -0.10] | 1.000 / 0.000 | 0.970 / 0.200 |" in md
    assert "## Will speculation pay?" in md and "0.90x" in md


def test_plots_need_rounds(written, tmp_path):
    rep = copy.deepcopy(written[1])
    for e in rep["evaluations"]:
        e["trajectory"]["rounds"] = 0
    assert make_plots({**rep, "speedup": None, "regimes": None}, tmp_path) == []


def test_missing_figures_the_diagnoses_too_are_drawn_at_once_and_reused_after(written, tmp_path, monkeypatch):
    """draw_all draws every figure the plot cache lacks at once, a diagnosis's among them
    (issue 34: one more layout misses 4 figures): the first in this process, each other in a
    forked worker of its own.
    Drawn again from the same data: nothing drawn, the same bytes; the speedup section changed:
    its figure alone is drawn."""
    import os

    import diag.report.figure as figure
    from diag.report.plot_cache import draw_all
    from diag.report.plots import PLOTS

    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    rep = copy.deepcopy(written[1])
    rep["regimes"], rep["speedup"] = regimes_section(), _speedup_section(rep)
    log, real = tmp_path / "saves.txt", figure.save

    def save(fig, folder, name, title):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()} {name}\n")
        return real(fig, folder, name, title)
    monkeypatch.setattr(figure, "save", save)

    def drawn(out: str, rep: dict, workers: int) -> list[list[str]]:
        log.write_text("")
        made = draw_all(PLOTS, rep, tmp_path / out, workers=workers)
        assert [p for m in made for p in (m if isinstance(m, list) else [m]) if p is not None] == \
            make_plots(rep, tmp_path / f"{out}-again")
        return [line.split() for line in log.read_text().splitlines()]

    saves = drawn("first", rep, workers=8)
    files = [p["file"] for p in make_plots(rep, tmp_path / "listed")]
    assert sorted(f"plots/{name}" for _, name in saves) == sorted(files)
    assert {"speedup.png", "drift.png"} <= {name for _, name in saves}
    assert [name for pid, name in saves if int(pid) == os.getpid()] == ["acceptance_at_depth.png"]
    assert len({pid for pid, _ in saves}) == len(saves)                  # one process per figure
    assert drawn("second", rep, workers=8) == []
    for f in files:
        assert (tmp_path / "first" / f).read_bytes() == (tmp_path / "second" / f).read_bytes()
    faster = copy.deepcopy(rep)
    faster["speedup"]["source"] = "user (case [speedup]), v2"           # the plot's title reads it
    assert [name for _, name in drawn("third", faster, workers=8)] == ["speedup.png"]
    assert (tmp_path / "third/plots/speedup.png").read_bytes() != (tmp_path / "first/plots/speedup.png").read_bytes()


def test_the_collector_is_paused_while_a_figure_is_drawn_and_resumed_after(tmp_path, monkeypatch):
    import gc

    from diag.report.plot_cache import cached_plot

    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    seen = []

    def accept_hist(rep, folder):
        seen.append(gc.isenabled())
        raise RuntimeError("drawing failed")
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="drawing failed"):
        cached_plot(accept_hist, {"evaluations": []}, tmp_path)
    assert seen == [False] and gc.isenabled()


def test_samples_text_is_json_dumps_of_every_row():
    """samples.jsonl's fast text equals json.dumps of samples()' rows: greedy rows, sampled rows
    (seed, expected), a key that needs escaping, and counts that are not plain ints."""
    from types import SimpleNamespace

    from diag.replay.evaluation import PromptRounds
    from diag.report.envelope import samples, samples_text

    greedy = PromptRounds('q"1 é', (0, 2, 1), (40, 41, 44))
    sampled = PromptRounds("p2", (1, 0, 3, 0), (10, 12, 10, 11), expected=(0.75, 0.1, 2.5, 1e-20), seeds=(0, 0, 1, 1))
    odd = PromptRounds("p3", (True, 1), (5, 7))          # a bool: json writes true, not 1
    run = SimpleNamespace(evaluations=[SimpleNamespace(key="embed+L2/chain-3/eagle3\\x", per_prompt=(greedy, odd)),
                                       SimpleNamespace(key="L1+L2/s2-k2-d4/eagle3", per_prompt=(sampled,))])
    text = samples_text(run)
    assert text == "".join(json.dumps(row) + "\n" for row in samples(run))
    assert len(text.splitlines()) == 9 and '"accepted": true' in text
    assert samples_text(SimpleNamespace(evaluations=[])) == ""
