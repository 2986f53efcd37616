"""`diag effective -- <launch command...>`: what SGLang will actually run.

Prints the effective speculative configuration of an SGLang launch line
before anything is loaded: algorithm after aliases, the tree shape after
SGLang's rewrites (or the crash it would hit), max_running_requests, and
every silent change. Reads at most the target's config.json (for the
architecture that picks SGLang's auto defaults); loads no weights.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from diag.errors import DiagError
from diag.engines import DEFAULT_ENGINE, engine, families, rules
from diag.engines.common import EffectiveConfig
from diag.checkpoint.config import read_config_json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "effective", help="print the speculative configuration a server's launch line runs",
        description="Usage: diag effective [--target DIR] [--engine RELEASE] -- <the server's launch command>")
    p.add_argument("--target", default=None,
                   help="target checkpoint directory (config.json) or hub id; default: the launch "
                        "line's --model-path when it is a local directory or a hub id")
    p.add_argument("--engine", default=None, help="the engine release the server runs, <family>-<version> "
                   f"(families: {', '.join(families())}; default: {DEFAULT_ENGINE})")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("launch", nargs=argparse.REMAINDER, help="the launch command, after --")
    p.set_defaults(func=run)


def _target_config(target: str | None, model_path: str | None) -> dict | None:
    """--target wins; else the launch's --model-path if it holds a config.json. Either may be a
    hub id (org/name[@revision]): its config.json comes from the Hugging Face cache, or the hub."""
    from diag.run.checkpoints import locate
    if target is not None:
        return read_config_json(locate(target, None, "--target", configs_only=True).path, "target")
    if model_path is None:
        return None
    try:
        where = locate(model_path, None, "--model-path", configs_only=True).path
    except DiagError as err:      # the server's path, not this machine's: say so, assume defaults
        print(f"note: --model-path {model_path}: {err.message}; its config is unknown here", file=sys.stderr)
        return None
    return read_config_json(where, "target") if (where / "config.json").is_file() else None


def describe(eff: EffectiveConfig) -> list[str]:
    """Text lines, e.g. 'tree: requested (1, 1, 16) -> runs chain-1 (S=1, K=1, D=2)'."""
    lines = [f"engine: {eff.engine} (its rules applied)", f"program: {eff.flags.program}",
             f"algorithm: {eff.flags.algorithm} -> {eff.algorithm}"]
    if eff.tree is not None:
        shape = eff.tree.shape
        ran = "none" if shape is None else (
            f"{shape.name} (S={shape.num_steps}, K={shape.topk}, D={shape.num_draft_tokens})")
        lines.append(f"tree: requested (S, K, D) = {eff.tree.requested} -> runs {ran}")
        lines.append(f"auto defaults keyed on architectures[0]: {eff.architecture}")
    lines.append(f"max_running_requests: {eff.max_running_requests}")
    lines += [f"note: {n}" for n in eff.notes]
    if eff.crash is not None:
        lines.append(f"CRASH: {eff.crash}")
    return lines


def as_dict(eff: EffectiveConfig) -> dict:
    shape = eff.tree.shape if eff.tree is not None else None
    return {
        "engine": eff.engine, "program": eff.flags.program, "algorithm_requested": eff.flags.algorithm,
        "algorithm": eff.algorithm, "architecture": eff.architecture,
        "requested": list(eff.tree.requested) if eff.tree is not None else None,
        "shape": None if shape is None else {"num_steps": shape.num_steps, "topk": shape.topk,
                                             "num_draft_tokens": shape.num_draft_tokens},
        "max_running_requests": eff.max_running_requests, "notes": list(eff.notes),
        "crash": eff.crash,
    }


def run(args) -> int:
    words = list(args.launch or [])
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        print("diag effective: give the launch command after --", file=sys.stderr)
        return 2
    try:
        rel = engine(args.engine)
        eng = rules(rel)
        flags = eng.parse_launch(words if len(words) > 1 else words[0], release=rel)
        eff = eng.effective_config(flags, _target_config(args.target, flags.model_path), release=rel)
    except DiagError as err:
        print(err.render(), file=sys.stderr)
        return 2
    print(json.dumps(as_dict(eff), indent=2) if args.json else "\n".join(describe(eff)))
    return 1 if eff.crash is not None else 0
