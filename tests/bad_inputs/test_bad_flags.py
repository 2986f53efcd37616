"""Launch lines SGLang would reject, read by `diag lint` with the selected release's own
argument parser (issue 16.7): misspelt flags, abbreviations (resolved, or ambiguous), values
no flag takes, unknown algorithm names. Lint exits 1 with a finding for each; a line that is
not an SGLang command at all is a clear usage error (exit 2)."""

import json

import pytest

from bad_catalogue import Bad, Error, Handled

BASE = "python -m sglang.launch_server --model-path T --speculative-draft-model-path D "


def lint(line):
    return lambda c: ["lint", "--drafter", c.pair["drafter"], "--target", c.pair["target"], "--launch",
                      BASE + line, "--json"]


def findings(*expected):
    """Each (code, flag, text in the finding) must be among the JSON findings."""
    def check(ctx):
        got = json.loads(ctx.stdout)
        for code, flag, text in expected:
            assert any(f["code"] == code and f["field"] == flag and text in json.dumps(f) for f in got), (
                code, flag, [(f["code"], f["field"]) for f in got])
    return check


def no_finding_on(flag):
    def check(ctx):
        assert not [f for f in json.loads(ctx.stdout) if f["field"] == flag and f["severity"] == "error"]
    return check


CATALOGUE = [
    Bad("lint-misspelt-algorithm-flag", lint("--speculative-algoritm EAGLE3"),
        Handled(findings(("UNKNOWN_FLAG", "--speculative-algoritm", "did you mean --speculative-algorithm")),
                code=1)),
    Bad("lint-misspelt-topk-flag", lint("--speculative-algorithm EAGLE3 --speculative-eagle-top-k 4"),
        Handled(findings(("UNKNOWN_FLAG", "--speculative-eagle-top-k", "unrecognized arguments")), code=1)),
    Bad("lint-unknown-algorithm", lint("--speculative-algorithm EAGEL3"),
        Handled(findings(("UNKNOWN_ALGORITHM", "--speculative-algorithm", "Unknown speculative algorithm name")),
                code=1)),
    Bad("lint-ambiguous-abbreviation", lint("--speculative-algorithm EAGLE3 --speculative-num 3"),
        Handled(findings(("AMBIGUOUS_FLAG", "--speculative-num", "--speculative-num-draft-tokens")), code=1)),
    Bad("lint-stray-word", lint("--speculative-algorithm EAGLE3 --enable-dp-attention yes"),
        Handled(findings(("STRAY_WORD", "yes", "unrecognized arguments")), code=1)),
    Bad("lint-flag-without-value", lint("--speculative-algorithm EAGLE3 --speculative-num-steps"),
        Handled(findings(("FLAG_NEEDS_VALUE", "--speculative-num-steps", "expected one argument")), code=1)),
    Bad("lint-switch-with-value", lint("--speculative-algorithm EAGLE3 --enable-dp-attention=1"),
        Handled(findings(("SWITCH_WITH_VALUE", "--enable-dp-attention", "ignored explicit argument")), code=1)),
    Bad("lint-non-integer-steps", lint("--speculative-algorithm EAGLE3 --speculative-num-steps three"),
        Handled(findings(("LAUNCH_UNPARSABLE", "--speculative-num-steps", "three")), code=1)),
    Bad("lint-not-an-sglang-command", lambda c: ["lint", "--drafter", c.pair["drafter"], "--target",
                                                c.pair["target"], "--launch", "python -m vllm serve M"],
        Error(("not an SGLang launch command", "--launch"), code=2)),
    Bad("lint-unclosed-quote", lambda c: ["lint", "--drafter", c.pair["drafter"], "--target", c.pair["target"],
                                         "--launch", BASE + "--served-model-name 'x"],
        Error(("does not parse as a shell line",), code=2)),
]


def _abbrev_resolved(ctx):
    got = json.loads(ctx.stdout)
    ab = next(f for f in got if f["code"] == "ABBREVIATED_FLAG")
    assert ab["severity"] == "warning" and "--speculative-num-steps" in ab["message"]
    tree = [f for f in got if f["code"].startswith("TREE_")]      # the abbreviation is read as num_steps
    assert tree and "S=1" in json.dumps(tree), tree


CATALOGUE.append(Bad("lint-abbreviation-is-resolved", lint(
    "--speculative-algorithm EAGLE3 --speculative-num-step 1 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 16 --max-running-requests 8"), Handled(_abbrev_resolved, code=1)))
# (exit 1: the tiny drafter's ids are served as L1+L2+L3 while it was trained on embed+L2+L3)


def _run_notes(ctx):
    notes = ctx.notes()
    assert any("would refuse it" in n and "--speculative-algoritm" in n for n in notes), notes


CATALOGUE.append(Bad("run-launch-with-misspelt-flag", lambda c: c.run(
    "--launch", BASE + "--speculative-algoritm EAGLE3"), Handled(_run_notes)))


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_flags(bad, outcome):
    outcome(bad)
