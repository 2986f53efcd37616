"""The pytest plugin, driven through pytester against tests/tiny.py checkpoints: options,
the once-per-session fixture, assertion messages, markers, the terminal summary, and the
root conftest's registration with and without an installed entry point."""

import os
import shutil
import textwrap
from pathlib import Path

import pytest

import tiny
# Imported here, before any pytester run: runpytest_inprocess restores sys.modules after each inner
# session, and a module first imported inside one would be imported again by the next, leaving the
# pipeline (kept from an earlier import) and the plugin's kept() block on two copies of resident.py.
from diag.run import target_passes  # noqa: F401
from diag.target import resident  # noqa: F401

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]
# Where the zoo lives, read at import: pytester points HOME at a temporary directory, so a
# default ~/.cache/diag looked up inside a pytester test would be empty and the zoo built again
# there (minutes, thrown away). Tests get their own pass cache.
USER_CACHE = os.environ.get("DIAG_CACHE_DIR") or str(Path.home() / ".cache" / "diag")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A random tiny pair whose drafter declares embed+L2+L3 and whose ids [0, 1, 2] an
    SGLang Llama server reads as L1+L2+L3: a deliberately mismatched serving layout."""
    d = tmp_path_factory.mktemp("pair")
    target = tiny.make_target(d / "target")
    drafter = tiny.make_drafter(d / "drafter", ids=(0, 1, 2), trained="embed+L2+L3")
    prompts = tiny.make_prompts(d / "prompts.jsonl", n=2)
    mismatched = tiny.write_case(d / "mismatched.toml", target, drafter, prompts)
    matched = d / "matched.toml"
    matched.write_text(mismatched.read_text() + '[serving]\nlayout = "embed+L2+L3"\n')
    return {"target": target, "drafter": drafter, "mismatched": mismatched, "matched": matched}


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "diag-cache"))


def _plugin_args() -> list[str]:
    """`-p diag.pytest_plugin` for an uninstalled checkout; nothing when the package is
    installed, whose `pytest11` entry point already registers the plugin as "diag" (naming
    the module as well would register it twice)."""
    from importlib.metadata import entry_points
    installed = any(ep.name == "diag" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "diag.pytest_plugin"]


def run(pytester, *args):
    return pytester.runpytest_inprocess(*_plugin_args(), "-p", "no:cacheprovider", *args)


def test_mismatched_serving_layout_fails_naming_both_layouts_and_the_report(pytester, pair):
    pytester.makepyfile(test_deploy="""
        from diag.assertions import assert_serving_layout_is_trained
        def test_layout(diag_run):
            assert_serving_layout_is_trained(diag_run)
    """)
    out = pytester.path / "rep"
    res = run(pytester, "--diag-case", str(pair["mismatched"]), "--diag-report-dir", str(out))
    res.assert_outcomes(failed=1)
    text = res.stdout.str()
    assert "serving layout L1+L2+L3 is not the trained layout embed+L2+L3" in text
    assert f"report: {out / 'report.md'}" in text
    assert f"diag report: {out / 'report.md'}" in text          # terminal summary
    assert (out / "report.json").is_file() and (out / "report.md").is_file()


def test_matched_layout_passes_and_the_case_runs_once(pytester, tmp_path):
    """The demo pair (llama-tiny and its drafter trained on embed+L2+L4, ids [-1, 1, 3] that SGLang
    serves as embed+L2+L4), 4 prompts: a working target, so no verdict is an error. (The random
    pair of the other tests is garbage by design, and diag says so: TARGET OUTPUT IS GARBAGE.)"""
    from diag.zoo import zoo_path
    prompts = tiny.make_prompts(tmp_path / "prompts.jsonl", n=4)
    case = tiny.write_case(tmp_path / "case.toml", zoo_path("llama-tiny", progress=False),
                           zoo_path("llama-tiny-eagle3-embed", progress=False), prompts,
                           layouts=["embed+L2+L4", "L1+L3+L5"])
    case.write_text(case.read_text() + '[serving]\nlayout = "embed+L2+L4"\n')
    pytester.makepyfile(test_deploy="""
        from diag.assertions import assert_serving_layout_is_trained, assert_no_error_verdicts
        SEEN = []
        def test_layout(diag_run):
            SEEN.append(diag_run)
            assert_serving_layout_is_trained(diag_run)
        def test_errors(diag_run):
            assert diag_run is SEEN[0]
            assert diag_run["case"]["spec"]["serving"]["layout"] == "embed+L2+L4"
            assert_no_error_verdicts(diag_run)
    """)
    res = run(pytester, "--diag-case", str(case), "--diag-report-dir", str(pytester.path / "rep"))
    res.assert_outcomes(passed=2)
    assert res.stdout.str().count("diag report:") == 1


def test_accept_length_assertion_quotes_the_numbers(pytester, pair):
    pytester.makepyfile(test_deploy="""
        from diag.assertions import assert_accept_length_at_least
        def test_floor(diag_run):
            assert_accept_length_at_least(diag_run, 2.5, tree="chain-2", layout="embed+L2+L3")
    """)
    res = run(pytester, "--diag-case", str(pair["matched"]), "--diag-report-dir", str(pytester.path / "rep"))
    res.assert_outcomes(failed=1)
    res.stdout.re_match_lines([r".*accept length \d\.\d\d \(95% CI \d\.\d\d-\d\.\d\d, \d+ rounds\) for "
                               r"embed\+L2\+L3 eagle3 chain-2 as-loaded is below 2\.50"])


def test_flag_options_build_a_flags_case(pytester, pair):
    pytester.makepyfile(test_opts=f"""
        from diag.pytest_plugin import case_from_options, report_dir
        def test_case(request):
            case = case_from_options(request.config)
            assert case.source == "<flags>"
            assert case.target.path == {str(pair['target'])!r}
            assert case.drafter.path == {str(pair['drafter'])!r}
            assert report_dir(request.config, case).name == "pytest-drafter"
    """)
    run(pytester, "--diag-target", str(pair["target"]), "--diag-drafter", str(pair["drafter"])).assert_outcomes(
        passed=1)


def test_half_a_flags_case_is_a_usage_error(pytester, pair):
    pytester.makepyfile(test_deploy="def test_x(diag_run):\n    pass\n")
    res = run(pytester, "--diag-target", str(pair["target"]))
    res.assert_outcomes(errors=1)
    assert "--diag-target and --diag-drafter go together" in res.stdout.str()


def test_gpu_marker_skips_cleanly_and_markers_are_registered(pytester):
    pytester.makepyfile(test_marks="""
        import pytest
        @pytest.mark.gpu
        def test_on_gpu():
            import torch
            assert torch.cuda.is_available()
        @pytest.mark.slow
        def test_slow():
            pass
    """)
    res = run(pytester, "--strict-markers", "-rs")
    import torch
    if torch.cuda.is_available():
        res.assert_outcomes(passed=2)
    else:
        res.assert_outcomes(passed=1, skipped=1)
        assert "needs a CUDA device (marker gpu)" in res.stdout.str()


def _fake_install(pytester) -> None:
    """A dist-info on sys.path whose pytest11 entry point is diag's, as `pip install` writes it."""
    site = pytester.mkdir("site")
    info = site / "diag-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: diag\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\ndiag = diag.pytest_plugin\n")
    pytester.syspathinsert(site)


ONCE = """
    import diag.pytest_plugin as plugin
    def test_registered_once(pytestconfig):
        names = [n for n, p in pytestconfig.pluginmanager.list_name_plugin() if p is plugin]
        assert names == ["diag"]
        assert pytestconfig.getoption("--diag-case") is None
"""


@pytest.mark.parametrize("installed", [False, True])
def test_root_conftest_registers_the_plugin_exactly_once(pytester, monkeypatch, installed):
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    shutil.copy(ROOT / "conftest.py", pytester.path / "conftest.py")
    if installed:
        _fake_install(pytester)
    pytester.makepyfile(test_once=ONCE)
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_unconditional_registration_would_clash_with_the_entry_point(pytester, monkeypatch):
    """The control: what the root conftest avoids really fails."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makeconftest('pytest_plugins = ["diag.pytest_plugin"]')
    _fake_install(pytester)
    pytester.makepyfile(test_once=ONCE)
    res = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert res.ret != 0
    assert "already registered" in res.stdout.str() + res.stderr.str()


@pytest.mark.slow
def test_measured_layout_mismatch_on_the_zoo_pair_fails_naming_both_layouts(pytester, monkeypatch):
    """The same acceptance check, measured: the zoo's drafter trained on embed+L2+L4 served
    every point one layer later. Builds the zoo on first use (minutes, then cached)."""
    monkeypatch.setenv("DIAG_CACHE_DIR", USER_CACHE)
    case = pytester.path / "wrong.toml"
    case.write_text(textwrap.dedent(f"""\
        version = 1
        name = "zoo-wrong-layout"
        [target]
        path = "zoo:llama-tiny"
        dtype = "float32"
        [drafter]
        path = "zoo:llama-tiny-eagle3-embed"
        dtype = "float32"
        [prompts]
        file = "{ROOT / 'cases/prompts/mixed-48.jsonl'}"
        max_new_tokens = 64
        limit = 12
        [evaluate]
        layouts = ["embed+L2+L4", "L1+L3+L5"]
        trees = ["chain-3"]
        [serving]
        layout = "L1+L3+L5"
    """))
    pytester.makepyfile(test_deploy="""
        from diag.assertions import assert_serving_layout_is_trained
        def test_layout(diag_run):
            assert diag_run["verdicts"][0]["kind"] == "layout-mismatch"
            assert_serving_layout_is_trained(diag_run)
    """)
    out = pytester.path / "rep"
    res = run(pytester, "--diag-case", str(case), "--diag-report-dir", str(out))
    res.assert_outcomes(failed=1)
    text = res.stdout.str()
    assert "serving layout L1+L3+L5 is not the trained layout embed+L2+L4" in text
    assert f"report: {out / 'report.md'}" in text


def test_variants_run_once_each_on_the_sessions_one_loaded_target(pytester, pair, target_loads):
    """diag_variant: the session's case with keys replaced, each distinct variant run once; the
    sampled variant decodes on the target diag_run loaded (one load in the session); a key the
    case has not is an error naming it."""
    loads = target_loads                     # in a cache of its own: this session's first run loads
    pytester.makepyfile(test_suite="""
        SEEN = {}
        SAMPLED = {"temperature": 1.0, "top_p": 0.9, "seeds": 1}
        def test_greedy(diag_run):
            assert {e["decoding"] for e in diag_run["evaluations"]} == {"greedy"}
        def test_sampled(diag_variant):
            SEEN["s"] = rep = diag_variant(decoding=SAMPLED)
            assert "greedy" in {e["decoding"] for e in rep["evaluations"]} != {"greedy"}
            assert rep["timings"]["target_kept"] == 1 and "target_load_s" not in rep["timings"]
        def test_sampled_again(diag_variant):
            assert diag_variant(decoding=dict(SAMPLED)) is SEEN["s"]
        def test_trees(diag_variant):
            rep = diag_variant(evaluate={"trees": ["chain-3"]})
            assert {e["tree"] for e in rep["evaluations"]} == {"chain-3"}
        def test_misspelt(diag_variant):
            diag_variant(evaluate={"tress": ["chain-3"]})
        def test_a_tests_own_runs_load_as_without_the_plugin(diag_run):
            from diag.target import resident
            assert resident.current() is None
    """)
    out = pytester.path / "rep"
    res = run(pytester, "--diag-case", str(pair["matched"]), "--diag-report-dir", str(out))
    res.assert_outcomes(passed=5, failed=1)
    text = res.stdout.str()
    assert "evaluate.tress" in text and "diag_variant(...)" in text
    assert len(loads) == 1
    written = sorted(p.name for p in pytester.path.iterdir() if p.name.startswith("rep"))
    assert len(written) == 3 and written[0] == "rep" and all(len(w) == len("rep-") + 8 for w in written[1:])
    assert text.count("diag report:") == 3
