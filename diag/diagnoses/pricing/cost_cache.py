"""Step costs measured on this machine, remembered beside the target passes, so a run whose
passes all come from the cache (and loads no target) still prices its trees (DESIGN.md §6, §8).

The key hashes what decides the numbers: the target's and the drafter's content (checkpoint
identity), the regime the costs were measured under, both dtypes, the placement, the context,
the num_draft_tokens measured, the machine (platform, processor, CPU threads, GPU names) and
the torch version. Costs from another machine, build or checkpoint never answer.
Entry: $DIAG_CACHE_DIR/costs/<digest>.json =
    {"format": "diag-step-costs-v1", "key": [[name, value], ...], "measured": ISO time,
     "costs": StepCosts.to_dict(), "spread": {...}, "repeats": N}
A missing, unreadable or foreign entry is a miss (the report then says the costs were not
measured). Writes go through a temporary file renamed into place. This module knows files
and hashes; it measures nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from diag.checkpoint.identity import cache_root, checkpoint_identity
from diag.errors import DiagError
from diag.diagnoses.pricing.costs import MeasuredCosts
from diag.diagnoses.pricing.model import StepCosts

FORMAT = "diag-step-costs-v2"


def _machine() -> str:
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return json.dumps([platform.platform(), platform.processor(), os.cpu_count(), torch.get_num_threads(), gpus])


@dataclass(frozen=True)
class CostKey:
    fields: tuple[tuple[str, str], ...]

    @classmethod
    def make(cls, target: Path, drafter: Path, regime: str, dtypes: str, placement: str, context: int,
             draft_tokens: list[int]) -> "CostKey":
        return cls((("target", checkpoint_identity(Path(target))), ("drafter", checkpoint_identity(Path(drafter))),
                    ("regime", regime), ("dtypes", dtypes), ("placement", placement), ("context", str(context)),
                    ("num_draft_tokens", ",".join(map(str, sorted(set(draft_tokens))))),
                    ("machine", _machine()), ("torch", torch.__version__), ("format", FORMAT)))

    @property
    def file(self) -> Path:
        digest = hashlib.sha256(json.dumps(self.fields).encode()).hexdigest()[:24]
        return cache_root() / "costs" / f"{digest}.json"


def save_costs(key: CostKey, measured: MeasuredCosts) -> Path:
    entry = {"format": FORMAT, "key": key.fields, "costs": measured.costs.to_dict(),
             "spread": measured.spread, "repeats": measured.repeats,
             "measured": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    key.file.parent.mkdir(parents=True, exist_ok=True)
    tmp = key.file.with_name(f"{key.file.stem}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(entry, indent=1) + "\n")
        os.replace(tmp, key.file)
    except BaseException:                 # an interrupt or a full disk leaves no half-written entry
        tmp.unlink(missing_ok=True)
        raise
    return key.file


def load_costs(key: CostKey) -> tuple[MeasuredCosts, str] | None:
    """(costs with their spread, when they were measured) from an earlier run, or None."""
    try:
        entry = json.loads(key.file.read_text())
        if entry.get("format") != FORMAT or tuple(tuple(f) for f in entry.get("key", ())) != key.fields:
            return None
        costs = MeasuredCosts(StepCosts.from_dict(entry["costs"]), dict(entry["spread"]), int(entry["repeats"]))
        return costs, str(entry["measured"])
    except (OSError, ValueError, KeyError, TypeError, DiagError):
        return None
