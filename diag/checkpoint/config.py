"""Reading a checkpoint's config.json and the few keys every part of diag needs, with clear errors.

This module knows files and JSON; nothing about what the keys mean.
"""

from __future__ import annotations

import json
from pathlib import Path

from diag.errors import DiagError
from diag.checkpoint.readable import require_readable


def read_config_json(directory: str | Path, what: str = "checkpoint") -> dict:
    """directory/config.json as a dict. `what` names the checkpoint in errors ("target",
    "drafter"): e.g. "drafter checkpoint has no config.json"."""
    directory = require_readable(directory, f"{what} checkpoint directory")
    path = require_readable(directory / "config.json", f"{what} config.json")
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


def text_config(config: dict) -> dict:
    """The language model's config: a multimodal wrapper's `text_config` (Kimi-K2.5), else
    the config itself. The one place diag looks inside a wrapper."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def architecture(config: dict) -> str | None:
    """`architectures[0]`, what SGLang keys its model class and auto defaults on; None if absent.
    A wrapper names itself: Kimi-K2.5 -> KimiK25ForConditionalGeneration."""
    archs = config.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def positive_int(config: dict, key: str, *, file: str | None = None, what: str = "config") -> int:
    """text_config(config)[key] as a positive integer, or a DiagError naming the key."""
    value = text_config(config).get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DiagError(f"{what} has no usable {key}", file=file, field=key,
                        expected="a positive integer", found=repr(value) if isinstance(value, str) else value)
    return value


def num_layers(target_config: dict, *, file: str | None = None) -> int:
    return positive_int(target_config, "num_hidden_layers", file=file, what="target config")


def hidden_size(config: dict, *, file: str | None = None) -> int:
    return positive_int(config, "hidden_size", file=file)
