"""Where a checkpoint named by a case key, a flag or a launch line lies: the one place where diag
turns such a name into a directory.

A name is, in this order:
1. `zoo:NAME`: a built-in tiny checkpoint (built on first use);
2. a local directory that exists (a relative one from the case file's folder, or from the working
   directory for flags): it wins over a hub id of the same spelling, and the note says so;
3. a Hugging Face hub id, `org/name` or `org/name@revision` (diag.checkpoint.hub): for `run` the
   complete cached snapshot, never downloaded; for `lint` and `validate` (configs_only) just its
   JSON files, fetched when HF_HUB_OFFLINE allows;
4. anything else: the path as written, for the reader that opens it to say what is missing.

Example: `--target moonshotai/Kimi-K2.5@main` with no such folder in the working directory ->
<HF_HUB_CACHE>/models--moonshotai--Kimi-K2.5/snapshots/<commit of refs/main>.

This module knows names and where they point; it reads no config and no weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diag.checkpoint import hub
from diag.run.case import Case, expand_env, resolve_path

# case key -> the flag that sets it in a case built from flags (cli/run.py case_from_flags)
_FLAGS = {"target.path": "--target", "drafter.path": "--drafter"}


@dataclass(frozen=True)
class Located:
    """A checkpoint's directory, and how its name got there (None: a plain local path)."""

    path: Path
    note: str | None = None
    resolved: hub.Resolved | None = None     # set for a hub id


def _where(case: Case | None, field: str) -> tuple[str | None, str]:
    """(file, field) for messages: a flags case names the flag, e.g. (None, '--target (target.path)')."""
    if case is None:
        return None, field
    if case.source.startswith("<"):
        flag = _FLAGS.get(field)
        return None, f"{flag} ({field})" if flag else field
    return case.source, field


def _local(text: str, case: Case | None) -> Path:
    base = Path.cwd() if case is None or case.source.startswith("<") else Path(case.source).parent
    return (base / text).resolve()


def locate(spec: str, case: Case | None, field: str, *, configs_only: bool = False) -> Located:
    """The directory a checkpoint name points to (see the module docstring for the order).
    case None: a name from a command line (lint, effective), taken from the working directory,
    with `field` the flag that gave it."""
    text = spec if case is None else expand_env(spec, case, field)
    if text.startswith("zoo:"):
        from diag.zoo import zoo_path
        return Located(Path(zoo_path(text[4:])))
    if not hub.looks_like_hub_id(text):
        return Located(Path(text if case is None else resolve_path(spec, case, field)))
    local = _local(text, case)
    if local.is_dir():
        return Located(local, f"{field}: {text} is the local directory {local}, used instead of the "
                              "Hugging Face hub id of the same spelling")
    file, shown = _where(case, field)
    hid = hub.parse(text, field=shown, file=file)
    got = (hub.configs if configs_only else hub.snapshot)(hid, field=shown, file=file)
    return Located(got.path, f"{field}: {text} -> {got.describe()}", resolved=got)
