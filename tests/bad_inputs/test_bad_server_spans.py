"""Server responses and the replay must cover the same spans (issue 35.2): 512-token
generations compared with a 16-token replay used to be reported as "the same prompts". Each
entry states its outcome; the span notes state both sides."""

import json

import pytest

from bad_catalogue import Bad, Error, Handled
from test_server_responses import spec_meta

VERSION = "0.5.23"


def _responses(ctx, completion):
    """One 0.5.23 /generate response per prompt of the shared set, `completion` tokens each."""
    ids = [json.loads(line)["id"] for line in open(ctx.pair["prompts"]) if line.strip()]
    rows = []
    for rid in ids:
        ct = max(1, completion // 2)
        acc = completion - 1 - ct
        rows.append({"text": "...", "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": completion},
                                                  "prompt_tokens": 12, **spec_meta(VERSION, ct, acc, 2, completion,
                                                                                   [ct - acc, acc])}})
    return ctx.lines("responses.jsonl", rows)


def _validate(completion, max_new_tokens):
    def build(ctx):
        return ["validate", ctx.case(f'[prompts]\nfile = "{ctx.pair["prompts"]}"\nmax_new_tokens = {max_new_tokens}\n'
                                     '[evaluate]\nlayouts = ["embed+L2+L3"]\ntrees = ["chain-2"]\n'
                                     f'[serving]\nengine = "sglang-{VERSION}"\n'
                                     f'[server]\nresponses = "{_responses(ctx, completion)}"\n')]
    return build


def _run(completion, max_new_tokens):
    def build(ctx):
        return ctx.run("--server-responses", _responses(ctx, completion), "--server-engine", f"sglang-{VERSION}",
                       "--engine", f"sglang-{VERSION}", tiny_args=("--max-new-tokens", str(max_new_tokens), "--layout",
                                                                   "embed+L2+L3", "--tree", "chain-2", "--quiet"))
    return build


def _spans_noted(*texts):
    def check(ctx):
        server = json.dumps(ctx.report()["server"])          # the server section states both spans
        for t in texts:
            assert t in server, server
    return check


CATALOGUE = [
    Bad("server-512-token-responses-vs-16-token-replay", _run(512, 16),
        Error(("shorter than the server's generations", "prompts.max_new_tokens", ">= 512", "responses.jsonl"))),
    Bad("validate-server-512-vs-16", _validate(512, 16), Error(("shorter than the server's generations", "512"))),
    Bad("server-spans-match", _run(8, 8),
        Handled(_spans_noted("the server generated 8-8 tokens per request", "up to 8 tokens"))),
    Bad("server-shorter-than-replay", _run(6, 12),
        Handled(_spans_noted("the replay runs 6 tokens past the server's longest completion (6)"))),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_server_spans(bad, outcome):
    outcome(bad)
