"""Targets kept loaded between runs of one process: `diag run --watch` (the case edited and run
again), the GPU bench's repeat runs, any caller of run_case inside `kept()`.

Inside `with kept():` a run that would load a checkpoint takes the model an earlier run of the
same block loaded, when nothing that decides its weights changed (`Key`): the files (stat_key of
config.json and of every weight file, so a shard rewritten in place loads again), the dtype, the
regime (a quantizer rewrites the weights), the placement (the device map) and the engine
numerics (patched layers). At most `capacity` models are held, one by default (Kimi fills 8
GPUs): taking another drops the oldest first, so two never sit in memory at once. Outside the
block every run loads its own model and frees it, as before.

The block also holds what a run reads besides the target's weights and would read again
unchanged: the drafter (its files, dtype and device: `PartKey`) and the target's tokenizer
(every file of its folder but the weights). On the H100 bench a further variant's checks spent
0.73 s reading those two (Kimi's 163,840-token tokenizer 0.46 s, the drafter 0.24 s) of its 3.0 s
outside the decode loop. They do not count against `capacity`, and a run reads them again when
any of their files changed.

Worked example: run 1 loads /ckpt as-loaded, bf16, gpus=1, transformers numerics (40 s) and the
block holds it; the user adds a layout to the case; run 2 asks for the same Key and takes the held
model (0 s; the run's timings say target_kept 1). Run 3's case adds the regime w4a16-g128: its
as-loaded pass is cached, so only the w4a16 model is asked for, and with capacity 1 the held
as-loaded model is dropped before the w4a16 one loads.
This module knows files' stats and models' lifetimes; nothing about cases or runs.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from diag.checkpoint.identity import stat_key

WEIGHT_GLOBS = ("config.json", "*.safetensors", "*.safetensors.index.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")   # not a tokenizer's files


@dataclass(frozen=True)
class Key:
    """What decides a loaded model's weights, as plain strings."""
    files: tuple[str, ...]         # repr(stat_key) of config.json and each weight file, sorted
    dtype: str
    regime: str
    placement: str                 # repr of the device map
    numerics: str

    @classmethod
    def make(cls, checkpoint: Path, dtype, regime: str, placement, numerics: str) -> "Key":
        return cls(_stats(_weight_files(checkpoint)), str(dtype), regime, repr(placement), numerics)


def _weight_files(folder: Path) -> set[Path]:
    return {p for g in WEIGHT_GLOBS for p in Path(folder).glob(g)}


def _stats(paths) -> tuple[str, ...]:
    """repr(stat_key) of each path, sorted."""
    return tuple(repr(sorted(stat_key(p).items())) for p in sorted(paths))


@dataclass(frozen=True)
class PartKey:
    """What decides a drafter or a tokenizer read from `folder`: its kind, the files' stats and
    how it was read (dtype, device, options), as plain strings."""
    kind: str
    files: tuple[str, ...]
    how: str

    @classmethod
    def drafter(cls, folder: Path, dtype, device) -> "PartKey":
        return cls("drafter", _stats(_weight_files(folder)), f"{dtype} {device}")

    @classmethod
    def tokenizer(cls, folder: Path, **how) -> "PartKey":
        files = [p for p in Path(folder).iterdir() if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES)
                 and not p.name.endswith(".index.json")]
        return cls("tokenizer", _stats(files), repr(sorted(how.items())))


class Held:
    """Up to `capacity` models by Key, oldest first; drafters and tokenizers by PartKey."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity, self.models = capacity, OrderedDict()
        self.parts: dict[PartKey, object] = {}
        self.taken = self.loaded = 0

    def part(self, key: PartKey, load: Callable[[], object]) -> tuple[object, bool]:
        """(the drafter or tokenizer, whether it was already held); one of a kind at a time: a
        changed file replaces the one held."""
        if key in self.parts:
            return self.parts[key], True
        for old in [k for k in self.parts if k.kind == key.kind]:
            del self.parts[old]
        self.parts[key] = got = load()
        return got, False

    def take(self, key: Key, load: Callable[[], object]) -> tuple[object, bool]:
        """(the model, whether it was already held); a miss makes room before it loads."""
        if key in self.models:
            self.models.move_to_end(key)
            self.taken += 1
            return self.models[key], True
        while len(self.models) >= self.capacity:
            self.models.popitem(last=False)
            _release()
        model = load()
        self.models[key] = model
        self.loaded += 1
        return model, False

    def clear(self) -> None:
        self.models.clear()
        self.parts.clear()
        _release()


def _release() -> None:
    """Free what a dropped model held before another is read."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


_HELD: list[Held] = []               # the innermost kept() block's, if any


def current() -> Held | None:
    return _HELD[-1] if _HELD else None


def part(key: Callable[[], PartKey], load: Callable[[], object]) -> tuple[object, bool]:
    """(a drafter or tokenizer, whether a kept() block already held it): from the innermost block
    where one is open (held there for the next run), else load() (the key never computed)."""
    held = current()
    return held.part(key(), load) if held is not None else (load(), False)


@contextmanager
def using(held: Held) -> Iterator[Held]:
    """Runs inside take from and add to `held`; it outlives the block (the pytest plugin's
    session holds one, used only around its own runs)."""
    _HELD.append(held)
    try:
        yield held
    finally:
        _HELD.remove(held)


@contextmanager
def kept(capacity: int = 1) -> Iterator[Held]:
    """Runs inside share their loaded targets; every model is dropped when the block ends."""
    held = Held(capacity)
    try:
        with using(held):
            yield held
    finally:
        held.clear()
