"""The checkpoints a launch command line names, as the engine reads them, so that `diag lint
--launch "..."` can lint the pair the server really loads (a hub id or a directory).

SGLang:  python -m sglang.launch_server --model-path moonshotai/Kimi-K2.5 \\
             --speculative-draft-model-path lightseekorg/kimi-k2.5-eagle3      (also --model,
             --speculative-draft-model, `sglang serve`, --flag=value)
vLLM:    vllm serve moonshotai/Kimi-K2.5 --speculative-config '{"model": "org/drafter", ...}'
             (also --model, -sc, --speculative-config.model org/drafter,
             python -m vllm.entrypoints.openai.api_server --model ...)

A repeated flag keeps its last value, as argparse does. This module knows command-line words
only; it resolves no name (diag.run.checkpoints does) and applies no engine rule.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from diag.errors import DiagError

_TARGET = {"sglang": ("--model-path", "--model"), "vllm": ("--model",)}
_DRAFTER = {"sglang": ("--speculative-draft-model-path", "--speculative-draft-model"),
            "vllm": ("--speculative-config.model",)}
_SPEC_JSON = ("--speculative-config", "--speculative_config", "-sc")


@dataclass(frozen=True)
class LaunchModels:
    """e.g. LaunchModels('vllm', ('vllm serve MODEL', 'org/t'), ('--speculative-config "model"', 'org/d'))."""

    engine: str                             # "sglang" | "vllm"
    target: tuple[str, str] | None          # (where in the line, the name as written)
    drafter: tuple[str, str] | None


def _engine(words: list[str]) -> tuple[str, int]:
    """('sglang' | 'vllm', index just past the program words)."""
    for i, w in enumerate(words):
        if w.endswith("sglang.launch_server") or w.endswith("vllm.entrypoints.openai.api_server"):
            return ("sglang" if "sglang" in w else "vllm"), i + 1
        if w.rsplit("/", 1)[-1] in ("sglang", "vllm") and words[i + 1:i + 2] == ["serve"]:
            return w.rsplit("/", 1)[-1], i + 2
    raise DiagError("the launch command starts no SGLang or vLLM server", field="--launch",
                    expected="python -m sglang.launch_server ..., sglang serve ..., vllm serve MODEL ...",
                    found=" ".join(words)[:200])


def _options(words: list[str]) -> list[tuple[str, str | None]]:
    """['--tp', '8', '--x=1', '--flag'] -> [('--tp', '8'), ('--x', '1'), ('--flag', None)]."""
    out, i = [], 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and "=" in w:
            out.append(tuple(w.split("=", 1)))
        elif w.startswith("-"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            takes = nxt is not None and not nxt.startswith("-")
            out.append((w, nxt if takes else None))
            i += takes
        i += 1
    return out


def _spec_model(text: str | None, flag: str) -> str | None:
    """'{"model": "org/d", "method": "eagle3"}' -> 'org/d'."""
    try:
        value = json.loads(text or "")
    except json.JSONDecodeError as err:
        raise DiagError("--speculative-config is not JSON", field=f"--launch {flag}",
                        expected='a JSON object, e.g. \'{"model": "org/drafter", "method": "eagle3"}\'',
                        found=f"{text!r} ({err})") from None
    if not isinstance(value, dict):
        raise DiagError("--speculative-config is not a JSON object", field=f"--launch {flag}",
                        expected='{"model": ..., "method": ...}', found=text)
    return value.get("model")


def launch_models(command: str) -> LaunchModels:
    """The target and drafter names in a launch line (None where it names none)."""
    try:
        words = shlex.split(command.replace("\\\n", " "))
    except ValueError as err:
        raise DiagError("launch command does not parse as a shell line", field="--launch",
                        expected="a quoted command line", found=str(err)) from None
    engine, start = _engine(words)
    rest = words[start:]
    target = drafter = None
    if engine == "vllm" and rest and not rest[0].startswith("-"):
        target, rest = ("vllm serve MODEL", rest[0]), rest[1:]
    for flag, value in _options(rest):
        if flag in _TARGET[engine] and value:
            target = (flag, value)
        elif flag in _DRAFTER[engine] and value:
            drafter = (flag, value)
        elif engine == "vllm" and flag in _SPEC_JSON and (model := _spec_model(value, flag)):
            drafter = (f'{flag} "model"', model)
    return LaunchModels(engine, target, drafter)
