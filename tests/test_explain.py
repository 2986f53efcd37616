"""`diag explain`: the seed example, rounding, flags, the CLI handler."""

import argparse
import json

import pytest
from hypothesis import given, strategies as st

from diag.cli import explain as cmd
from diag.errors import DiagError
from diag.engines.sglang.explain import consistent_pairs, explain, predicted_rate
from diag.metrics import AcceptCounts, accept_length, draft_accept_rate, bonus_accept_rate
from diag.trees import TreeShape


def test_seed_example():
    e = explain(1.68, 0.84, num_steps=1, topk=1, num_draft_tokens=16)
    assert e.consistent == ((2, "sglang_accept_rate_legacy"),)
    assert e.implied == ((2, "sglang_accept_rate_legacy"),)
    assert e.resolved.shape == TreeShape(1, 1, 2)
    text = " ".join(e.sentences)
    assert "num_steps + 1 = 2" in text and "never happened" in text


def test_flags_that_cannot_explain_the_log():
    e = explain(2.40, 0.35, num_steps=5, topk=4, num_draft_tokens=8)
    assert (5, "sglang_accept_rate") in e.consistent
    assert e.implied == ()
    assert "did not run these flags" in e.sentences[-1]


def test_crashing_flags_are_reported():
    e = explain(1.5, 0.5, num_steps=3)
    assert e.resolved.crash and "would not run" in e.sentences[-1]
    assert "--speculative-num-steps 3" in e.sentences[-2]


def test_rounding_window():
    # 1.676 prints as 1.68; 1.676 / 2 = 0.838 prints as 0.84 -> consistent
    assert (2, "sglang_accept_rate_legacy") in consistent_pairs(1.68, 0.84)
    assert (2, "sglang_accept_rate_legacy") not in consistent_pairs(1.68, 0.86)
    assert predicted_rate(1.68, 2, "sglang_accept_rate") == pytest.approx(0.68)


def test_bad_inputs():
    with pytest.raises(DiagError):
        explain(0.9, 0.5)
    with pytest.raises(DiagError):
        explain(1.5, 1.5)


@given(st.integers(1, 6), st.integers(0, 40), st.data())
def test_true_counts_are_always_explained(s, extra, data):
    d = s + 1 + extra % 3
    a = data.draw(st.lists(st.integers(0, s), min_size=1, max_size=50))
    c = AcceptCounts.from_accepted(a, s, d)
    L = round(accept_length(c), 2)
    for f, rate in [("sglang_accept_rate", draft_accept_rate(c)),
                    ("sglang_accept_rate_legacy", bonus_accept_rate(c))]:
        assert (d, f) in consistent_pairs(L, round(rate, 2))


def test_cli_handler(capsys):
    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers())
    args = parser.parse_args(["explain", "--accept-len", "1.68", "--accept-rate", "0.84",
                              "--num-steps", "1", "--topk", "1", "--num-draft-tokens", "16"])
    assert args.func(args) == 0
    assert "never happened" in capsys.readouterr().out
    args = parser.parse_args(["explain", "--accept-len", "1.68", "--accept-rate", "0.84", "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["consistent"] == [{"num_draft_tokens": 2, "formula": "sglang_accept_rate_legacy"}]
    args = parser.parse_args(["explain", "--accept-len", "1.00", "--accept-rate", "0.90"])
    assert args.func(args) == 1
