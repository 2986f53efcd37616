"""A vLLM launch command and its `--speculative-config`, read into a record; the release's keys checked.

    vllm serve /models/llama --speculative-config '{"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}'
    python -m vllm.entrypoints.openai.api_server --model /models/llama --speculative-config={...}
    vllm serve /models/llama --speculative-config.method eagle3 --speculative-config.num_speculative_tokens 3
      -> VllmLaunch(target="/models/llama", spec=SpecConfig(method="eagle3", model="/d", k=3, ...))
A chain of k = num_speculative_tokens drafts per round: k + 1 tokens verified, counters per
position 0..k-1 (`speculative_token_tree`, where the release has it, makes a tree instead).

Errors name the flag and what was found: JSON that does not parse (with the character position
and the text around it), a method diag does not model, a key the release's SpeculativeConfig does
not have. This module knows command lines and JSON; the keys per release are table.py's data.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from diag.engines.vllm.releases import VllmRelease, rule_row, span, vllm_release
from diag.errors import DiagError

FLAG = "--speculative-config"
METHODS = ("eagle3", "eagle")
OTHER_METHODS = ("ngram", "medusa", "mlp_speculator", "draft_model", "mtp", "deepseek_mtp", "suffix",
                 "dflash", "extract_hidden_states")
_ENTRYPOINTS = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server", "vllm.entrypoints.cli.main")


@dataclass(frozen=True)
class SpecConfig:
    method: str
    model: str | None
    num_speculative_tokens: int
    draft_tensor_parallel_size: int | None = None
    token_tree: str | None = None
    raw: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class VllmLaunch:
    target: str | None
    spec: SpecConfig | None
    argv: tuple[str, ...]


def is_vllm_command(argv) -> bool:
    """`vllm serve ...`, `.../bin/vllm serve ...`, `python -m vllm.entrypoints.openai.api_server ...`."""
    words = list(argv)
    if any(w.split("/")[-1] == "vllm" and i + 1 < len(words) and words[i + 1] == "serve" for i, w in enumerate(words)):
        return True
    return any(w in _ENTRYPOINTS for w in words)


def _json(text: str, where: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        a = max(0, err.pos - 20)
        raise DiagError(f"{FLAG} is not JSON: {err.msg} at character {err.pos}", field=FLAG,
                        expected="a JSON object, e.g. '{\"method\": \"eagle3\", \"model\": \"/d\", "
                                 "\"num_speculative_tokens\": 3}' (quote it for the shell)",
                        found=f"{text[a:err.pos]!r} ⟶ {text[err.pos:err.pos + 20]!r} (in {where})") from None
    if not isinstance(value, dict):
        raise DiagError(f"{FLAG} is JSON but not an object", field=FLAG, expected="{...}", found=text[:80])
    return value


def parse_spec_config(value: dict | str, eng: str | VllmRelease | None = None, *, where: str = FLAG) -> SpecConfig:
    """Check and read a --speculative-config object against `eng`'s SpeculativeConfig keys."""
    d = _json(value, where) if isinstance(value, str) else dict(value)
    keys = rule_row("spec_config_keys", eng)
    unknown = sorted(set(d) - set(keys.value))
    if unknown:
        raise DiagError(f"{FLAG} has a key {vllm_release(eng).label} does not know", field=f"{FLAG} {unknown[0]}",
                        expected=f"keys of SpeculativeConfig in vLLM {span(keys)}: {', '.join(keys.value)}",
                        found=", ".join(unknown))
    method = d.get("method")
    if method not in METHODS:
        what = "a method diag does not model" if method in OTHER_METHODS else "an unknown method"
        raise DiagError(f"{FLAG} names {what}", field=f"{FLAG} method", expected=" or ".join(METHODS),
                        found=repr(method),
                        hint="diag diagnoses EAGLE-3 drafters (method eagle3; eagle serves one hidden state)"
                        if method is None or method in OTHER_METHODS else None)
    k = d.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise DiagError(f"{FLAG} needs num_speculative_tokens", field=f"{FLAG} num_speculative_tokens",
                        expected="an integer >= 1 (the chain length k)", found=repr(k))
    tree = d.get("speculative_token_tree")
    return SpecConfig(method, d.get("model"), k, d.get("draft_tensor_parallel_size"),
                      None if tree is None else str(tree), d)


def _dotted(argv: list[str]) -> tuple[dict, list[str]]:
    """--speculative-config.KEY VALUE (or =VALUE) pairs -> {KEY: JSON-or-string value}."""
    out, rest, i = {}, [], 0
    while i < len(argv):
        w = argv[i]
        if w.startswith(FLAG + "."):
            key, eq, val = w[len(FLAG) + 1:].partition("=")
            if not eq:
                i, val = i + 1, argv[i + 1] if i + 1 < len(argv) else ""
            try:
                out[key.replace("-", "_")] = json.loads(val)
            except json.JSONDecodeError:
                out[key.replace("-", "_")] = val
        else:
            rest.append(w)
        i += 1
    return out, rest


def parse_launch(command, eng: str | VllmRelease | None = None) -> VllmLaunch:
    """Read a vLLM launch command (a string or argv) into its target and speculative config."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not is_vllm_command(argv):
        raise DiagError("not a vLLM launch command", field="launch",
                        expected="vllm serve MODEL ... or "
                                 "python -m vllm.entrypoints.openai.api_server --model MODEL ...",
                        found=" ".join(argv)[:120])
    dotted, words = _dotted(argv)
    target, spec_text = None, None
    for i, w in enumerate(words):
        name, eq, val = w.partition("=")
        if name in (FLAG, "--speculative_config", "-sc"):
            spec_text = val if eq else (words[i + 1] if i + 1 < len(words) else "")
        elif name == "--model":
            target = val if eq else (words[i + 1] if i + 1 < len(words) else None)
        elif w == "serve" and i + 1 < len(words) and not words[i + 1].startswith("-") and target is None:
            target = words[i + 1]
    if spec_text is None and not dotted:
        return VllmLaunch(target, None, tuple(argv))
    d = _json(spec_text, "the launch command") if spec_text is not None else {}
    d.update(dotted)
    return VllmLaunch(target, parse_spec_config(d, eng), tuple(argv))
