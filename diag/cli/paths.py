"""Path flags as shells leave them (issue 35.5): bash does not expand `~` after `=`
(`--out=~/reports` arrives as "~/reports") nor anything in single quotes (`--out '$HOME'`
arrives as "$HOME"). diag expands `~` as the shell would have, and refuses a `$VAR` the shell
left alone, so it never creates a directory named `~` or `$HOME` and prints a path that exists.

Worked examples (HOME=/home/u):
  --out=~/reports       -> /home/u/reports
  --out ~alice/r        -> /home/alice/r (an unknown user: an error)
  --out '$HOME/r'       -> DiagError: --out holds an unexpanded $HOME
  --target zoo:llama-tiny, --template train=~/t.jinja -> unchanged / train=/home/u/t.jinja

Every path-valued argument of every subcommand is named in PATH_DESTS; `expand_paths` runs
on the parsed arguments before any command does. This module knows strings and argparse;
nothing about what the paths hold.
"""

from __future__ import annotations

import argparse
import os
import re

from diag.errors import DiagError

# argparse dests that hold paths, over all subcommands (run, validate, lint, compare, bench, kimi,
# effective); `template` holds NAME=PATH pairs.
PATH_DESTS = frozenset({"case", "target", "drafter", "prompts", "recorded", "out", "workdir", "inputs", "a", "b",
                        "long_context_file", "template", "server_log", "server_baseline_log", "server_responses",
                        "server_server_info", "server_vllm_metrics"})
_VAR = re.compile(r"\$(\{\w+\}|\w+)")


def user_path(text: str, flag: str) -> str:
    """`text` with a leading `~` expanded; a `$VAR` left in it is an error naming the flag."""
    if m := _VAR.search(text):
        name = m.group(1).strip("{}")
        value = os.environ.get(name)
        raise DiagError(f"{flag} holds an unexpanded environment variable (the shell left it as "
                        "written, e.g. inside single quotes)", field=flag,
                        expected=f"a path; write {flag} \"${name}...\" (double quotes) so the shell expands "
                                 f"it{f' to {value}' if value else ''}", found=text)
    if text.startswith("~"):
        expanded = os.path.expanduser(text)
        if expanded.startswith("~"):
            raise DiagError(f"{flag} starts with ~ but names no user diag can find", field=flag,
                            expected="~/path or ~user/path of an existing user", found=text)
        return expanded
    return text


def _one(value: str, dest: str, flag: str) -> str:
    if dest == "template" and "=" in value:
        name, path = value.split("=", 1)
        return f"{name}={user_path(path, flag)}"
    return user_path(value, flag)


def expand_paths(args: argparse.Namespace, flags: dict[str, str]) -> None:
    """Every path argument in `args` expanded in place. flags: dest -> how the user wrote it
    (e.g. "out" -> "--out", "case" -> "CASE")."""
    for dest in PATH_DESTS:
        value = getattr(args, dest, None)
        flag = flags.get(dest, dest.upper())
        if isinstance(value, str):
            setattr(args, dest, _one(value, dest, flag))
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            setattr(args, dest, [_one(v, dest, flag) for v in value])


def flag_names(parser: argparse.ArgumentParser, command: str | None) -> dict[str, str]:
    """dest -> the flag (or the positional's metavar) of `command`'s subparser."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    p = sub.choices.get(command) if sub is not None and command else None
    if p is None:
        return {}
    return {a.dest: (a.option_strings[-1] if a.option_strings else (a.metavar or a.dest.upper()))
            for a in p._actions}
