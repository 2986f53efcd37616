"""The `diag` command: one subcommand per module of diag/cli (run, zoo, lint, ...).

User errors (DiagError) print their message and exit 2; no report is written for them.
An interrupt (SIGINT) exits 130 without a traceback: the report swap and the cache writes
are atomic, so what is on disk is the previous state or the complete new one.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# torch's OpenMP threads busy-wait between parallel regions before they sleep. On a machine
# whose cores are shared (the demo beside a CI run, two helpers on 2 cores) the spinning
# threads take the cores the other process needs, and both slow several-fold (the demo's
# checkpoints: 208 s quiet, 797 s beside another load). PASSIVE makes them sleep at once.
# It must be set before torch loads its OpenMP runtime, and a user's own choice stands.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from diag.cli.paths import expand_paths, flag_names  # noqa: E402  (after the OpenMP policy)
from diag.errors import DiagError  # noqa: E402

COMMANDS = ("run", "zoo", "kimi", "explain", "effective", "lint", "compare", "bench", "probe")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diag", description="EAGLE-3 drafter-vs-target diagnostics")
    sub = parser.add_subparsers(dest="command")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"diag.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"diag.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv or ["run"])
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        expand_paths(args, flag_names(parser, args.command))    # `--out=~/r`, `--out '$HOME'`
        return int(args.func(args) or 0)
    except DiagError as err:
        print(f"diag {args.command}: error: {err}", file=sys.stderr)
        return 2
    except PermissionError as err:       # a reader no check before it reached (diag.checkpoint.readable)
        from diag.checkpoint.readable import unreadable_error
        print(f"diag {args.command}: error: {unreadable_error(err.filename or '?', 'a file diag needs')}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"diag {args.command}: interrupted; the previous report and the cache are as they were "
              "(or the new report is complete)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
