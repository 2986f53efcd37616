"""diag as a pytest plugin: run a case once per session, assert on its report.

Registered by the `pytest11` entry point `diag` when the package is installed (the root
conftest.py of a checkout registers it otherwise). Options, all under one prefix:

    --diag-case CASE.toml          the case to run
    --diag-target DIR --diag-drafter DIR
                                   a case built from flags, as `diag run --target --drafter`
    --diag-report-dir DIR          where the report goes (default reports/pytest-<case name>)

With none of them the built-in demo case runs (cases/demo.toml, the zoo pair). The session
fixture `diag_run` returns a diag.assertions.DiagReport (report dict + directory); its
report path is printed in the terminal summary. `diag_variant(**sections)` runs the same case
with some keys replaced (another decoding, trees, layouts), once per distinct variant; the
plugin's runs of a session share one loaded target (target/resident.py). Markers: `gpu`
(skipped without CUDA) and `slow`. The plugin is thin: it parses options and constructs; running is pipeline.run_case,
writing is report.writer, judging is diag.assertions.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from diag.assertions import DiagReport

REPORTS = pytest.StashKey[list]()
MARKERS = ("gpu: needs a CUDA device; skipped cleanly without one",
           "slow: long-running; deselect with -m 'not slow'")


def pytest_addoption(parser) -> None:
    group = parser.getgroup("diag", "EAGLE-3 drafter diagnostics (diag)")
    group.addoption("--diag-case", metavar="CASE", help="diag case file (TOML) for the diag_run fixture")
    group.addoption("--diag-target", metavar="DIR", help="target checkpoint directory, zoo:NAME or hub id org/name[@revision]")
    group.addoption("--diag-drafter", metavar="DIR", help="EAGLE-3 drafter checkpoint directory, zoo:NAME or hub id")
    group.addoption("--diag-report-dir", metavar="DIR",
                    help="report directory for diag_run (default reports/pytest-<case name> under rootdir)")


def pytest_configure(config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[REPORTS] = []


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def pytest_runtest_setup(item) -> None:
    if item.get_closest_marker("gpu") is not None and not _cuda():
        pytest.skip("needs a CUDA device (marker gpu); torch.cuda.is_available() is False")


def case_from_options(config):
    """--diag-case, else --diag-target + --diag-drafter, else the demo case."""
    from diag.run.case import check_case, read_case
    from diag.cli.run import case_from_flags, main_parser
    from diag.run.shipped import DEMO, shipped

    case, target, drafter = (config.getoption(o) for o in ("--diag-case", "--diag-target", "--diag-drafter"))
    if case and (target or drafter):
        raise pytest.UsageError("--diag-case and --diag-target/--diag-drafter exclude each other")
    if case:
        return check_case(read_case(case))
    if target or drafter:
        if not (target and drafter):
            raise pytest.UsageError("--diag-target and --diag-drafter go together")
        return case_from_flags(main_parser().parse_args(["run", "--target", target, "--drafter", drafter]))
    return check_case(read_case(shipped(DEMO)))


def report_dir(config, case) -> Path:
    given = config.getoption("--diag-report-dir")
    return Path(given) if given else Path(config.rootpath) / "reports" / f"pytest-{case.name}"


def run_and_write(case, out: Path, argv: list[str], held) -> DiagReport:
    """Run a case and write its report directory; the report as the assertions read it. `held`
    (target/resident.Held): the models the run may take, and where its own load is kept."""
    from diag.run.pipeline import run_case
    from diag.report.outdir import check_out_dir
    from diag.report.writer import write_report
    from diag.target.resident import using

    check_out_dir(out)
    with using(held):
        run = run_case(case, progress=False)
    path, rep = write_report(run, out, argv=argv)
    return DiagReport(rep, path)


@pytest.fixture(scope="session")
def _diag_kept():
    """The models the plugin's runs keep loaded for the session (target/resident.Held), used only
    around those runs: a test's own run_case calls load as they would without the plugin."""
    from diag.target.resident import Held
    held = Held(1)
    yield held
    held.clear()


@pytest.fixture(scope="session")
def diag_run(request, _diag_kept) -> DiagReport:
    """The session's diag report, run once: DiagReport(report=dict, path=report directory)."""
    config = request.config
    case = case_from_options(config)
    report = run_and_write(case, report_dir(config, case), ["pytest", *config.invocation_params.args], _diag_kept)
    config.stash[REPORTS].append(report.path)
    return report


@pytest.fixture(scope="session")
def diag_variant(request, _diag_kept):
    """The session's case with some keys replaced, each distinct variant run once a session, all
    on the target the first run loaded: diag_variant(decoding={"temperature": 1.0, "top_p": 0.95},
    evaluate={"trees": ["chain-3"]}) -> DiagReport, written beside diag_run's report under
    -<8 hex digits of the variant>."""
    from diag.run.case import check_case, with_fields

    config, runs = request.config, {}
    base = case_from_options(config)

    def variant(**sections) -> DiagReport:
        key = json.dumps(sections, sort_keys=True)
        if key not in runs:
            case = check_case(with_fields(base, sections, "diag_variant(...)"))
            tag = hashlib.sha256(key.encode()).hexdigest()[:8]
            out = report_dir(config, base)
            runs[key] = run_and_write(case, out.with_name(f"{out.name}-{tag}"),
                                      ["pytest", *config.invocation_params.args, f"diag_variant({key})"], _diag_kept)
            config.stash[REPORTS].append(runs[key].path)
        return runs[key]
    return variant


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    paths = config.stash.get(REPORTS, [])
    if not paths:
        return
    terminalreporter.write_sep("-", "diag")
    for path in paths:
        terminalreporter.write_line(f"diag report: {path / 'report.md'}  (json: {path / 'report.json'})")
