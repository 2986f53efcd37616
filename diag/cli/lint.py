"""`diag lint --drafter DIR --target DIR [--launch "CMD"]`: static checks.

Prints one block per finding (severity, code, what SGLang does, the fix)
and exits 1 if any finding is an error, 0 otherwise, 2 on a usage error.
Reads config.json files and safetensors headers only; loads no weights.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from diag.errors import DiagError
from diag.checks.lint import Finding, lint
from diag.engines import families, rules as engine_rules, split

_ORDER = {"error": 0, "warning": 1, "info": 2}


def register(subparsers) -> None:
    p = subparsers.add_parser("lint", help="check a drafter/target pair and an SGLang launch "
                              "line without loading weights")
    p.add_argument("--drafter", required=True, help="drafter checkpoint directory")
    p.add_argument("--target", required=True, help="target checkpoint directory (config.json)")
    p.add_argument("--launch", default=None, help="the SGLang launch command, quoted")
    p.add_argument("--engine", default=None, help="the SGLang version the server runs, e.g. "
                   "sglang-0.5.10 (default: the newest known)")
    p.add_argument("--json", action="store_true", help="print findings as JSON")
    p.set_defaults(func=run)


def render(f: Finding) -> str:
    """e.g. 'ERROR EAGLE_ALGORITHM: ...\\n  sglang 0.5.23: ...\\n  fix: ...'."""
    where = ":".join(x for x in (f.file, f.field) if x)
    lines = [f"{f.severity.upper()} {f.code}: {f.message}"]
    if where:
        lines.append(f"  where:  {where}")
    family, version = split(f.engine) if f.engine else (families()[0], None)
    lines += [f"  {family}{f' {version}' if version else ''}: {f.sglang_behaviour}", f"  fix:    {f.fix}"]
    return "\n".join(lines)


def run(args) -> int:
    try:
        findings = lint(args.drafter, args.target, args.launch,
                        **({"engine": args.engine} if args.engine else {}))
    except DiagError as err:
        print(err.render(), file=sys.stderr)
        return 2
    findings = sorted(findings, key=lambda f: _ORDER.get(f.severity, 3))
    if args.json:
        print(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        print("\n\n".join(render(f) for f in findings) if findings else "no findings")
        counts = {s: sum(f.severity == s for f in findings) for s in _ORDER}
        rules = findings[0].engine if findings else (args.engine or f"the newest known {engine_rules().display}")
        print(f"\n{counts['error']} error(s), {counts['warning']} warning(s), "
              f"{counts['info']} info (rules of {rules})")
    return 1 if any(f.severity == "error" for f in findings) else 0
