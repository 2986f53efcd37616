"""A case's values are checked once, after the command line's overrides: a case file without
layouts is completed by --layout, and an override that breaks a rule is caught before any
weight is read."""

import pytest

from diag.cli.main import main
from diag.cli.run import apply_overrides, main_parser
from diag.errors import DiagError
from diag.run.case import check_case, read_case

CASE = """version = 1
name = "no-layouts"
[target]
path = "zoo:llama-tiny"
[drafter]
path = "zoo:llama-tiny-eagle3-embed"
[prompts]
file = "{prompts}"
"""


@pytest.fixture
def case_file(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "def f(x):"}\n')
    path = tmp_path / "c.toml"
    path.write_text(CASE.format(prompts=prompts))
    return path


def overrides(case_file, *flags):
    args = main_parser().parse_args(["run", str(case_file), *flags])
    return apply_overrides(read_case(case_file), args)


def test_reading_does_not_judge_values_the_command_line_may_complete(case_file):
    case = read_case(case_file)                          # no layouts, no scan: still parses
    with pytest.raises(DiagError, match="names no layout") as err:
        check_case(case)
    assert err.value.field == "evaluate.layouts" and err.value.file == str(case_file)
    completed = check_case(overrides(case_file, "--layout", "embed+L2+L4"))
    assert completed.evaluate.layouts == ("embed+L2+L4",)


def test_an_override_that_breaks_a_rule_is_caught(case_file):
    with pytest.raises(DiagError, match="max_new_tokens"):
        check_case(overrides(case_file, "--layout", "embed+L2+L4", "--max-new-tokens", "1"))
    with pytest.raises(DiagError, match="layout"):
        check_case(overrides(case_file, "--layout", "embed+L2+nonsense"))


def test_cli_run_checks_after_overrides_before_loading(case_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))     # an empty zoo: nothing may build
    code = main(["run", str(case_file), "--layout", "embed+L2+L4", "--max-new-tokens", "1",
                 "--out", str(tmp_path / "r"), "--quiet"])
    assert code == 2 and "max_new_tokens" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "r").exists()


def test_validate_checks_values(case_file, capsys):
    assert main(["validate", str(case_file)]) == 2
    assert "evaluate.layouts" in capsys.readouterr().err


def test_with_fields_types_each_value_as_a_case_file_and_names_a_wrong_one(case_file):
    """run/case.with_fields (the plugin's diag_variant): lists become tuples, a sweep key takes one
    value or a list, other sections stay; an unknown section or key or a wrong type names it."""
    from diag.run.case import with_fields

    case = read_case(case_file)
    got = with_fields(case, {"evaluate": {"layouts": ["embed+L2+L4"], "trees": ["chain-3", "s3-k4-d5"]},
                             "decoding": {"temperature": 1.0, "top_p": [0.9, 0.95], "seeds": 2}}, "here")
    assert got.evaluate.layouts == ("embed+L2+L4",) and got.evaluate.trees == ("chain-3", "s3-k4-d5")
    assert got.decoding.temperature == (1.0,) and got.decoding.top_p == (0.9, 0.95) and got.decoding.seeds == 2
    assert got.prompts == case.prompts and got.evaluate.modes == case.evaluate.modes
    check_case(got)
    for bad, field, found in (({"evalute": {}}, "evalute", "evalute"),
                              ({"evaluate": {"tress": ["chain-3"]}}, "evaluate.tress", "tress"),
                              ({"evaluate": {"trees": "chain-3"}}, "evaluate.trees", "'chain-3'"),
                              ({"decoding": {"seeds": "2"}}, "decoding.seeds", "'2'"),
                              ({"decoding": 1.0}, "decoding", "1.0")):
        with pytest.raises(DiagError) as err:
            with_fields(case, bad, "diag_variant(...)")
        assert (err.value.field, err.value.found, err.value.file) == (field, found, "diag_variant(...)")
