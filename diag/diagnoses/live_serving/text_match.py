"""Pairing /generate responses with prompts by the prompt text saved beside them, for the
responses whose request id is no prompt id (SGLang names a request without rid by a uuid).

Rule: a response's text pairs with the prompt whose text is the same, exactly, else after
stripping surrounding whitespace on both sides; a text two prompts share, or one two
responses share, cannot say which is which and is an error. Responses whose text matches no
prompt keep their own id (so inputs.py reports them as prompts outside the case).
Worked example: prompts {"code-01": "def f(x):", "prose-01": "Once upon"}, responses with
ids "9f1c..." / "a77e..." and prompts "Once upon" / "def f(x):\n" -> ids prose-01, code-01.

This module knows records and strings; inputs.py decides when to use it.
"""

from __future__ import annotations

from dataclasses import replace

from diag.errors import DiagError


def _index(texts: dict[str, str], source: str, key) -> dict[str, str]:
    out: dict[str, str] = {}
    for pid, text in texts.items():
        k = key(text)
        if k in out:
            raise DiagError("two prompts have the same text, so responses cannot be paired by text", file=source,
                            field=f"prompts {out[k]} and {pid}", expected="request ids in the responses (rid)",
                            found=repr(text[:60]))
        out[k] = pid
    return out


def match_by_text(requests: tuple, texts: dict[str, str | None], source: str) -> tuple[tuple, int]:
    """The requests with prompt ids where their text names a prompt (those whose own id is a
    prompt id keep it), and how many were paired by text."""
    given = {pid: t for pid, t in texts.items() if t is not None}
    exact, stripped = _index(given, source, lambda t: t), _index(given, source, str.strip)
    out, taken = [], {r.id: r.record for r in requests if r.id in texts}
    for r in requests:
        pid = None if r.prompt is None or r.id in texts else exact.get(r.prompt, stripped.get(r.prompt.strip()))
        if pid is None:
            out.append(r)
            continue
        if pid in taken:
            raise DiagError("two responses carry the same prompt text", file=source,
                            field=f"records {taken[pid]} and {r.record}", expected="one response per prompt",
                            found=f"both are prompt {pid}")
        taken[pid] = r.record
        out.append(replace(r, id=pid))
    return tuple(out), sum(a.id != b.id for a, b in zip(requests, out))
