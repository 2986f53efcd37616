"""The prompt-side sections end to end on tests/tiny.py checkpoints: a case with renderings, a
template file and a long-context ladder runs, its report.json validates against the schema,
report.md renders every section, its plot exists; case and flag mistakes fail before any weight
is loaded, naming the file and the key."""

import json

import jsonschema
import pytest

import tiny
from diag.cli.run import apply_overrides, case_from_flags, checked, main_parser
from diag.errors import DiagError
from diag.replay.evaluation import select
from diag.report.writer import write_report
from diag.run.case import check_case, read_case
from diag.run.pipeline import run_case
from diag.zoo.tokenizer import THINKING_CHAT_TEMPLATE
from test_report import SCHEMA


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return tiny.make_target(d / "t"), tiny.make_drafter(d / "d")


def _case(tmp_path, models, extra: str) -> str:
    tpl = tmp_path / "train.jinja"
    tpl.write_text(THINKING_CHAT_TEMPLATE)
    long_text = tmp_path / "long.txt"
    long_text.write_text("\n".join(f"def f{i}(x):\n    return x + {i}" for i in range(80)))
    case = tiny.write_case(tmp_path / "case.toml", *models, tiny.make_prompts(tmp_path / "p.jsonl", n=3),
                           trees=["chain-2"])
    case.write_text(case.read_text() + extra.format(tpl=tpl, long=long_text))
    return str(case)


FULL = """[rendering]
serving = "train+think"
trained = "train+nothink"
renderings = ["raw", "auto"]
templates = {{ train = "{tpl}" }}
[long_context]
length = 96
file = "{long}"
rungs = 3
per_rung = 2
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory, models):
    d = tmp_path_factory.mktemp("side")
    run = run_case(read_case(_case(d, models, FULL)), progress=False, use_cache=False)
    return run, *write_report(run, d / "out", argv=["diag", "run"])


def test_every_section_is_written_and_validates(written):
    run, path, rep = written
    on_disk = json.loads((path / "report.json").read_text())
    validator = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(on_disk)]
    assert not errors, errors
    for key in ("renderings", "coverage", "loops", "long_context"):
        assert on_disk[key] is not None, key
    assert on_disk["reference"]["rendering"] == "train+think"
    assert set(on_disk["target_pass"]["extra_passes"]) == {"train+nothink", "raw", "auto", "long-context"}
    md = (path / "report.md").read_text()
    for head in ("## Acceptance by dataset", "## Prompt renderings", "## Draft-vocabulary coverage", "## Loops",
                 "## Long context"):
        assert head in md, head
    assert "plots/long_context.png" in md and (path / "plots" / "long_context.png").is_file()


def test_renderings_are_an_axis_pinned_by_the_reference(written):
    run, _, rep = written
    assert {e.rendering for e in select(run.evaluations, run.reference)} == {"train+think"}
    assert {e.rendering for e in run.evaluations} == {"train+think", "train+nothink", "raw", "auto"}
    keys = [e.key for e in run.evaluations]
    assert len(keys) == len(set(keys)) and any(k.endswith("|train+nothink") for k in keys)
    assert not any(k.endswith("|auto") for k in keys)                 # legacy keys unchanged
    rows = {r["rendering"]: r for r in rep["renderings"]["rows"]}
    assert rows["train+think"]["roles"] == ["serving"] and rows["train+nothink"]["roles"] == ["trained"]
    diff = rows["train+nothink"]["differs_from_serving"]
    assert diff["identical"] == 0 and diff["most_common"]["other"] == "</think>"
    # the acceptance table shows the serving rendering only; the renderings section the others
    from diag.report.sections.acceptance import by_position, by_tree
    only_served = {**rep, "evaluations": [e for e in rep["evaluations"] if e.get("rendering") == "train+think"]}
    assert len(only_served["evaluations"]) < len(rep["evaluations"])
    for section in (by_tree, by_position):
        assert section(rep) == section(only_served) and section(rep)


@pytest.mark.parametrize("extra, field", [
    ('[rendering]\nserving = "chat+fast"\n', "rendering.serving"),
    ('[rendering]\nrenderings = ["train"]\n', "rendering.renderings"),
    ('[rendering]\ntemplates = {{ chat = "x.jinja" }}\n', "rendering.templates.chat"),
    ('[long_context]\nlength = 10\n', "long_context.length"),
    ('[long_context]\nlength = 512\nrungs = 1\n', "long_context.rungs"),
    ('[long_context]\nlength = 512\nper_rung = 0\n', "long_context.per_rung"),
])
def test_case_mistakes_name_the_key(tmp_path, models, extra, field):
    with pytest.raises(DiagError) as err:
        check_case(read_case(_case(tmp_path, models, extra)))      # checked after the overrides
    assert err.value.field == field and err.value.file.endswith("case.toml")


def test_mistakes_found_before_any_weight(tmp_path, models, monkeypatch):
    from diag.run import target_passes
    monkeypatch.setattr(target_passes, "load_target", lambda *a, **k: pytest.fail("a target was loaded"))
    for extra, match in [('[rendering]\nserving = "chat"\n', "no chat template"),
                         ('[rendering]\nserving = "auto+system"\n', "needs a system prompt"),
                         ('[long_context]\nlength = 4096\n', "exceeds the target's positions")]:
        with pytest.raises(DiagError, match=match):
            run_case(read_case(_case(tmp_path, models, extra)), progress=False, use_cache=False)


def test_flags_fill_the_sections(tmp_path):
    a = main_parser().parse_args(["run", "--target", "t", "--drafter", "d", "--rendering", "raw",
                                  "--serving-rendering", "train+think", "--trained-rendering", "train+nothink",
                                  "--template", f"train={tmp_path / 'x.jinja'}", "--system-prompt", "S",
                                  "--long-context", "512", "--long-context-file", "long.txt"])
    case = apply_overrides(case_from_flags(a), a)
    r = case.rendering
    assert (r.serving, r.trained, r.renderings, r.system_prompt) == ("train+think", "train+nothink", ("raw",), "S")
    assert r.templates == {"train": str(tmp_path / "x.jinja")}
    assert case.long_context.length == 512 and case.long_context.file.endswith("long.txt")
    with pytest.raises(DiagError, match="NAME=PATH"):
        apply_overrides(case, main_parser().parse_args(["run", "--template", "oops"]))


@pytest.mark.parametrize("argv, flag", [
    (["--long-context", "10"], "--long-context (long_context.length)"),
    (["--long-context", "512", "--long-context-rungs", "1"], "--long-context-rungs (long_context.rungs)"),
    (["--long-context", "512", "--long-context-per-rung", "0"], "--long-context-per-rung (long_context.per_rung)"),
    (["--serving-rendering", "chat+fast"], "--serving-rendering (rendering.serving)"),
])
def test_prompt_side_flag_mistakes_name_the_flag(argv, flag):
    """Checked once, after every override (so --max-new-tokens can make a --long-context
    valid), and the error names the flag that set the value, with the case key."""
    a = main_parser().parse_args(["run", "--target", "t", "--drafter", "d", "--layout", "L1", *argv])
    with pytest.raises(DiagError) as err:
        checked(apply_overrides(case_from_flags(a), a), a)
    assert err.value.field == flag


def test_rung_flags_fill_the_long_context_section():
    a = main_parser().parse_args(["run", "--target", "t", "--drafter", "d", "--layout", "L1", "--long-context",
                                  "512", "--long-context-rungs", "4", "--long-context-per-rung", "3",
                                  "--max-new-tokens", "8"])
    lc = checked(apply_overrides(case_from_flags(a), a), a).long_context
    assert (lc.length, lc.rungs, lc.per_rung) == (512, 4, 3)
