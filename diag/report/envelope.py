"""report.json: a versioned envelope around a run's numbers (DESIGN.md §9).

The envelope carries what a ticket reader needs to know what was run: diag's version and
git hash, torch / transformers / CUDA / GPU, the checkpoints with config hashes, the case
and its hash, the prompt set's hash, the command line. Everything the Markdown shows is in
here; the Markdown is a rendering of this dict, never a second computation.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import diag
from diag.diagnoses.hooks import sections_json
from diag.replay.evaluation import ANY

SCHEMA_VERSION = "2.7"


def git_hash() -> str | None:
    root = Path(diag.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (out.stdout.strip() + ("-dirty" if dirty else "")) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict:
    import torch
    import transformers
    info = {"python": platform.python_version(), "platform": platform.platform(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "gpus": []}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


# case keys added after hashes were published, left out of the hash at their default, so a case that does
# not use them keeps the hash (and the report.md) it had: [serving] engines, [server] sampled
LATER_KEYS = {("serving", "engines"): (), ("server", "sampled"): None}


def case_hash(case) -> str:
    spec = asdict(case)
    for (section, key), default in LATER_KEYS.items():
        if spec[section].get(key, default) == default:
            spec[section].pop(key, None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def envelope(run, argv: list[str] | None = None) -> dict:
    """The whole report.json dict for a finished run (pipeline.RunResult)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "diag-report",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "provenance": {"diag_version": diag.__version__, "git": git_hash(), "machine": machine(),
                       "command": argv if argv is not None else sys.argv},
        "case": {"name": run.case.name, "source": run.case.source, "hash": case_hash(run.case),
                 "description": run.case.description, "spec": asdict(run.case)},
        "target": run.target.to_dict(),
        "serving": _serving(run),
        "drafter": run.drafter,
        "prompts": run.prompts,
        "target_pass": run.target_pass,
        "candidates": [c.to_dict() for c in run.candidates],
        "reference": {k: (None if v is ANY else v) for k, v in run.reference.as_dict().items()},
        "decoding": _decoding(run),
        "verdicts": [v.to_json() for v in run.verdicts],
        "evaluations": [e.to_json() for e in run.evaluations],
        **sections_json(getattr(run, "diagnoses", {})),
        "timings": run.timings,
        "notes": run.notes,
        **({"engines": run.engines.to_json()} if getattr(run, "engines", None) is not None else {}),
    }


def _serving(run) -> dict:
    """The engine whose rules were applied, and the serving error it reports, if any."""
    err = run.serving_error
    return {"engine": run.case.serving.engine, "algorithm": run.case.serving.algorithm,
            "capture_convention": run.capture_convention,
            "error": None if err is None else {"message": err.message, "field": err.field,
                                               "expected": None if err.expected is None else str(err.expected),
                                               "found": None if err.found is None else str(err.found)}}


def _decoding(run) -> dict:
    """The run's decoding plan; a run built without one decoded greedily only."""
    if run.decoding is not None:
        return run.decoding.to_dict()
    from diag.engines.decoding import GREEDY
    return {"served": GREEDY.to_dict(), "sampled": [], "seeds": [], "scope": "verdicts",
            "source": "default (greedy)", "lossy": False}


def samples(run) -> list[dict]:
    """samples.jsonl rows: one per verify round a real decode visits, per variant.
    `position` is the round's root index j in prompt + continuation (the target has just
    produced token j+1); `accepted` counts draft tokens, the bonus token not included. A
    sampled variant's rows add `seed` (rounds count per seed) and `expected`, the round's
    exact E[accepted]."""
    return [row for e in run.evaluations for p in e.per_prompt for row in _prompt_rows(e.key, p)]


def _prompt_rows(variant: str, p) -> list[dict]:
    seeds = p.seeds or (None,) * len(p.accepted)
    count: dict = {}
    rows = []
    for k, (a, j, s) in enumerate(zip(p.accepted, p.roots, seeds)):
        row = {"variant": variant, "prompt": p.id, "round": count.setdefault(s, 0), "position": j,
               "accepted": a}
        count[s] += 1
        if s is not None:
            row.update(seed=s, expected=p.expected[k])
        rows.append(row)
    return rows


def samples_text(run) -> str:
    """samples.jsonl's text: json.dumps of each samples() row, one a line, the same bytes.
    A greedy prompt whose counts are all ints is formatted from one prefix per (variant,
    prompt) instead of a dict and a json.dumps per row (24 variants x 4,096 rounds: 98,000
    rows, a third of a second); any other row goes through json.dumps.
    Example row: {"variant": "embed+L2+L4/chain-3/eagle3/as-loaded", "prompt": "p0", "round": 0,
    "position": 41, "accepted": 2}"""
    lines = []
    for e in run.evaluations:
        for p in e.per_prompt:
            if p.seeds or not all(type(x) is int for x in (*p.accepted, *p.roots)):
                lines += [json.dumps(row) for row in _prompt_rows(e.key, p)]
                continue
            head = f'{{"variant": {json.dumps(e.key)}, "prompt": {json.dumps(p.id)}, "round": '
            lines += [f'{head}{k}, "position": {j}, "accepted": {a}}}'
                      for k, (a, j) in enumerate(zip(p.accepted, p.roots))]
    return "".join(line + "\n" for line in lines)

