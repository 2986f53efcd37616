"""Bad prompt sets and recorded continuations: lines that are not what they claim, invalid
UTF-8, prompts longer than the target's context, recorded ids outside the vocabulary
(issue 16.5, 16.6). Every one is a clear error naming the file and line or prompt, before any
weight is loaded."""

import pytest

from bad_catalogue import Bad, Error

OK = {"id": "a", "category": "code", "text": "def f(x):\n    return x"}


def _prompts(rows, name="p.jsonl"):
    return lambda c: c.run(prompts=c.lines(name, rows))


def _raw_prompts(data: bytes):
    return lambda c: c.run(prompts=c.write("p.jsonl", data))


def _recorded(rows):
    """The shared three-prompt set with a recorded file of these rows."""
    return lambda c: c.run("--recorded", c.lines("rec.jsonl", rows))


ALL = [{"id": f"p{i}", "token_ids": [5, 6, 7]} for i in range(3)] + [{"id": "chat", "token_ids": [5]}]


def _replace(rows, i, row):
    return rows[:i] + [row] + rows[i + 1:]


LONG = {"id": "long", "category": "code", "text": "the quick brown fox " * 200}

CATALOGUE = [
    Bad("prompt-file-missing", lambda c: c.run(prompts=c.tmp / "none.jsonl"), Error(("prompt file not found",))),
    Bad("prompt-text-is-a-number", _prompts([OK, {"id": "b", "text": 5}]),
        Error(("non-empty string", "p.jsonl:2", "b.text", "5"))),
    Bad("prompt-text-is-null", _prompts([{"id": "b", "text": None}]), Error(("non-empty string", "None"))),
    Bad("prompt-text-is-empty", _prompts([{"id": "b", "text": "   "}]), Error(("non-empty string", "b.text"))),
    Bad("prompt-invalid-utf8", _raw_prompts(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "\xff\xfe"}\n'),
        Error(("not valid UTF-8", "p.jsonl:2", "column"))),
    Bad("prompt-line-not-json", _prompts([OK, "{id: 1"]), Error(("not JSON", "p.jsonl:2"))),
    Bad("prompt-line-is-a-list", _prompts([[1, 2]]), Error(("not a JSON object", "p.jsonl[0]"))),   # a JSON array file
    Bad("prompt-line-is-a-list-in-jsonl", _prompts([OK, [1, 2]]), Error(("not a JSON object", "p.jsonl:2"))),
    Bad("prompt-without-content", _prompts([{"id": "b", "body": "hi"}]), Error(("exactly one of", "body"))),
    Bad("prompt-id-is-a-list", _prompts([{"id": [1], "text": "hi"}]), Error(("id must be a string", "[1]"))),
    Bad("prompt-text-and-messages", _prompts([{"id": "b", "text": "x", "messages": []}]),
        Error(("exactly one of text / messages",))),
    Bad("prompt-messages-not-a-list", _prompts([{"id": "b", "messages": "hi"}]), Error(("malformed messages",))),
    Bad("prompt-message-content-not-a-string", _prompts([{"id": "b", "messages": [{"role": "user", "content": 3}]}]),
        Error(("malformed messages", "b.messages"))),
    Bad("prompt-ids-not-unique", _prompts([OK, OK]), Error(("not unique", "'a'"))),
    Bad("prompt-longer-than-the-context", _prompts([OK, LONG]),
        Error(("do not fit the target's context", "long", "max_position_embeddings = 256"))),
    Bad("prompt-limit-zero-left", lambda c: c.run("--limit", "0"), Error(("--limit", "positive"))),
    Bad("recorded-file-missing", lambda c: c.run("--recorded", c.tmp / "none.jsonl"), Error(("not found",))),
    Bad("recorded-line-not-json", _recorded(_replace(ALL, 1, "{oops")), Error(("not JSON", "rec.jsonl:2"))),
    Bad("recorded-line-is-a-list", _recorded(_replace(ALL, 0, "[1, 2]")),
        Error(("not an object with an id", "rec.jsonl:1"))),
    Bad("recorded-token-ids-are-strings", _recorded(_replace(ALL, 2, {"id": "p2", "token_ids": ["5", "6"]})),
        Error(("non-empty list of token ids", "p2.token_ids", "rec.jsonl:3"))),
    Bad("recorded-token-ids-are-floats", _recorded(_replace(ALL, 2, {"id": "p2", "token_ids": [5.5, 6]})),
        Error(("non-empty list of token ids", "5.5"))),
    Bad("recorded-token-ids-negative", _recorded(_replace(ALL, 0, {"id": "p0", "token_ids": [-3]})),
        Error(("non-empty list of token ids", "-3"))),
    Bad("recorded-token-ids-empty", _recorded(_replace(ALL, 0, {"id": "p0", "token_ids": []})),
        Error(("non-empty list of token ids", "p0.token_ids"))),
    Bad("recorded-token-ids-outside-vocab", _recorded(_replace(ALL, 1, {"id": "p1", "token_ids": [5, 4000]})),
        Error(("outside the target's vocabulary", "p1.token_ids", "4000", "< 300"))),
    Bad("recorded-prompt-missing", _recorded(ALL[:2] + ALL[3:]), Error(("missing prompts", "p2"))),
    Bad("recorded-id-twice", _recorded(ALL + [ALL[0]]), Error(("appears twice", "p0"))),
    Bad("recorded-text-not-a-string", _recorded(_replace(ALL, 0, {"id": "p0", "text": {"a": 1}})),
        Error(("recorded text must be a non-empty string",))),
    Bad("recorded-neither-ids-nor-text", _recorded(_replace(ALL, 0, {"id": "p0", "tokens": [1]})),
        Error(("needs token_ids or text", "tokens"))),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_prompts(bad, outcome):
    outcome(bad)
