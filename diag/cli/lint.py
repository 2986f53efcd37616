"""`diag lint --drafter D --target T [--launch "CMD"]`: static checks.

Prints one block per finding (severity, code, what SGLang does, the fix)
and exits 1 if any finding is an error, 0 otherwise, 2 on a usage error.
Reads config.json files and safetensors headers only; loads no weights.
T and D are directories, zoo:NAME or hub ids (org/name[@revision]); either may be left out when
the launch line names it (model_path, draft_model_path, as the engine's own launch parser reads
them). A hub id brings only its JSON files (diag.checkpoint.hub), and the lines before the
findings say what was fetched.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from diag.errors import DiagError
from diag.checks.lint import Finding, lint
from diag.engines import DEFAULT_ENGINE, engine as engine_of, families, rules as engine_rules, split

_ORDER = {"error": 0, "warning": 1, "info": 2}


def register(subparsers) -> None:
    p = subparsers.add_parser("lint", help="check a drafter/target pair and a server's launch "
                              "line without loading weights")
    p.add_argument("--drafter", help="drafter checkpoint directory or hub id org/name[@revision] "
                   "(default: the one the launch line names)")
    p.add_argument("--target", help="target checkpoint directory (config.json) or hub id org/name[@revision] "
                   "(default: the one the launch line names)")
    p.add_argument("--launch", default=None, help="the server's launch command, quoted")
    p.add_argument("--engine", default=None, help="the engine release the server runs, <family>-<version> "
                   f"(families: {', '.join(families())}; default: {DEFAULT_ENGINE})")
    p.add_argument("--json", action="store_true", help="print findings as JSON")
    p.set_defaults(func=run)


def render(f: Finding) -> str:
    """e.g. 'ERROR EAGLE_ALGORITHM: ...\\n  sglang 0.5.23: ...\\n  fix: ...'."""
    where = ":".join(x for x in (f.file, f.field) if x)
    lines = [f"{f.severity.upper()} {f.code}: {f.message}"]
    if where:
        lines.append(f"  where:  {where}")
    family, version = split(f.engine) if f.engine else (families()[0], None)
    lines += [f"  {family}{f' {version}' if version else ''}: {f.behaviour}", f"  fix:    {f.fix}"]
    return "\n".join(lines)


def _named(args) -> dict[str, str | None] | None:
    """The checkpoints the launch line names, read by the engine's own launch parser
    (EngineRules.parse_launch: model_path, draft_model_path), or None. A line that parser cannot
    read is a finding of its own, unless a checkpoint must come from it."""
    if not args.launch:
        return None
    release = engine_of(args.engine)
    try:
        flags = engine_rules(release).parse_launch(args.launch, release=release)
    except DiagError:
        if args.target and args.drafter:
            return None
        raise
    return {"target": flags.model_path, "drafter": flags.draft_model_path}


def _checkpoint(args, named, role: str) -> tuple[str, list[str]]:
    """(directory, lines to print) for --target or --drafter, else the launch line's name."""
    from diag.run.checkpoints import locate
    flag, given = f"--{role}", getattr(args, role)
    key = "model_path" if role == "target" else "draft_model_path"
    launched = (named or {}).get(role)
    if given is None and launched is None:
        raise DiagError(f"no {role} checkpoint named", field=flag, expected=f"{flag} DIR or org/name[@revision], "
                        f"or a --launch line that names it ({key})", found="neither")
    spec, field = (given, flag) if given is not None else (launched, f"--launch ({key})")
    loc = locate(spec, None, field, configs_only=True)
    lines = [f"{role}: {loc.note}"] if loc.note else []
    if given is not None and launched is not None and launched != given:
        lines.append(f"{role}: {flag} {given} is linted; the launch line's {key} is {launched}")
    return str(loc.path), lines


def run(args) -> int:
    try:
        named = _named(args)
        (target, t_lines), (drafter, d_lines) = (_checkpoint(args, named, r) for r in ("target", "drafter"))
        findings = lint(drafter, target, args.launch, **({"engine": args.engine} if args.engine else {}))
    except DiagError as err:
        print(err.render(), file=sys.stderr)
        return 2
    if t_lines + d_lines:
        print("\n".join(t_lines + d_lines) + "\n", file=sys.stderr if args.json else sys.stdout)
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
