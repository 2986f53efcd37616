"""Applying a rendering (rendering.py) to prompts: chat templates, thinking switches, system
prompts, and the token ids that come out.

A chat template's thinking switch is the variable it reads, found in its Jinja source:
Kimi-K2.5 ends its generation prompt with

    {%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}

so "+nothink" passes thinking=False (14 characters of suffix, one `<think></think>`), and
"+think" passes thinking=True; Qwen3 reads `enable_thinking`. SWITCHES lists the names in the
order they are looked for; a template reading neither cannot be switched, and asking for it
is an error before any weight is loaded.

A template file may be a Jinja file or a tokenizer_config.json holding "chat_template" (what a
trainer such as SpecForge leaves next to its data). This module knows tokenizers, templates and
files; it knows nothing about models.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from diag.errors import DiagError
from diag.run.prompts import Prompt
from diag.run.rendering import Rendering

SWITCHES = ("thinking", "enable_thinking")


def load_template(path: str | Path, *, field_name: str) -> str:
    """The template text of a .jinja file, or of a JSON file's "chat_template"."""
    p = Path(path)
    if not p.is_file():
        raise DiagError("template file not found", file=str(p), field=field_name,
                        expected="a Jinja chat template or a tokenizer_config.json", found="no such file")
    text = p.read_text()
    if p.suffix == ".json":
        try:
            text = json.loads(text).get("chat_template")
        except (json.JSONDecodeError, AttributeError) as err:
            raise DiagError("template JSON is not an object", file=str(p), field=field_name,
                            expected='{"chat_template": "..."}', found=str(err)[:80]) from err
        if not isinstance(text, str) or not text:
            raise DiagError("template JSON has no chat_template string", file=str(p), field="chat_template",
                            expected="a Jinja template string", found=repr(text)[:80])
    return text


def template_variables(text: str) -> set[str]:
    """Variables a Jinja template reads from its caller (messages, add_generation_prompt, ...)."""
    import jinja2
    from jinja2 import meta
    try:
        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
        return set(meta.find_undeclared_variables(env.parse(text)))
    except jinja2.TemplateSyntaxError:      # a tag only transformers knows: read the names
        return set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))


def thinking_switch(text: str | None) -> str | None:
    """The thinking variable a template reads (SWITCHES order), None when it reads none."""
    names = template_variables(text) if text else set()
    return next((s for s in SWITCHES if s in names), None)


@dataclass(frozen=True)
class Renderer:
    """Everything a rendering needs besides the prompt: the target's tokenizer, the case's
    template files (name -> (file, text)) and its system prompt."""

    tokenizer: object
    templates: dict[str, tuple[str, str]] = field(default_factory=dict)
    system_prompt: str | None = None
    tokenizer_file: str = "tokenizer_config.json"

    def template(self, r: Rendering) -> tuple[str | None, str]:
        """(template text or None, where it came from)."""
        if r.template_name is not None:
            file, text = self.templates[r.template_name]
            return text, file
        return getattr(self.tokenizer, "chat_template", None) or None, self.tokenizer_file

    def check(self, r: Rendering, *, field_name: str) -> None:
        """Everything that can fail, before any weight is read."""
        text, where = self.template(r)
        if r.base == "chat" and text is None:
            raise DiagError("the target's tokenizer has no chat template", file=where, field="chat_template",
                            expected=f"a chat template for rendering {r.name}", found="none")
        if r.thinking is not None and thinking_switch(text) is None:
            raise DiagError("the template has no thinking switch", file=where, field=field_name,
                            expected=f"a template reading one of {list(SWITCHES)} (for {r.name})",
                            found="neither")
        if r.system and not self.system_prompt:
            raise DiagError("a +system rendering needs a system prompt", field="rendering.system_prompt",
                            expected=f"a system prompt text (for {r.name})", found="none")
        if text is not None and r.base != "raw":
            self._probe(r, text, where)

    def _probe(self, r: Rendering, text: str, where: str) -> None:
        """The template renders one user turn to some text: a syntax error, an exception it
        raises or an empty rendering is named now, not as a jinja2 traceback mid-run.
        Example: "{% for m in messages %}{{ m.content }" -> "unexpected '}'", line 1."""
        msgs = [{"role": "user", "content": "hello"}]
        kwargs = {} if r.thinking is None else {thinking_switch(text): r.thinking}
        out = self._apply(msgs, text, where, kwargs, tokenize=False)
        if not str(out).strip():
            raise DiagError("the chat template renders to nothing", file=where, field="chat_template",
                            expected=f"some text for one user turn (rendering {r.name})", found=repr(out))

    def _apply(self, msgs: list[dict], text: str, where: str, kwargs: dict, *, tokenize: bool):
        import jinja2
        try:
            return self.tokenizer.apply_chat_template(msgs, chat_template=text, add_generation_prompt=True,
                                                      tokenize=tokenize, **kwargs)
        except (jinja2.TemplateError, TypeError, ValueError) as err:
            line = f" (line {err.lineno})" if getattr(err, "lineno", None) else ""
            raise DiagError("the chat template does not render", file=where, field="chat_template",
                            expected="a Jinja chat template that renders the prompts' turns",
                            found=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}{line}") from None

    def ids(self, prompt: Prompt, r: Rendering) -> list[int]:
        """Token ids of one prompt under one rendering (see rendering.py for the bases)."""
        tok = self.tokenizer
        templated = r.base != "raw" and (prompt.messages is not None or r.base != "auto")
        if not templated:
            return list(tok(_plain(prompt), add_special_tokens=True)["input_ids"])
        text, _ = self.template(r)
        msgs = self._messages(prompt, r)
        if text is None:                    # auto on a tokenizer without a template
            joined = "\n".join(f"{m['role']}: {m['content']}" for m in msgs) + "\nassistant:"
            return list(tok(joined, add_special_tokens=True)["input_ids"])
        kwargs = {} if r.thinking is None else {thinking_switch(text): r.thinking}
        out = self._apply(msgs, text, self.template(r)[1], kwargs, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)

    def _messages(self, prompt: Prompt, r: Rendering) -> list[dict]:
        turns = list(prompt.messages) if prompt.messages is not None else [("user", prompt.text)]
        if r.system is False:
            turns = [t for t in turns if t[0] != "system"]
        elif r.system and not any(role == "system" for role, _ in turns):
            turns = [("system", self.system_prompt)] + turns
        return [{"role": role, "content": content} for role, content in turns]


def _plain(prompt: Prompt) -> str:
    """A prompt as raw text: its text, or its turns' contents one per line."""
    if prompt.messages is None:
        return prompt.text
    return "\n".join(content for _, content in prompt.messages)
