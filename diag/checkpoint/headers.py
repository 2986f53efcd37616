"""Safetensors checkpoints on disk: which tensor lives in which shard, with
headers checked before any tensor is read.

A shard is `u64 little-endian N | N bytes of JSON header | data`; every
tensor's `data_offsets` [begin, end) are relative to the data section, so a
shard is whole when 8 + N + max(end) <= file size.
Example: N = 120 and the last tensor ends at 4096 -> the file needs
8 + 120 + 4096 = 4224 bytes; 4000 bytes means the shard was truncated.

This module knows files and headers; it knows nothing about models or
quantization.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from diag.errors import DiagError
from diag.checkpoint.readable import require_readable

INDEX = "model.safetensors.index.json"
_MAX_HEADER = 100 * 2**20  # safetensors refuses larger headers too


TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                "BOOL": torch.bool}                  # safetensors' dtype spelling -> torch's


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and what its header says."""

    name: str
    file: Path
    dtype: str  # safetensors spelling: "BF16", "I32", ...
    shape: tuple[int, ...]
    offset: int = -1  # absolute byte offset of the data in the file (8 + N + begin)
    nbytes: int = 0   # end - begin


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check one shard's header; DiagError if corrupt or truncated."""
    size = require_readable(path, "safetensors shard").stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if n < 2 or n > min(size - 8, _MAX_HEADER):
            raise DiagError("corrupt safetensors header", file=str(path),
                            expected=f"a header length below the file size ({size} bytes)",
                            found=f"header length {n}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DiagError("corrupt safetensors header", file=str(path),
                        expected="a JSON header", found=str(err)) from None
    return _infos(header, path, data_bytes=size - 8 - n, data_start=8 + n)


def _infos(header: dict, path: Path, *, data_bytes: int, data_start: int = 0) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = meta["data_offsets"]
            info = TensorInfo(name, path, meta["dtype"], tuple(meta["shape"]),
                              data_start + int(begin), int(end) - int(begin))
        except (KeyError, TypeError, ValueError):
            raise DiagError("corrupt safetensors header", file=str(path), field=name,
                            expected="dtype, shape and data_offsets", found=meta) from None
        if end > data_bytes or begin > end:
            raise DiagError("truncated safetensors shard: a tensor ends past the end of the file",
                            file=str(path), field=name,
                            expected=f"data up to byte {end}", found=f"{data_bytes} data bytes")
        _check_extent(info, end - begin)
        out[name] = info
    return out


# Bytes per element of each safetensors dtype; a tensor's data range must hold exactly
# numel x size bytes. Example: BF16 [128, 384] -> 98304 bytes.
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
                "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def _check_extent(info: TensorInfo, nbytes: int) -> None:
    """A tensor's byte range fits its dtype and shape (sub-byte dtypes such as F4 unchecked)."""
    size = _DTYPE_BYTES.get(info.dtype)
    if size is None:
        return
    numel = 1
    for d in info.shape:
        numel *= d
    if nbytes != numel * size:
        raise DiagError("corrupt safetensors header: a tensor's byte range does not fit its dtype and "
                        "shape", file=str(info.file), field=info.name,
                        expected=f"{numel} x {size} bytes ({info.dtype} {list(info.shape)})",
                        found=f"{nbytes} bytes")


def shard_files(directory: Path) -> list[Path]:
    """The shards of a checkpoint: from the index if there is one, else every
    *.safetensors file in the directory."""
    index = directory / INDEX
    if index.exists():
        weight_map = _weight_map(index)
        names = sorted(set(weight_map.values()))
        for n in names:
            if not (directory / n).exists():
                raise DiagError("a shard named by the index is missing", file=str(index),
                                field=n, expected="the file to exist", found="no such file")
        check_one_weight_set(directory)
        return [directory / n for n in names]
    check_one_weight_set(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise DiagError("no safetensors weights in the checkpoint", file=str(directory),
                        expected="model.safetensors or an index with shards", found="none")
    return files


def check_one_weight_set(directory: Path) -> None:
    """One checkpoint per directory: two safetensors indexes, or an index beside a *.safetensors
    file it does not list (a stale model.safetensors from an earlier export), are two weight
    sets, and which one an engine loads is up to the engine. Example: model.safetensors.index.json
    listing model-0000{1,2}-of-00002.safetensors plus model.safetensors -> DiagError naming both."""
    indexes = sorted(p.name for p in directory.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise DiagError("two weight sets in one checkpoint directory: two safetensors indexes",
                        file=str(directory), field=" and ".join(indexes),
                        expected="one index with its shards (or *.safetensors without an index)",
                        found=", ".join(indexes), hint="move the weight set you do not mean out of the directory")
    if not indexes:
        return
    listed = set(_weight_map(directory / indexes[0]).values())
    stale = sorted(p.name for p in directory.glob("*.safetensors") if p.name not in listed)
    if stale:
        raise DiagError("two weight sets in one checkpoint directory: safetensors files the index "
                        "does not list", file=str(directory), field=f"{indexes[0]} and {', '.join(stale)}",
                        expected=f"only the shards {indexes[0]} lists ({len(listed)} files)",
                        found=f"also {', '.join(stale)}",
                        hint="move the weight set you do not mean out of the directory")


def _weight_map(index: Path) -> dict[str, str]:
    try:
        return dict(json.loads(index.read_text())["weight_map"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise DiagError("unreadable safetensors index", file=str(index),
                        expected="JSON with a weight_map", found=str(err)) from None


def tensor_infos(directory: Path) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint, headers checked, index cross-checked."""
    infos: dict[str, TensorInfo] = {}
    for f in shard_files(directory):
        for name, info in read_header(f).items():
            if name in infos:
                raise DiagError("a tensor appears in two shards", file=str(f), field=name,
                                expected="one shard per tensor", found=str(infos[name].file))
            infos[name] = info
    index = directory / INDEX
    if index.exists():
        _check_index(_weight_map(index), infos, index)
    return infos


def _check_index(weight_map: dict[str, str], infos: dict[str, TensorInfo], index: Path) -> None:
    for name, shard in weight_map.items():
        if name not in infos or infos[name].file.name != shard:
            raise DiagError("the index names a tensor its shard does not hold", file=str(index),
                            field=name, expected=f"in {shard}",
                            found=infos[name].file.name if name in infos else "in no shard")


def load_shard(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one shard, after its header is checked."""
    names = read_header(path)
    with safe_open(str(path), framework="pt") as f:
        return {n: f.get_tensor(n) for n in names}
