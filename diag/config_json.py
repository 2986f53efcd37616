"""Reading a checkpoint's config.json: the one place that does it, with clear errors.

This module knows files and JSON; nothing about what the keys mean.
"""

from __future__ import annotations

import json
from pathlib import Path

from diag.errors import DiagError


def read_config_json(directory: str | Path, what: str = "checkpoint") -> dict:
    """directory/config.json as a dict. `what` names the checkpoint in errors ("target",
    "drafter"): e.g. "drafter checkpoint has no config.json"."""
    directory = Path(directory)
    path = directory / "config.json"
    if not directory.is_dir():
        raise DiagError(f"{what} checkpoint directory does not exist", file=str(directory),
                        expected="a directory with config.json and *.safetensors", found="no such directory")
    if not path.is_file():
        raise DiagError(f"{what} checkpoint has no config.json", file=str(path),
                        expected="a Hugging Face style config.json", found="missing")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DiagError("config.json is not valid JSON", file=str(path), expected="a JSON object",
                        found=str(err)) from err
    if not isinstance(data, dict):
        raise DiagError("config.json must hold an object", file=str(path), expected="a JSON object",
                        found=type(data).__name__)
    return data
