"""Lint check of the launch line's words against the selected SGLang release's own parser:
misspelt flags (`--speculative-algoritm`), abbreviations argparse resolves or refuses
(`--speculative-num-step` -> `--speculative-num-steps`; `--speculative-num` is ambiguous),
values no option takes, and `--speculative-algorithm` names the release does not know
(`EAGEL3`). The rules are diag.engines.sglang.flag_parser's, over the table generated from the wheels.

Takes the Pair (pair.py) and returns Findings; reads no file.
"""

from __future__ import annotations

from diag.checks.lint.pair import Finding, Pair
from diag.engines.sglang.flag_parser import flag_problems, table_for
from diag.engines.sglang.versions import engine


def check_flags(p: Pair) -> list[Finding]:
    if p.argv is None:
        return []
    version = engine(p.engine).version
    table = table_for(version)
    if table is None:
        return [Finding("info", "FLAG_TABLE", f"no flag table for SGLang {version}: launch flags not "
                        "checked", "n/a", "regenerate diag/engines/sglang/server_flags.py with this release")]
    out = [Finding(x.severity, x.code, x.message, x.behaviour, x.fix, None, x.flag)
           for x in flag_problems(list(p.argv), table)]
    if not table.exact:
        out.append(Finding("info", "FLAG_TABLE", f"launch flags checked against SGLang {table.version}'s "
                           f"parser, the nearest generated release at or below {version}",
                           "flags added after that release are reported as warnings, not errors",
                           "regenerate diag/engines/sglang/server_flags.py with this release"))
    return out
