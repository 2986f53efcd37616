"""On-disk cache of target passes, keyed by content and checked on every read (DESIGN.md §8).

The key hashes what decides the pass's numbers:
  the checkpoint's content: the digest (identity.py: xxh3-128 over 64 MiB chunks) of every weight, config and tokenizer file
    (identity.py; memoised per file by its stat, so a second run reads no weight bytes);
  the exact token ids replayed: every prompt after tokenization and chat template, the
    recorded continuations, the eos and pad ids;
  the regime, the capture points, max_new_tokens, the dtype, the placement, and the
    torch / transformers versions and diag's capture version.
A retrained model with the same shapes, NaN-corrupted weights, or another tokenizer all
change the key, so none of them can be answered from another run's pass.

Each entry is one safetensors file whose metadata carries the key, the sequences and a
sha256 over every tensor's bytes; `load_pass` recomputes that digest and treats any
mismatch, a torn file or a foreign key as a miss, with a note saying why (the pipeline then
recomputes and rewrites the entry). Writes go to a temporary file renamed into place, so an
interrupt never leaves a corrupt entry under the key's name.

Location: $DIAG_CACHE_DIR/passes (default ~/.cache/diag/passes). This module knows files
and hashes; it knows nothing about models.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from diag.checkpoint.identity import cache_root, checkpoint_identity
from diag.layouts import CapturePoint
from diag.target.passes import Sequence, TargetPass

CAPTURE_VERSION = 2
FORMAT = "diag-target-pass-v2"


def token_digest(prompts: list[tuple[str, str, list[int]]], recorded: dict | None,
                 eos_ids: set[int], pad_id: int) -> str:
    """sha256 of exactly what the target is fed: (id, category, token ids) per prompt, the
    recorded continuations and the special ids that end and pad them."""
    blob = {"prompts": [[pid, cat, list(ids)] for pid, cat, ids in prompts],
            "recorded": recorded, "eos": sorted(eos_ids), "pad": pad_id}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class PassKey:
    fields: tuple[tuple[str, str], ...]

    @classmethod
    def make(cls, tpath: Path, tokens_sha: str, regime: str, points: tuple[CapturePoint, ...],
             max_new_tokens: int, dtype: str, placement: str = "cpu") -> "PassKey":
        import transformers
        return cls((("checkpoint", checkpoint_identity(Path(tpath))), ("tokens", tokens_sha),
                    ("regime", regime), ("points", ",".join(sorted(p.name for p in points))),
                    ("max_new_tokens", str(max_new_tokens)), ("dtype", dtype),
                    ("placement", placement), ("torch", torch.__version__),
                    ("transformers", transformers.__version__),
                    ("capture_version", str(CAPTURE_VERSION))))

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fields).encode()).hexdigest()[:24]

    @property
    def file(self) -> Path:
        return cache_root() / "passes" / f"{self.digest}.safetensors"


def _tensors(tp: TargetPass) -> dict[str, torch.Tensor]:
    out = {}
    for i, seq in enumerate(tp.sequences):
        out[f"ids.{i}"] = seq.ids
        out[f"argmax.{i}"] = tp.argmax[i]
        for name, states in tp.states.items():
            out[f"state.{name}.{i}"] = states[i]
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def content_digest(tensors: dict[str, torch.Tensor], meta: str) -> str:
    """sha256 over the metadata and, in key order, each tensor's name, dtype, shape, bytes."""
    h = hashlib.sha256(meta.encode())
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        h.update(f"{k}|{t.dtype}|{list(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_pass(key: PassKey, tp: TargetPass) -> Path:
    from safetensors.torch import save_file

    tensors = _tensors(tp)
    meta = json.dumps({"format": FORMAT, "key": key.fields, "regime": tp.regime,
                       "points": list(tp.states),
                       "sequences": [[s.prompt_id, s.category, s.prompt_len, s.end] for s in tp.sequences]})
    key.file.parent.mkdir(parents=True, exist_ok=True)
    tmp = key.file.with_name(f"{key.file.stem}.tmp{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata={"diag": meta, "sha256": content_digest(tensors, meta)})
        os.replace(tmp, key.file)
    except BaseException:                 # an interrupt or a full disk leaves no half-written file
        tmp.unlink(missing_ok=True)
        raise
    return key.file


def read_checked(path: Path, redo: str) -> tuple[dict | None, dict | None, str | None]:
    """(meta, tensors, None) of a cache entry written with content_digest in its header (this
    module's passes, run/eval_cache.py's evaluations); (None, None, why) when it is torn,
    unreadable or its bytes disagree with its digest, `redo` naming what happens instead
    ("recomputed"); (None, None, None) when there is none."""
    if not path.is_file():
        return None, None, None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        meta = json.loads(header["diag"])
    except Exception as err:  # a torn or foreign file is a miss with a reason, never an answer
        return None, None, f"cache entry {path.name} is unreadable ({type(err).__name__}); {redo}"
    if content_digest(tensors, header["diag"]) != header.get("sha256"):
        return None, None, f"cache entry {path.name} failed its integrity check (sha256 mismatch); {redo}"
    return meta, tensors, None


def load_pass(key: PassKey) -> tuple[TargetPass | None, str | None]:
    """(the cached pass, None), or (None, why it is not usable) when the entry fails its
    integrity check or was written under another key; (None, None) when there is none."""
    meta, tensors, why = read_checked(key.file, "recomputed")
    if meta is None:
        return None, why
    if meta.get("format") != FORMAT or tuple(tuple(f) for f in meta.get("key", ())) != key.fields:
        return None, f"cache entry {key.file.name} was written under another key; recomputed"
    return _from_tensors(meta, tensors), None


def _from_tensors(meta: dict, tensors: dict[str, torch.Tensor]) -> TargetPass:
    seqs = [Sequence(row[0], row[1], int(row[2]), tensors[f"ids.{i}"], row[3] if len(row) > 3 else None)
            for i, row in enumerate(meta["sequences"])]      # [id, category, prompt_len, end]
    n = len(seqs)
    states = {p: [tensors[f"state.{p}.{i}"] for i in range(n)] for p in meta["points"]}
    return TargetPass(meta["regime"], seqs, states, [tensors[f"argmax.{i}"] for i in range(n)],
                      cached=True)
