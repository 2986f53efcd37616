"""The one home of engine wheels: where they are cached and how they are fetched, for every
engine family (each family's wheels.py says which package, which platform, which files).

Two ways, both cached under $DIAG_CACHE_DIR (or ~/.cache/diag) / <package>-wheels, so a
release is fetched once whichever code asks (the generators, the differential tests, CI):
  whole wheels   download(package, version, folder): `pip download --no-deps` for CPython 3.11
                 on x86_64 Linux into a temporary folder inside the cache, renamed into place
                 (SGLang's wheels: 6 MB for 0.5.6, 39 MB for 0.5.23, kept whole)
  single files   HTTP range requests into a remote wheel (a ~240-400 MB vLLM wheel costs a
                 dozen small reads): a wheel is a zip whose central directory sits at its end,
                 so one member costs three ranged GETs (all byte offsets from the wheel's start):
    1. the last 64 KiB + 22 bytes -> the End Of Central Directory record (EOCD, "PK\\x05\\x06"):
       entries, directory size, directory offset (ZIP64 locator "PK\\x06\\x07" when they
       overflow 32 bits);
    2. the central directory (~0.6 MB for vllm 0.34.0: 2,400 entries) -> per member its
       method, CRC-32, compressed size and local-header offset (members);
    3. local header (30 bytes + name + extra) + the compressed data -> inflate (zlib, wbits
       -15: raw deflate) -> check the CRC-32 (extract).
    Worked example, vllm 0.34.0 x86_64 (239,039,932 bytes): step 1 asks `Range: bytes=-65558`.

Every cache write is a temporary file (or folder) renamed into place: concurrent readers see
nothing or the whole thing. Errors: WheelError when pip cannot fetch a release; DiagErrors
naming the URL for the HTTP side (no network, a server that ignores Range, a corrupt member).
This module knows pip, HTTP, zip and the cache; nothing about what any engine's files say, and
names no engine.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from diag.checkpoint.identity import cache_root
from diag.errors import DiagError

_EOCD, _EOCD64_LOC, _CDIR, _LOCAL = b"PK\x05\x06", b"PK\x06\x07", b"PK\x01\x02", b"PK\x03\x04"
_TAIL = 65536 + 22                     # the EOCD's comment is at most 65535 bytes
TIMEOUT = 60


class WheelError(RuntimeError):
    """pip could not fetch a release (no index, no such version)."""


def cache_dir(package: str) -> Path:
    """$DIAG_CACHE_DIR/<package>-wheels (or ~/.cache/diag/<package>-wheels)."""
    return cache_root() / f"{package}-wheels"


def download(package: str, version: str, root: Path) -> Path:
    """The package==version wheel for CPython 3.11 on x86_64 Linux in `root`, fetched by pip
    the first time (module docstring); root/<package>-<version>-*.whl."""
    found = sorted(root.glob(f"{package}-{version}-*.whl"))
    if found:
        return found[0]
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
               "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
               "--platform", "manylinux_2_34_x86_64", f"{package}=={version}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        got = sorted(Path(tmp).glob(f"{package}-{version}-*.whl"))
        if done.returncode != 0 or not got:
            raise WheelError(f"pip download --no-deps {package}=={version} failed (exit {done.returncode}); "
                             f"pip said:\n{done.stderr[-2000:]}")
        final = root / got[0].name
        os.replace(got[0], final)              # atomic: whoever looks sees no wheel or the whole one
    return final


@dataclass(frozen=True)
class RemoteWheel:
    """A wheel on an index: its release, URL and size in bytes."""

    version: str
    url: str
    size: int


@dataclass(frozen=True)
class Member:
    """One file of a wheel as its central directory lists it."""

    name: str
    method: int          # 0 stored, 8 deflate
    crc: int
    csize: int
    usize: int
    offset: int          # of the local header


def get(url: str, byte_range: str | None = None, *, timeout: float = TIMEOUT, hint: str | None = None) -> bytes:
    """GET url (with `Range: bytes=...`), two retries; a DiagError naming the URL on failure."""
    headers = {"Range": f"bytes={byte_range}"} if byte_range else {}
    last: Exception | None = None
    for _ in range(3):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
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
                    found=f"{type(last).__name__}: {last}", hint=hint)


def write_atomic(path: Path, data: bytes) -> None:
    """Atomic write: a temporary file in the same folder, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def directory_bytes(wheel: RemoteWheel, cached: Path, *, timeout: float = TIMEOUT, hint: str | None = None) -> bytes:
    """The central directory's raw bytes (steps 1-2), cached in the file `cached`."""
    if cached.is_file():
        return cached.read_bytes()
    tail = get(wheel.url, f"-{min(_TAIL, wheel.size)}", timeout=timeout, hint=hint)
    at = tail.rfind(_EOCD)
    if at < 0:
        raise DiagError("not a zip file: no End Of Central Directory record", file=wheel.url,
                        expected="PK\\x05\\x06 in the last 64 KiB", found="absent")
    entries, size, offset = struct.unpack_from("<HII", tail, at + 10)
    if offset == 0xFFFFFFFF or size == 0xFFFFFFFF or entries == 0xFFFF:
        loc = tail.rfind(_EOCD64_LOC, 0, at)
        (rec,) = struct.unpack_from("<Q", tail, loc + 8)
        head = get(wheel.url, f"{rec}-{rec + 55}", timeout=timeout, hint=hint)
        size, offset = struct.unpack_from("<QQ", head, 40)
    data = get(wheel.url, f"{offset}-{offset + size - 1}", timeout=timeout, hint=hint)
    write_atomic(cached, data)
    return data


def members(data: bytes) -> dict[str, Member]:
    """{member name: Member} of a central directory's raw bytes."""
    out, i = {}, 0
    while data[i:i + 4] == _CDIR:
        (_, _, _, flags, method, _, _, crc, csize, usize, n, e, c, _, _, _, off) = \
            struct.unpack_from("<4s4H2H3I5HII", data, i)
        name = data[i + 46:i + 46 + n].decode("utf-8" if flags & 0x800 else "cp437")
        if 0xFFFFFFFF in (csize, usize, off):
            csize, usize, off = zip64_sizes(data[i + 46 + n:i + 46 + n + e], csize, usize, off)
        out[name] = Member(name, method, crc, csize, usize, off)
        i += 46 + n + e + c
    return out


def zip64_sizes(extra: bytes, csize: int, usize: int, off: int) -> tuple[int, int, int]:
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


def extract(wheel: RemoteWheel, m: Member, *, timeout: float = TIMEOUT, hint: str | None = None) -> bytes:
    """Step 3: local header + data, inflated and CRC-checked."""
    # Ask for the header, the name, up to 1 KiB of extra field and the data in one request.
    end = min(wheel.size, m.offset + 30 + len(m.name.encode()) + 1024 + m.csize) - 1
    blob = get(wheel.url, f"{m.offset}-{end}", timeout=timeout, hint=hint)
    if blob[:4] != _LOCAL:
        raise DiagError("corrupt wheel: no local header where the directory points", file=wheel.url,
                        field=m.name, expected="PK\\x03\\x04", found=blob[:4])
    n, e = struct.unpack_from("<HH", blob, 26)
    raw = blob[30 + n + e:30 + n + e + m.csize]
    if len(raw) < m.csize:
        start = m.offset + 30 + n + e
        raw += get(wheel.url, f"{start + len(raw)}-{start + m.csize - 1}", timeout=timeout, hint=hint)
    data = raw if m.method == 0 else zlib.decompressobj(-15).decompress(raw)
    if zlib.crc32(data) != m.crc or len(data) != m.usize:
        raise DiagError("corrupt wheel member", file=wheel.url, field=m.name,
                        expected=f"{m.usize} bytes, CRC-32 {m.crc:08x}",
                        found=f"{len(data)} bytes, CRC-32 {zlib.crc32(data):08x}")
    return data
