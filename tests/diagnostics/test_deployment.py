"""An example diagnostic suite for a deployment: copy it next to your serving config.

    pytest tests/diagnostics                                    # the demo case (the zoo pair)
    pytest tests/diagnostics --diag-target T --diag-drafter D   # your checkpoints
    pytest tests/diagnostics --diag-case cases/kimi-k2.5-int4.toml --diag-report-dir reports/kimi

The case runs once per session (fixture `diag_run`); each test asks one question of its
report, and a failure quotes the numbers and the report path to attach to the ticket.
The first demo run builds the zoo's tiny checkpoints (a few minutes, cached).

The built-in demo serves its drafter one layer off on purpose (the seeds' story, DESIGN.md
§1.2): on it the layout and error checks must fail and say why (`broken_on_the_demo`); on
your own case they must pass. Drop that helper when you copy this file.
"""

from contextlib import contextmanager

import pytest

from diag.assertions import (assert_accept_length_at_least, assert_no_error_verdicts,
                             assert_serving_layout_is_trained, assert_speculation_pays, serving_candidate)

pytestmark = pytest.mark.slow

# The accept length below which this deployment is not worth serving (bonus included, on the
# case's first tree shape, for the layout the server feeds). Set your own from a good run; 2.0 on
# chain-3 is a modest one, which the demo's trained layout clears (about 2.8-3.1) and its served
# one, one layer off, does not (about 1.3-1.6).
ACCEPT_LENGTH_FLOOR = 2.0


@contextmanager
def broken_on_the_demo(diag_run, message: str):
    """On the demo case, the block must raise an AssertionError containing `message`."""
    if diag_run.report["case"]["name"] != "demo":
        yield
        return
    with pytest.raises(AssertionError, match=message):
        yield


def test_server_runs_eagle3(diag_run):
    """--speculative-algorithm EAGLE instead of EAGLE3 feeds the drafter the wrong state."""
    assert serving_candidate(diag_run.report)["mode"] == "eagle3", diag_run.where


def test_serving_layout_is_the_trained_layout(diag_run):
    with broken_on_the_demo(diag_run, r"serving layout L1\+L3\+L5 is not the trained layout embed\+L2\+L4"):
        assert_serving_layout_is_trained(diag_run)


def test_no_error_verdicts(diag_run):
    with broken_on_the_demo(diag_run, r"LAYOUT MISMATCH.*\[-1, 1, 3\]"):
        assert_no_error_verdicts(diag_run)


def test_accept_length_reaches_the_floor(diag_run):
    with broken_on_the_demo(diag_run, r"L1\+L3\+L5 eagle3 chain-3 as-loaded is below 2\.00"):
        assert_accept_length_at_least(diag_run, ACCEPT_LENGTH_FLOOR)


def test_speculation_pays(diag_run):
    """Needs step costs that speak for the server: the user's (case [speedup]) or measured on a GPU.
    Costs measured on a CPU say nothing about a GPU server, so that case is skipped."""
    sp = diag_run.report.get("speedup")
    if not sp:
        pytest.skip("the case measures no step costs ([speedup] measure = false and no user costs)")
    if sp["source"].startswith("measured") and not diag_run.report["provenance"]["machine"]["gpus"]:
        pytest.skip(f"step costs were {sp['source']} on a CPU; give your server's costs in the case's [speedup]")
    assert_speculation_pays(diag_run)
