"""The digest memo: one small JSON record per file under <cache>/digests, and the checks a
record must pass before its digest is believed.

A record holds the file's stat (identity.stat_key), the digest version and digest, a spot
check of the file's bytes (`probe`: xxh3-128 of up to 256 KiB at its start, middle and end,
the safetensors header included), and `check`, an xxh3-128 of all the other fields.
Worked example, a 10 GB shard: probe bytes [0, 256Ki), [5e9 - 128Ki, 5e9 + 128Ki),
[1e10 - 256Ki, 1e10): 768 KiB read on a repeat run instead of 10 GB.

lookup() answers the digest only when
  the stat is the file's now          else None, quietly: the file changed, it is hashed again
  the record is whole and its check   else a note "damaged", None
  holds
  the version is the reader's         else a note "written by another diag version", None
  the probe matches the file's bytes  else a note "the bytes disagree with the digest
                                      memoised under the same stat", None
so a digest that disagrees with the file, or one from another version, is recomputed with a
note, never answered. write() goes through a temporary file renamed into place (an interrupt
leaves the old record or the new one, never half of one), and notes when it replaces a record
of the same stat and version holding another digest (the bytes changed under an unchanged
stat: found by a reader that hashed the whole file anyway).
This module knows JSON records and a few bytes of a file; nothing about models.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import xxhash

PROBE = 256 << 10
_notes: list[str] = []
_lock = threading.Lock()


def _note(text: str) -> None:
    with _lock:
        if text not in _notes:
            _notes.append(text)


def drain_notes() -> list[str]:
    with _lock:
        out = list(_notes)
        _notes.clear()
    return out


def record_file(root: Path, stat: dict) -> Path:
    return root / "digests" / (hashlib.sha256(stat["path"].encode()).hexdigest()[:32] + ".json")


def probe(path: Path, size: int) -> str:
    """xxh3-128 of up to PROBE bytes at the start, the middle and the end of the file."""
    spans = sorted({(0, min(size, PROBE)), (max(0, size // 2 - PROBE // 2), min(size, size // 2 + PROBE // 2)),
                    (max(0, size - PROBE), size)})
    h = xxhash.xxh3_128(f"{size}\0".encode())
    with open(path, "rb") as fh:
        for a, b in spans:
            fh.seek(a)
            h.update(fh.read(b - a))
    return h.hexdigest()


def _check(fields: dict) -> str:
    return xxhash.xxh3_128(json.dumps({k: v for k, v in fields.items() if k != "check"},
                                      sort_keys=True).encode()).hexdigest()


def _read(root: Path, stat: dict) -> dict | None:
    try:
        return json.loads(record_file(root, stat).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}                       # present but unreadable: damaged


def lookup(root: Path, path: Path, stat: dict, version: str) -> str | None:
    rec = _read(root, stat)
    if rec is None:
        return None
    name = record_file(root, stat).name
    if not isinstance(rec, dict) or {k: rec.get(k) for k in stat} != stat:
        if isinstance(rec, dict) and rec:
            return None                 # the file changed since: an ordinary miss
        _note(f"{path}: its digest memo {name} is damaged (not a JSON record); hashed again")
        return None
    if rec.get("version") != version:
        found = rec.get("version") or ("sha256" if "sha256" in rec else "no version")
        _note(f"{path}: its digest memo was written by another diag version (digest {found}, this "
              f"one uses {version}); hashed again")
        return None
    if rec.get("check") != _check(rec) or not isinstance(rec.get("digest"), str):
        _note(f"{path}: its digest memo {name} is damaged (its check does not match its fields); "
              "hashed again")
        return None
    try:
        same = probe(path, stat["size"]) == rec.get("probe")
    except OSError:
        return None
    if not same:
        _note(f"{path}: its bytes disagree with the digest memoised under the same stat (size "
              f"{stat['size']}, mtime_ns {stat['mtime_ns']}, ctime_ns {stat['ctime_ns']}): the file "
              "changed in a way its stat does not show (a restored backup, a raw write?); hashed again")
        return None
    return rec["digest"]


def write(root: Path, path: Path, stat: dict, version: str, digest: str) -> bool:
    """Record `digest` for the file as of `stat` (the caller checked the stat is current);
    False when the cache cannot be written (a re-hash later, never a failed run)."""
    old = _read(root, stat)
    if (isinstance(old, dict) and old.get("version") == version and old.get("digest") not in (None, digest)
            and {k: old.get(k) for k in stat} == stat):
        _note(f"{path}: hashed in full, its bytes disagree with the digest memoised under the same "
              f"stat ({old['digest'][:12]}.. memoised, {digest[:12]}.. now); the memo is replaced")
    try:
        rec = {**stat, "version": version, "digest": digest, "probe": probe(path, stat["size"])}
    except OSError:
        return False
    rec["check"] = _check(rec)
    target = record_file(root, stat)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp{os.getpid()}.{threading.get_ident()}")
        try:
            tmp.write_text(json.dumps(rec))
            os.replace(tmp, target)
        except BaseException:         # an interrupt leaves no half-written record
            tmp.unlink(missing_ok=True)
            raise
    except OSError:
        return False
    return True
