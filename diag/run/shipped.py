"""The files diag ships as package data: the demo cases and the default prompt set.

They live in `diag/cases/` (the checkout's top-level `cases/` is a link to it), so a wheel
or a plain `pip install .` carries them, and they are found through importlib.resources
wherever diag is installed, whatever the working directory.

Worked example: shipped("cases/demo.toml")
  in a checkout, run from its root  -> Path("cases/demo.toml")   (the short name reports show)
  installed, run from anywhere else -> .../site-packages/diag/cases/demo.toml

This module knows where the shipped files are; what a case means is case.py's.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

DEMO = "cases/demo.toml"
DEFAULT_PROMPTS = "cases/prompts/mixed-48.jsonl"


def shipped(rel: str) -> Path:
    """The shipped file `rel` ("cases/..."): the working directory's name for it when that is
    the same file (a checkout), else its installed path."""
    packaged = Path(str(files("diag").joinpath(rel)))
    here = Path(rel)
    try:
        if here.exists() and here.resolve() == packaged.resolve():
            return here
    except OSError:
        pass
    return packaged
