"""Files and directories diag is about to read: one that exists but cannot be read (its mode,
its owner) is a DiagError naming it, before any work, instead of a PermissionError traceback
from whichever reader met it first (issue 35.3).

Worked example: chmod 000 target/model.safetensors, run as uid 1000 -> DiagError "the target
checkpoint's file cannot be read", file target/model.safetensors, expected "read permission",
found "mode ---------- owner uid 0; diag runs as uid 1000".
A directory needs read and search (x) permission: without x, not even its config.json can be
opened. A path that does not exist is left to the caller, which knows what it should have been.

This module knows paths and permissions; nothing about what the files hold.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from diag.errors import DiagError


def unreadable_error(path: str | Path, what: str, *, field: str | None = None) -> DiagError:
    path = Path(path)
    try:
        st = path.stat()
        found = f"mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid}; diag runs as uid {os.geteuid()}"
    except OSError as err:
        found = err.strerror or str(err)
    need = "read and search (x) permission on the directory" if path.is_dir() else "read permission"
    return DiagError(f"{what} cannot be read", file=str(path), field=field, expected=need, found=found,
                     hint="fix its permissions (chmod / chown), or run diag as a user who can read it")


def require_readable(path: str | Path, what: str, *, field: str | None = None) -> Path:
    """`path` itself, when it exists and can be read (see the module docstring)."""
    path = Path(path)
    if path.is_dir():
        if not os.access(path, os.R_OK | os.X_OK):
            raise unreadable_error(path, what, field=field)
    elif path.exists() and not os.access(path, os.R_OK):
        raise unreadable_error(path, what, field=field)
    return path


def require_readable_tree(directory: str | Path, what: str, *, field: str | None = None) -> Path:
    """A checkpoint directory and every file directly in it (configs, shards, tokenizer files)."""
    directory = require_readable(directory, what, field=field)
    if directory.is_dir():
        for f in sorted(directory.iterdir()):
            if f.is_file():
                require_readable(f, f"{what}'s file", field=field)
    return directory
