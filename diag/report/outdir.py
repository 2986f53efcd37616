"""The report directory on disk: what diag may replace, and the atomic swap that replaces it.

diag replaces a directory only when it wrote it itself and it holds nothing else: its
manifest `.diag-report.json` lists every file diag wrote there, and any other entry (a
user's notes, a checkpoint, the working directory's files) makes `--out` an error naming
the path and what was found. An empty directory, or a path that does not exist yet, is
fine. The checks run before anything is loaded (`check_out_dir`), and again at the swap.

The swap is atomic: the new report is written into a sibling `.NAME.partial-PID-XXXX`
directory and exchanged with the old one in one `renameat2(RENAME_EXCHANGE)` call (Linux);
the old report, now in the partial directory, is removed afterwards. Where the kernel or
the file system cannot exchange, the old directory is renamed to `.NAME.old-PID-XXXX`
first, then the new one into place; a run that finds `NAME` missing but a complete
`.NAME.old-*` beside it (a crash between the two renames) puts the old report back. SIGINT
is held off during the swap, so an interrupt leaves either the old report or the new one.

Worked example: out = reports/demo holding report.json, report.md, samples.jsonl,
plots/a.png and the manifest listing them -> replaceable. reports/demo also holding
notes.txt -> DiagError "refusing to replace ...", found: notes.txt.

Without the manifest (a report copied with `cp -r src/* DIR/`, which skips dot files) diag
proves what it wrote from report.json itself: its `plots` list names every PNG it drew. A
PNG the user added under plots/ is not named there, so the directory is refused.

The same rules guard every directory a command writes as a whole, each with its own
manifest kind (`kimi-shaped OUT`: KIMI_KIND), and single output files (`check_out_file`):
an existing file is replaced only when it reads as the same command's output.

This module knows paths, renames and signals; the content comes from the other report
modules.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from diag.errors import DiagError

MANIFEST = ".diag-report.json"
REPORT_KIND = "diag-report-dir"
KIMI_KIND = "diag-kimi-shaped-dir"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _entries(folder: Path) -> list[str]:
    """Every file and directory below folder, relative, '/'-separated, sorted."""
    out = []
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        out += [str(rel / d) if str(rel) != "." else d for d in dirs]
        out += [str(rel / f) if str(rel) != "." else f for f in files]
    return sorted(p.replace(os.sep, "/") for p in out)


def _manifest(folder: Path, kind: str = REPORT_KIND) -> list[str] | None:
    f = folder / MANIFEST
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("kind") != kind:
        return None
    files = data.get("files")
    return files if isinstance(files, list) and all(isinstance(x, str) for x in files) else None


def _plots_named(report: dict) -> set[str]:
    """The plot files report.json lists: {"plots": [{"file": "plots/x.png", ...}]}."""
    plots = report.get("plots")
    if not isinstance(plots, list):
        return set()
    return {p["file"] for p in plots if isinstance(p, dict) and isinstance(p.get("file"), str)}


def _without_manifest(folder: Path, entries: list[str]) -> list[str] | None:
    """A report without its manifest (written before it existed, or copied with
    `cp -r src/* DIR/`): report.json of kind diag-report, report.md, samples.jsonl and the
    plots report.json names, nothing else. None: not a report at all."""
    try:
        report = json.loads((folder / "report.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or report.get("kind") != "diag-report":
        return None
    ours = {"report.json", "report.md", "samples.jsonl"} | _plots_named(report)
    if any(p.startswith("plots/") for p in ours):
        ours.add("plots")
    return [e for e in entries if e not in ours]


def foreign_entries(folder: Path, kind: str = REPORT_KIND) -> list[str]:
    """What in `folder` diag did not write (empty list: diag may replace it).
    Directories count as diag's when every file inside them is."""
    listed = _manifest(folder, kind)
    entries = _entries(folder)
    if not entries:
        return []
    if listed is None:
        legacy = _without_manifest(folder, entries) if kind == REPORT_KIND else None
        return entries if legacy is None else legacy
    allowed = set(listed) | {MANIFEST}
    dirs = {str(Path(p).parent).replace(os.sep, "/") for p in allowed}
    parents = {"/".join(Path(d).parts[:i + 1]) for d in dirs for i in range(len(Path(d).parts))}
    return [e for e in entries if e not in allowed and e not in parents]


def _cwd_inside(out: Path) -> bool:
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        return False
    return cwd == out or out in cwd.parents


def _writable_ancestor(out: Path) -> Path:
    p = out
    while not p.exists():
        p = p.parent
    return p


def check_out_dir(out: str | Path, kind: str = REPORT_KIND, *, field: str = "--out") -> Path:
    """Fail now, before any weight is loaded, when `out` cannot take a report (or the
    directory of another `kind`): not a directory, a symbolic link, not diag's own directory
    of that kind, the working directory or one of its parents, or on a read-only path.
    Returns the resolved path."""
    given = Path(out)
    path = given.absolute()
    restore_interrupted(path, kind)
    if given.is_symlink():
        raise DiagError("the output directory is a symbolic link; diag will not replace it",
                        file=str(given), field=field, expected="a directory diag wrote, an empty "
                        "directory or a new path", found=f"a link to {os.readlink(given)}")
    if path.exists() and not path.is_dir():
        raise DiagError("the output path exists and is not a directory", file=str(given),
                        field=field, expected="a directory diag wrote, an empty directory or a "
                        "new path", found="a file")
    if _cwd_inside(path.resolve()):
        raise DiagError("the output directory would replace the working directory or one of its "
                        "parents", file=str(given), field=field,
                        expected="a directory below the working directory, e.g. reports/NAME",
                        found=str(path.resolve()))
    if path.is_dir():
        foreign = foreign_entries(path, kind)
        if foreign:
            raise DiagError("refusing to replace a directory diag did not write (it would delete "
                            "these files)", file=str(given), field=field,
                            expected=f"an empty directory or a directory diag wrote (with "
                            f"{MANIFEST} of kind {kind} listing every file)",
                            found=", ".join(foreign[:6]) + (f" and {len(foreign) - 6} more"
                                                             if len(foreign) > 6 else ""),
                            hint="choose another --out, or move these files away")
    base = _writable_ancestor(path.parent)
    if not os.access(base, os.W_OK | os.X_OK):
        raise DiagError("the output directory cannot be written", file=str(given), field=field,
                        expected=f"write permission on {base}", found="read-only")
    return path


def write_manifest(folder: Path, kind: str = REPORT_KIND) -> None:
    """List every file now in `folder` as diag's own (written last, inside the partial dir)."""
    files = [e for e in _entries(folder) if (folder / e).is_file()]
    (folder / MANIFEST).write_text(json.dumps({"kind": kind, "files": files}, indent=1) + "\n")


def check_out_file(out: str | Path, owned, *, what: str, field: str = "--out") -> Path:
    """Fail now when `out` holds a file that `owned(path) -> bool` does not recognise as
    this command's earlier output (a user's file of the same name), or is not a file.
    Example: `diag compare A B --out notes.md` over the user's notes.md -> DiagError."""
    path = Path(out).absolute()
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise DiagError(f"the {what} path exists and is not a plain file", file=str(out),
                        field=field, expected=f"a new path or an earlier {what}",
                        found="a link" if path.is_symlink() else "a directory")
    if path.exists():
        try:
            ours = owned(path)
        except (OSError, ValueError, UnicodeDecodeError):
            ours = False
        if not ours:
            raise DiagError("refusing to replace a file diag did not write", file=str(out),
                            field=field, expected=f"a new path or an earlier {what}",
                            found="a file of other content", hint="choose another path, or move "
                            "the file away")
    base = _writable_ancestor(path.parent)
    if not os.access(base, os.W_OK | os.X_OK):
        raise DiagError(f"the {what} cannot be written", file=str(out), field=field,
                        expected=f"write permission on {base}", found="read-only")
    return path


def partial_dir(out: Path) -> Path:
    """A fresh sibling to write the new report into; stale partials of dead runs go first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        pid = stale.name.rsplit(".partial-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def restore_interrupted(out: Path, kind: str = REPORT_KIND) -> None:
    """`out` missing but a complete `.out.old-*` beside it: a swap was cut between its two
    renames; put the previous report back."""
    if out.exists() or not out.parent.is_dir():
        return
    for old in sorted(out.parent.glob(f".{out.name}.old-*")):
        if _manifest(old, kind) is not None and not foreign_entries(old, kind):
            os.rename(old, out)
            return


@contextmanager
def _no_interrupt():
    """Hold SIGINT until the block ends (main thread only), then deliver it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list = []
    previous = signal.signal(signal.SIGINT, lambda *a: caught.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(*caught[0])
            elif previous != signal.SIG_IGN:
                os.kill(os.getpid(), signal.SIGINT)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_into_place(new: Path, out: Path, kind: str = REPORT_KIND) -> None:
    """Put the finished report `new` at `out`, atomically, removing the old report."""
    with _no_interrupt():
        check_out_dir(out, kind)
        if not out.exists():
            os.rename(new, out)
            return
        if _exchange(new, out):
            shutil.rmtree(new, ignore_errors=True)          # `new` now holds the old report
            return
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
        os.rmdir(old)
        os.rename(out, old)
        os.rename(new, out)
        shutil.rmtree(old, ignore_errors=True)   # inside: a held SIGINT must not leave it behind
