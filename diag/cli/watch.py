"""`diag run CASE --watch`: the case run again each time it changes, the target kept loaded.

A user's hypotheses are edits to a case: one more layout, another tree, a threshold, T = 1.0.
Tried on the server each costs a restart; tried with `diag run` each loads the target again when
a loop misses the caches (Kimi: 550 GB). Watching, the first run goes as any run and writes its
report; then every change to the case file or to the prompt files it reads runs the edited case
(read again, with the command line's overrides) inside one target/resident.kept() block: what
the caches hold is reused as in any repeat run, and what they miss (a new layout's sampled
loop, a pass under another token count) runs on the model already loaded, with the drafter and the
tokenizer the first run read. resident.Key says when a model loads again instead (its files
rewritten, another regime, dtype or placement), resident.PartKey when the drafter or the
tokenizer is read again (one of its files changed).
Each run rewrites the report directory whole. An edit diag refuses prints its error, keeps the
last good report, and the watch goes on; Ctrl-C ends it (the exit code of the last run that
wrote a report: 1 under --strict with an error verdict).

Worked example: `diag run kimi.toml --watch` loads Kimi, decodes T = 1.0 for two layouts,
writes reports/kimi; the user adds "L3+L31+L59" to layouts and saves; diag prints
"[watch] kimi.toml changed: running again (1 target kept loaded)", decodes that layout's loop
on the loaded model and rewrites reports/kimi, the run's timings saying target_kept 1.

One process: --nproc, torchrun and --server are refused before any weight is read. This
module knows files' modification times and the run's callbacks; nothing about reports.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

from diag.errors import DiagError
from diag.run.case import Case, resolve_path
from diag.target.resident import kept

POLL_S = 0.5


def check_watch(a) -> None:
    """Refuse what a watch cannot do, before anything is read."""
    from diag.run.distributed import launch_of

    if a.target or a.drafter or not a.case:
        raise DiagError("--watch needs a case file to watch", field="--watch",
                        expected="diag run CASE.toml --watch",
                        found="a case built from --target/--drafter" if a.target or a.drafter else "no case file")
    if a.server or launch_of(a.nproc, dict(os.environ)) is not None:
        raise DiagError("--watch runs in one process and probes no server", field="--watch",
                        expected="no --nproc, torchrun or --server",
                        found="--server" if a.server else f"a world of {a.nproc or os.environ.get('WORLD_SIZE')} ranks")
    if a.keep_targets < 1:
        raise DiagError("--keep-targets must be at least 1", field="--keep-targets",
                        expected="1 or more models kept loaded", found=a.keep_targets)


def watched(case: Case) -> list[Path]:
    """The case file and the prompt files it reads (those that are local files)."""
    files = [Path(case.source)]
    for name, spec in (("prompts.file", case.prompts.file), ("prompts.recorded", case.prompts.recorded)):
        if spec and not spec.startswith("zoo:"):
            files.append(Path(resolve_path(spec, case, name)))
    return files


def stamps(files: list[Path]) -> tuple:
    """Each file's (mtime_ns, size), or None while it is missing (an editor's save in between)."""
    out = []
    for f in files:
        try:
            st = f.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def wait_for_change(files: list[Path], before: tuple, poll_s: float = POLL_S) -> list[Path]:
    """Block until a file's stamp differs from `before` and is there again; the changed files."""
    while True:
        now = stamps(files)
        if now != before and None not in now:
            return [f for f, b, n in zip(files, before, now) if b != n]
        time.sleep(poll_s)


def watch(first: Case, again: Callable[[], Case], once: Callable[[Case], int], *, keep: int = 1,
          wait: Callable[[list[Path], tuple], list[Path]] | None = None) -> int:
    """Run `first`, then `again()` after each change (`wait`, default wait_for_change), every run
    inside one kept() block; `once` runs a case and writes its report, returning its exit code."""
    wait = wait or wait_for_change
    with kept(keep) as held:
        files = watched(first)
        before = stamps(files)
        code, running = once(first), False
        try:
            while True:
                changed = wait(files, before)
                print(f"[watch] {', '.join(f.name for f in changed)} changed: running again "
                      f"({len(held.models)} target{'s' if len(held.models) != 1 else ''} kept loaded)", flush=True)
                before, running = stamps(files), True
                try:
                    case = again()
                    files = watched(case)
                    before = stamps(files)
                    code = once(case)
                except DiagError as err:
                    print(f"diag run --watch: error: {err}", file=sys.stderr, flush=True)
                    print("[watch] the last report stays; waiting for the next change", flush=True)
                running = False
        except KeyboardInterrupt:
            print("\n[watch] stopped" + (" during a run: the report is the last complete run's" if running else ""),
                  flush=True)
    return code
