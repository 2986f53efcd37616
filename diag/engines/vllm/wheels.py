"""Single files out of vLLM's released wheels, read with HTTP range requests; no whole wheel.

A vLLM wheel is ~240-400 MB and ~40 releases have EAGLE-3, but diag needs a dozen Python
files of each. A wheel is a zip whose central directory sits at its end, so one file costs
three ranged GETs (all byte offsets from the start of the wheel):
    1. the last 64 KiB + 22 bytes -> the End Of Central Directory record (EOCD, "PK\\x05\\x06"):
       entries, directory size, directory offset (ZIP64 locator "PK\\x06\\x07" when they
       overflow 32 bits);
    2. the central directory (~0.6 MB for vllm 0.34.0: 2,400 entries) -> per member its
       method, CRC-32, compressed size and local-header offset;
    3. local header (30 bytes + name + extra) + the compressed data -> inflate (zlib, wbits
       -15: raw deflate) -> check the CRC-32.
Worked example, vllm 0.34.0 x86_64 (239,039,932 bytes): step 1 asks `Range: bytes=-65558`.

    release_files("0.34.0")   -> RemoteWheel(url, size) of the x86_64 Linux wheel (PyPI JSON)
    read("0.34.0", "vllm/v1/sample/rejection_sampler.py") -> bytes, cached at
        $DIAG_CACHE_DIR/vllm-wheels/0.34.0/vllm/v1/sample/rejection_sampler.py
    read(..., a path the wheel lacks) -> None (a fact about that release, not an error)
    releases() -> every vLLM version on PyPI, oldest first (https://pypi.org/pypi/vllm/json)

Cache writes go to a temporary file renamed into place: concurrent readers see nothing or the
whole file. A member the wheel lacks is remembered as an empty `<path>.absent` marker.
Errors (unknown release, no network, a server that ignores Range, a corrupt member) are
DiagErrors naming the URL. This module knows HTTP, zip and the cache; nothing about what vLLM's
files say.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from diag.checkpoint.identity import cache_root
from diag.errors import DiagError

INDEX = os.environ.get("DIAG_VLLM_INDEX", "https://pypi.org/pypi")
_EOCD, _EOCD64_LOC, _CDIR, _LOCAL = b"PK\x05\x06", b"PK\x06\x07", b"PK\x01\x02", b"PK\x03\x04"
_TAIL = 65536 + 22                     # the EOCD's comment is at most 65535 bytes
_TIMEOUT = 60


@dataclass(frozen=True)
class RemoteWheel:
    version: str
    url: str
    size: int


@dataclass(frozen=True)
class Member:
    name: str
    method: int          # 0 stored, 8 deflate
    crc: int
    csize: int
    usize: int
    offset: int          # of the local header


def wheel_cache() -> Path:
    """$DIAG_CACHE_DIR/vllm-wheels (or ~/.cache/diag/vllm-wheels)."""
    return cache_root() / "vllm-wheels"


def _get(url: str, byte_range: str | None = None) -> bytes:
    """GET url (with `Range: bytes=...`), two retries; a DiagError naming the URL on failure."""
    headers = {"Range": f"bytes={byte_range}"} if byte_range else {}
    last: Exception | None = None
    for _ in range(3):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=_TIMEOUT) as r:
                if byte_range and r.status != 206:
                    raise DiagError("the wheel server ignores HTTP range requests", file=url,
                                    field="Range", expected="206 Partial Content", found=r.status)
                return r.read()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                raise DiagError("the package index has no such file", file=url, expected="HTTP 200",
                                found="404 Not Found") from None
            last = err
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
            last = err
    raise DiagError("cannot reach the package index", file=url, expected="an HTTPS answer",
                    found=f"{type(last).__name__}: {last}",
                    hint="reading vLLM's rules from its wheels needs pypi.org and files.pythonhosted.org "
                         "(or DIAG_VLLM_INDEX); once read, files are cached under " + str(wheel_cache()))


@lru_cache(maxsize=1)
def _project() -> dict:
    """PyPI's JSON for the vllm project (every release and its files), once per process."""
    return json.loads(_get(f"{INDEX}/vllm/json"))


def releases() -> tuple[str, ...]:
    """Every vLLM version on PyPI with a file, oldest first."""
    from packaging.version import Version
    return tuple(sorted((v for v, files in _project()["releases"].items() if files), key=Version))


def has_wheel(version: str) -> bool:
    """Whether PyPI has a .whl for this version (the oldest releases ship only sdists)."""
    return any(f["filename"].endswith(".whl") for f in _project()["releases"].get(version, []))


def _pick(version: str, files: list[dict], base: str) -> RemoteWheel:
    """The x86_64 Linux wheel (any Python tag: the .py files are the same in each)."""
    wheels = [f for f in files if f["filename"].endswith(".whl") and "x86_64" in f["filename"]] or \
             [f for f in files if f["filename"].endswith(".whl")]
    if not wheels:
        raise DiagError(f"vLLM {version} has no wheel on PyPI", file=base, field="urls",
                        expected="a .whl", found=[f["filename"] for f in files])
    best = sorted(wheels, key=lambda f: f["filename"])[0]
    return RemoteWheel(version, urllib.parse.urljoin(base, best["url"]), int(best["size"]))


@lru_cache(maxsize=None)
def release_files(version: str) -> RemoteWheel:
    """The version's wheel on PyPI; cached as <cache>/<version>/.wheel.json."""
    note = wheel_cache() / version / ".wheel.json"
    if note.is_file():
        d = json.loads(note.read_text())
        return RemoteWheel(version, d["url"], d["size"])
    base = f"{INDEX}/vllm/json"
    files = _project()["releases"].get(version)
    if not files:
        raise DiagError("unknown vLLM release", field="engine", expected="a version of vllm on PyPI "
                        "(https://pypi.org/project/vllm/#history), e.g. 0.34.0", found=repr(version))
    found = _pick(version, files, base)
    _write(note, json.dumps({"url": found.url, "size": found.size}).encode())
    return found


def _write(path: Path, data: bytes) -> None:
    """Atomic write: a temporary file in the same folder, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _directory_bytes(wheel: RemoteWheel) -> bytes:
    """The central directory's raw bytes (steps 1-2), cached as <cache>/<version>/.central-directory."""
    cached = wheel_cache() / wheel.version / ".central-directory"
    if cached.is_file():
        return cached.read_bytes()
    tail = _get(wheel.url, f"-{min(_TAIL, wheel.size)}")
    at = tail.rfind(_EOCD)
    if at < 0:
        raise DiagError("not a zip file: no End Of Central Directory record", file=wheel.url,
                        expected="PK\\x05\\x06 in the last 64 KiB", found="absent")
    entries, size, offset = struct.unpack_from("<HII", tail, at + 10)
    if offset == 0xFFFFFFFF or size == 0xFFFFFFFF or entries == 0xFFFF:
        loc = tail.rfind(_EOCD64_LOC, 0, at)
        (rec,) = struct.unpack_from("<Q", tail, loc + 8)
        head = _get(wheel.url, f"{rec}-{rec + 55}")
        size, offset = struct.unpack_from("<QQ", head, 40)
    data = _get(wheel.url, f"{offset}-{offset + size - 1}")
    _write(cached, data)
    return data


@lru_cache(maxsize=None)
def directory(version: str) -> dict[str, Member]:
    """{member name: Member} of the version's wheel."""
    data, out, i = _directory_bytes(release_files(version)), {}, 0
    while data[i:i + 4] == _CDIR:
        (_, _, _, flags, method, _, _, crc, csize, usize, n, e, c, _, _, _, off) = \
            struct.unpack_from("<4s4H2H3I5HII", data, i)
        name = data[i + 46:i + 46 + n].decode("utf-8" if flags & 0x800 else "cp437")
        if 0xFFFFFFFF in (csize, usize, off):
            csize, usize, off = _zip64_sizes(data[i + 46 + n:i + 46 + n + e], csize, usize, off)
        out[name] = Member(name, method, crc, csize, usize, off)
        i += 46 + n + e + c
    return out


def _zip64_sizes(extra: bytes, csize: int, usize: int, off: int) -> tuple[int, int, int]:
    """The ZIP64 extra field (id 0x0001) holds the overflowed fields in order usize, csize, offset."""
    j = 0
    while j + 4 <= len(extra):
        hid, hlen = struct.unpack_from("<HH", extra, j)
        if hid == 1:
            vals, k = list(struct.unpack_from(f"<{hlen // 8}Q", extra, j + 4)), 0
            if usize == 0xFFFFFFFF:
                usize, k = vals[k], k + 1
            if csize == 0xFFFFFFFF:
                csize, k = vals[k], k + 1
            if off == 0xFFFFFFFF:
                off = vals[k]
        j += 4 + hlen
    return csize, usize, off


def _extract(wheel: RemoteWheel, m: Member) -> bytes:
    """Step 3: local header + data, inflated and CRC-checked."""
    # Ask for the header, the name, up to 1 KiB of extra field and the data in one request.
    blob = _get(wheel.url, f"{m.offset}-{min(wheel.size, m.offset + 30 + len(m.name.encode()) + 1024 + m.csize) - 1}")
    if blob[:4] != _LOCAL:
        raise DiagError("corrupt wheel: no local header where the directory points", file=wheel.url,
                        field=m.name, expected="PK\\x03\\x04", found=blob[:4])
    n, e = struct.unpack_from("<HH", blob, 26)
    raw = blob[30 + n + e:30 + n + e + m.csize]
    if len(raw) < m.csize:
        raw += _get(wheel.url, f"{m.offset + 30 + n + e + len(raw)}-{m.offset + 30 + n + e + m.csize - 1}")
    data = raw if m.method == 0 else zlib.decompressobj(-15).decompress(raw)
    if zlib.crc32(data) != m.crc or len(data) != m.usize:
        raise DiagError("corrupt wheel member", file=wheel.url, field=m.name,
                        expected=f"{m.usize} bytes, CRC-32 {m.crc:08x}",
                        found=f"{len(data)} bytes, CRC-32 {zlib.crc32(data):08x}")
    return data


def read(version: str, path: str) -> bytes | None:
    """The member `path` of vllm==version's wheel (None if the wheel has no such file), cached."""
    cached = wheel_cache() / version / path
    if cached.is_file():
        return cached.read_bytes()
    if Path(f"{cached}.absent").is_file():
        return None
    m = directory(version).get(path)
    if m is None:
        _write(Path(f"{cached}.absent"), b"")
        return None
    data = _extract(release_files(version), m)
    _write(cached, data)
    return data


def read_text(version: str, path: str) -> str | None:
    data = read(version, path)
    return None if data is None else data.decode("utf-8")


def listing(version: str, under: str = "") -> tuple[str, ...]:
    """Member names of the wheel that start with `under`."""
    return tuple(sorted(n for n in directory(version) if n.startswith(under)))
