"""What every lint check reads: the two configs, the drafter's tensor headers, the launch line,
and what the engine serves for them, computed once.

This module knows files and headers; it never reads a weight value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diag.engines.common import EffectiveConfig, LaunchFlags, ServingError, ServingPlan


@dataclass(frozen=True)
class Finding:
    severity: str          # "error" | "warning" | "info"
    code: str
    message: str
    behaviour: str         # what the engine (`engine`) does about it
    fix: str
    file: str | None = None
    field: str | None = None
    engine: str | None = None   # the engine version whose rules the finding applies


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str             # safetensors dtype name: "I64", "BOOL", "BF16", ...
    file: str


@dataclass(frozen=True)
class Pair:
    """Everything the checks read. `drafter` is the drafter config with speculators' layer
    config lifted to the top (checkpoint.drafter_format.flat_config); `plan` is what the engine
    serves under EAGLE3 (or why it cannot), `eagle_plan` what it serves under EAGLE."""

    drafter: dict
    target: dict
    tensors: dict[str, TensorInfo]
    drafter_file: str
    target_file: str
    flags: LaunchFlags | None
    eff: EffectiveConfig | None
    engine: str
    plan: ServingPlan | ServingError
    eagle_plan: ServingPlan | ServingError
    argv: tuple[str, ...] | None = None   # the launch line's words after the program
    raw_drafter: dict | None = None   # config.json as written; `drafter` is it flattened (speculators)

    def __post_init__(self):
        if self.raw_drafter is None:
            object.__setattr__(self, "raw_drafter", self.drafter)


def read_tensor_headers(directory: Path) -> dict[str, TensorInfo]:
    """Name -> shape/dtype for every tensor in directory/*.safetensors, from the headers
    alone (diag.checkpoint.headers checks them: a corrupt or truncated shard is an error)."""
    from diag.checkpoint.headers import tensor_infos

    return {name: TensorInfo(tuple(i.shape), i.dtype, str(i.file))
            for name, i in tensor_infos(Path(directory)).items()}


def find(tensors: dict[str, TensorInfo], suffix: str) -> tuple[str, TensorInfo] | None:
    """'fc.weight' matches 'fc.weight' or 'model.fc.weight' (first, sorted)."""
    for name in sorted(tensors):
        if name == suffix or name.endswith("." + suffix):
            return name, tensors[name]
    return None


def is_eagle3_drafter(p: Pair) -> bool:
    archs = p.drafter.get("architectures") or []
    return (any("Eagle3" in a for a in archs) or "eagle_config" in p.drafter
            or find(p.tensors, "fc.weight") is not None)


def algorithm(p: Pair) -> str:
    return (p.eff.algorithm if p.eff is not None and p.eff.algorithm else None) or "EAGLE3"


def under_eagle3(p: Pair) -> str:
    """Layout checks describe EAGLE3 serving; say so when the launch uses another algorithm."""
    return "" if algorithm(p) == "EAGLE3" else " once launched with EAGLE3"
