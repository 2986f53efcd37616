"""On-disk cache of target passes, keyed by content (DESIGN.md §8).

The key hashes: the checkpoint's identity (config.json bytes, and every safetensors file's
name, size and header bytes: the header holds every tensor's name, dtype, shape and
offsets, so a changed weight file changes it without reading hundreds of GB), the prompt
set's hash, the regime, the capture points, max_new_tokens, the recorded continuation's
hash, the dtype and diag's capture version. A second run with other layouts, trees or
drafters reuses the pass and the report says so.

Location: $DIAG_CACHE_DIR/passes (default ~/.cache/diag/passes). This module knows files
and hashes; it knows nothing about models.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from diag.layouts import CapturePoint
from diag.target_pass import Sequence, TargetPass

CAPTURE_VERSION = 1


def cache_root() -> Path:
    return Path(os.environ.get("DIAG_CACHE_DIR", Path.home() / ".cache" / "diag"))


def checkpoint_identity(path: Path) -> str:
    h = hashlib.sha256((path / "config.json").read_bytes())
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            raw = fh.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0
            h.update(f.name.encode() + str(f.stat().st_size).encode() + fh.read(min(n, 1 << 28)))
    return h.hexdigest()


@dataclass(frozen=True)
class PassKey:
    fields: tuple[tuple[str, str], ...]

    @classmethod
    def make(cls, tpath: Path, prompt_sha: str, regime: str, points: tuple[CapturePoint, ...],
             max_new_tokens: int, recorded_sha: str | None, dtype: str) -> "PassKey":
        return cls((("checkpoint", checkpoint_identity(Path(tpath))), ("prompts", prompt_sha),
                    ("regime", regime), ("points", ",".join(sorted(p.name for p in points))),
                    ("max_new_tokens", str(max_new_tokens)), ("recorded", str(recorded_sha)),
                    ("dtype", dtype), ("capture_version", str(CAPTURE_VERSION))))

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fields).encode()).hexdigest()[:24]

    @property
    def file(self) -> Path:
        return cache_root() / "passes" / f"{self.digest}.pt"


def save_pass(key: PassKey, tp: TargetPass) -> Path:
    blob = {"key": key.fields, "regime": tp.regime, "states": tp.states, "argmax": tp.argmax,
            "sequences": [(s.prompt_id, s.category, s.prompt_len, s.ids) for s in tp.sequences]}
    key.file.parent.mkdir(parents=True, exist_ok=True)
    tmp = key.file.with_suffix(f".tmp{os.getpid()}")
    torch.save(blob, tmp)
    os.replace(tmp, key.file)
    return key.file


def load_pass(key: PassKey) -> TargetPass | None:
    """The cached pass, or None when absent or written under another key."""
    if not key.file.is_file():
        return None
    try:
        blob = torch.load(key.file, weights_only=True)
    except Exception:  # a torn or foreign file is a cache miss, never an answer
        return None
    if tuple(tuple(f) for f in blob.get("key", ())) != key.fields:
        return None
    seqs = [Sequence(pid, cat, int(pl), ids) for pid, cat, pl, ids in blob["sequences"]]
    return TargetPass(blob["regime"], seqs, blob["states"], blob["argmax"], cached=True)
