"""A prompt as diag replays it, and a prompt set: what a prompt file becomes after reading.

A prompt is either raw completion text (`text`, tokenized as is) or chat turns (`messages`,
(role, content) pairs, through the tokenizer's chat template). `format` names the file format
it came from (formats.py); `category` comes from the record or the file's name.
This module knows records; nothing about files, formats or tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str | None
    messages: tuple[tuple[str, str], ...] | None
    format: str = "text"


@dataclass(frozen=True)
class PromptSet:
    path: str
    sha256: str
    prompts: tuple[Prompt, ...]
    notes: tuple[str, ...] = ()      # what the readers did, e.g. "mt-bench: first turn only"
