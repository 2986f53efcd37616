"""Prompt renderings: how a prompt becomes the token ids the target reads, named as data.

A rendering is written BASE or BASE+MOD+MOD, e.g. "chat", "chat+nothink", "train+system":

    base     auto    messages prompts through the target's chat template, text prompts raw
                     (what SGLang does with /v1/chat/completions and /generate requests;
                     diag's behaviour before renderings, and the default)
             raw     every prompt as plain text (a chat prompt's turn contents, one per line)
             chat    every prompt through the target's chat template (a text prompt becomes
                     one user turn)
             NAME    like chat, with a template file the case names ([rendering].templates),
                     e.g. the template the drafter was trained with
    modifier think / nothink     pass the template's thinking switch on / off (Kimi-K2.5's
                                 template reads `thinking`, Qwen3's `enable_thinking`)
             system / nosystem   add the case's system prompt where a prompt has none / drop
                                 every system turn

The canonical name puts the thinking modifier before the system one: "chat+system+nothink"
is written "chat+nothink+system". Worked example: parse("train+nosystem+think") ->
Rendering(base="train", thinking=True, system=False), name "train+think+nosystem".

This module knows names and their grammar; applying one to a prompt is render.py's work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.errors import DiagError

DEFAULT = "auto"
BUILTIN_BASES = {"auto": "messages through the target's template, text raw",
                 "raw": "plain text, no template",
                 "chat": "the target's chat template for every prompt"}
MODIFIERS = {"think": ("thinking", True), "nothink": ("thinking", False),
             "system": ("system", True), "nosystem": ("system", False)}
TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True)
class Rendering:
    base: str                    # "auto" | "raw" | "chat" | a template name of the case
    thinking: bool | None = None  # None: the template's own default
    system: bool | None = None    # None: prompts as written; True: add one; False: drop them

    @property
    def name(self) -> str:
        mods = [] if self.thinking is None else ["think" if self.thinking else "nothink"]
        mods += [] if self.system is None else ["system" if self.system else "nosystem"]
        return "+".join([self.base, *mods])

    @property
    def uses_template(self) -> bool:
        return self.base != "raw"

    @property
    def template_name(self) -> str | None:
        """The case template this rendering reads, None for the target's own (or none)."""
        return None if self.base in BUILTIN_BASES else self.base


def parse(text: str, templates: tuple[str, ...] = (), *, field: str = "rendering") -> Rendering:
    """A rendering name -> Rendering; `templates` are the case's template names."""
    if not isinstance(text, str) or not text:
        raise DiagError("a rendering must be a non-empty name", field=field,
                        expected="e.g. chat, raw, chat+nothink", found=repr(text))
    base, *mods = text.split("+")
    if base not in BUILTIN_BASES and base not in templates:
        raise DiagError("unknown rendering base", field=field,
                        expected=f"one of {sorted(BUILTIN_BASES)} or a template named in "
                                 f"[rendering].templates {sorted(templates)}", found=base)
    chosen: dict[str, bool] = {}
    for m in mods:
        if m not in MODIFIERS:
            raise DiagError("unknown rendering modifier", field=field,
                            expected=f"one of {sorted(MODIFIERS)}", found=f"{m} (in {text})")
        key, value = MODIFIERS[m]
        if key in chosen:
            raise DiagError("a rendering switches the same thing twice", field=field,
                            expected=f"one {key} modifier", found=text)
        chosen[key] = value
    out = Rendering(base, chosen.get("thinking"), chosen.get("system"))
    if not out.uses_template and chosen:
        raise DiagError("raw text has no template to switch", field=field,
                        expected="think / nothink / system / nosystem only on a templated base",
                        found=text)
    return out


def check_template_name(name: str, *, field: str) -> None:
    if name in BUILTIN_BASES or not TEMPLATE_NAME.match(name):
        raise DiagError("bad template name", field=field,
                        expected=f"lower-case letters, digits, - or _, not {sorted(BUILTIN_BASES)}",
                        found=name)
