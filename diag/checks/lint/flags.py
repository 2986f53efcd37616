"""Lint check of the launch line's words against the selected release's own parser: misspelt
flags (`--speculative-algoritm`), abbreviations argparse resolves or refuses
(`--speculative-num-step` -> `--speculative-num-steps`; `--speculative-num` is ambiguous),
values no option takes, and speculative algorithm names the release does not know (`EAGEL3`).
The rules are the engine's (EngineRules.flag_problems), over the tables generated from its wheels.

Takes the Pair (pair.py) and returns Findings; reads no file.
"""

from __future__ import annotations

from diag.checks.lint.pair import Finding, Pair
from diag.engines import engine, rules


def check_flags(p: Pair) -> list[Finding]:
    if p.argv is None:
        return []
    rel = engine(p.engine)
    return [Finding(x.severity, x.code, x.message, x.behaviour, x.fix, None, x.flag or None)
            for x in rules(rel).flag_problems(list(p.argv), release=rel)]
