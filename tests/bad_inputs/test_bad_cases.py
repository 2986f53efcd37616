"""Bad case values, from a case file or the command line (the same checks for both, after the
overrides), and tree shapes SGLang refuses or rewrites (issue 16.5, 16.6)."""

import pytest

from bad_catalogue import Bad, Error, Handled


def _case_file(ctx, *, prompts="max_new_tokens = 8", evaluate='layouts = ["embed+L2+L3"]\ntrees = ["chain-2"]',
               extra=""):
    body = (f'[prompts]\nfile = "{ctx.pair["prompts"]}"\n{prompts}\n[evaluate]\n{evaluate}\n{extra}')
    return ["run", ctx.case(body), "--out", ctx.out, "--quiet"]


def case(**kw):
    return lambda c: _case_file(c, **kw)


def _evaluate(line):
    return case(evaluate=f'layouts = ["embed+L2+L3"]\ntrees = ["chain-2"]\n{line}')


def _tree_note(ctx):
    ev = ctx.report()["evaluations"]
    assert {e["tree"] for e in ev} == {"chain-3"}, {e["tree"] for e in ev}
    assert any("s3-k1-d8" in n and "chain-3" in n for n in ctx.notes()), ctx.notes()


def _grid_note(ctx):
    trees = {e["tree"] for e in ctx.report()["evaluations"]}
    assert "s1-k2-d3" in trees and "s1-k2-d8" not in trees, trees
    assert any("s1-k2-d8 left out" in n for n in ctx.notes()), ctx.notes()


CATALOGUE = [
    Bad("flag-max-new-tokens-0", lambda c: c.run("--max-new-tokens", "0"),
        Error(("--max-new-tokens (prompts.max_new_tokens)", ">= 2", "found:    0"))),
    Bad("flag-max-new-tokens-negative", lambda c: c.run("--max-new-tokens", "-5"),
        Error(("--max-new-tokens", "-5"))),
    Bad("flag-max-new-tokens-1", lambda c: c.run("--max-new-tokens", "1"), Error(("--max-new-tokens", "found:    1"))),
    Bad("flag-limit-negative", lambda c: c.run("--limit", "-1"), Error(("--limit (prompts.limit)", "-1"))),
    Bad("flag-gpus-negative", lambda c: c.run("--gpus", "-1"), Error(("--gpus", ">= 0"))),
    Bad("flag-tree-refused", lambda c: c.run("--tree", "s3-k4-d100"),
        Error(("SGLang cannot run this tree shape", "--tree", "s3-k4-d100", "36"))),
    Bad("flag-tree-malformed", lambda c: c.run("--tree", "s3-k0-d4"), Error(("--tree", "s3-k0-d4"))),
    Bad("flag-tree-rewritten", lambda c: c.run("--tree", "s3-k1-d8", tiny_args=(
        "--max-new-tokens", "8", "--layout", "embed+L2+L3", "--quiet")), Handled(_tree_note)),
    Bad("flag-layout-out-of-range", lambda c: c.run("--layout", "L1+L2+L9"), Error(("L9",))),
    Bad("flag-serving-layout-garbage", lambda c: c.run("--serving-layout", "L1+Q2"), Error(("Q2",))),
    Bad("flag-algorithm-unknown", lambda c: c.run("--algorithm", "EAGEL3"), Error(("--algorithm", "EAGEL3"))),
    Bad("flag-regime-unknown", lambda c: c.run("--regime", "w3a7"), Error(("unknown regime", "w3a7"))),
    Bad("case-max-new-tokens-0", case(prompts="max_new_tokens = 0"), Error(("prompts.max_new_tokens", "case.toml"))),
    Bad("case-limit-negative", case(prompts="max_new_tokens = 8\nlimit = -1"), Error(("prompts.limit", "-1"))),
    Bad("case-categories-match-nothing", case(prompts='max_new_tokens = 8\ncategories = ["poetry"]'),
        Error(("empty after filtering",))),
    Bad("case-bootstrap-0", _evaluate("bootstrap = 0"), Error(("evaluate.bootstrap", ">= 100", "found:    0"))),
    Bad("case-seed-negative", _evaluate("seed = -1"), Error(("evaluate.seed",))),
    Bad("case-position-buckets-unsorted", _evaluate("position_buckets = [0, 128, 64]"),
        Error(("evaluate.position_buckets", "ascending"))),
    Bad("case-tree-refused", case(evaluate='layouts = ["embed+L2+L3"]\ntrees = ["s3-k4-d100"]'),
        Error(("SGLang cannot run this tree shape", "evaluate.trees", "s3-k4-d100", "case.toml"))),
    Bad("case-no-trees", case(evaluate='layouts = ["embed+L2+L3"]\ntrees = []'), Error(("names no tree shape",))),
    Bad("case-tree-grid-partly-refused", case(evaluate='layouts = ["embed+L2+L3"]\ntrees = []\n'
                                                    'tree_grid = {num_steps = [1], topk = [2], num_draft_tokens = [3, 8]}'),
        Handled(_grid_note)),
    Bad("case-tree-grid-all-refused", case(evaluate='layouts = ["embed+L2+L3"]\ntrees = []\n'
                                                  'tree_grid = {num_steps = [1], topk = [2], num_draft_tokens = [8]}'),
        Error(("no tree shape SGLang can run",))),
    Bad("case-regime-unknown", _evaluate('regimes = ["as-loaded", "int3"]'), Error(("evaluate.regimes", "int3"))),
    Bad("case-engine-unknown", case(extra='[serving]\nengine = "sglang-9.9.9"'),
        Error(("serving.engine", "sglang-9.9.9"))),
    Bad("case-algorithm-unknown", case(extra='[serving]\nalgorithm = "EAGEL3"'), Error(("serving.algorithm", "EAGEL3"))),
    Bad("case-gpus-negative", case(extra="[placement]\ngpus = -2"), Error(("placement.gpus",))),
    Bad("case-speedup-context-0", case(extra="[speedup]\ncontext = 0"), Error(("speedup.context",))),
    Bad("case-speedup-costs-partial", case(extra="[speedup]\nt_decode_ms = 20.0"),
        Error(("need all three", "speedup"))),
    Bad("case-speedup-verify-keys", case(extra='[speedup]\nt_decode_ms = 20.0\nt_draft_ms = 1.0\n'
                                              't_verify_ms = {"x" = 21.0}'), Error(("speedup.t_verify_ms",))),
    Bad("case-speedup-negative-decode", case(extra='[speedup]\nt_decode_ms = -1.0\nt_draft_ms = 1.0\n'
                                                  't_verify_ms = {"3" = 21.0}'), Error(("speedup.t_decode_ms",))),
    Bad("case-dtype-unknown", lambda c: ["run", c.case(f'dtype = "float13"\n[prompts]\nfile = "{c.pair["prompts"]}"\n'
                                                         'max_new_tokens = 8\n[evaluate]\nlayouts = ["embed+L2+L3"]\n'),
                                          "--out", c.out, "--quiet"], Error(("unknown dtype", "float13"))),
    Bad("case-unset-environment-variable", lambda c: ["run", c.case(
        f'[prompts]\nfile = "${{DIAG_NO_SUCH_VAR}}/p.jsonl"\n[evaluate]\nlayouts = ["embed+L2+L3"]\n'),
        "--out", c.out, "--quiet"], Error(("DIAG_NO_SUCH_VAR", "unset"))),
    Bad("validate-refused-tree", lambda c: ["validate", c.case(
        f'[prompts]\nfile = "{c.pair["prompts"]}"\n[evaluate]\nlayouts = ["embed+L2+L3"]\ntrees = ["s2-k2-d50"]\n')],
        Error(("SGLang cannot run this tree shape", "s2-k2-d50"))),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_case(bad, outcome):
    outcome(bad)
