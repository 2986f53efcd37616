"""Single files out of vLLM's released wheels, read with HTTP range requests (no whole wheel),
through the one wheel cache (diag.engines.wheels: the zip reading and the cache writes).

A vLLM wheel is ~240-400 MB and ~40 releases have EAGLE-3, but diag needs a dozen Python
files of each: three ranged GETs a file (diag.engines.wheels' docstring).

    release_files("0.34.0")   -> RemoteWheel(url, size) of the x86_64 Linux wheel (PyPI JSON)
    read("0.34.0", "vllm/v1/sample/rejection_sampler.py") -> bytes, cached at
        $DIAG_CACHE_DIR/vllm-wheels/0.34.0/vllm/v1/sample/rejection_sampler.py
    read(..., a path the wheel lacks) -> None (a fact about that release, not an error)
    releases() -> every vLLM version on PyPI, oldest first (https://pypi.org/pypi/vllm/json)

A member the wheel lacks is remembered as an empty `<path>.absent` marker. Errors (unknown
release, no network, a server that ignores Range, a corrupt member) are DiagErrors naming the
URL. This module knows vLLM's index entries and which wheel to read; nothing about what vLLM's
files say.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from functools import lru_cache
from pathlib import Path

from diag.engines.wheels import Member, RemoteWheel, cache_dir, directory_bytes, extract, get, members, write_atomic
from diag.errors import DiagError

INDEX = os.environ.get("DIAG_VLLM_INDEX", "https://pypi.org/pypi")
_TIMEOUT = 60


def wheel_cache() -> Path:
    """$DIAG_CACHE_DIR/vllm-wheels (or ~/.cache/diag/vllm-wheels)."""
    return cache_dir("vllm")


def _get(url: str, byte_range: str | None = None) -> bytes:
    """GET url (a byte range of it) from the index, with this module's timeout and hint."""
    return get(url, byte_range, timeout=_TIMEOUT, hint=_hint())


def _hint() -> str:
    return ("reading vLLM's rules from its wheels needs pypi.org and files.pythonhosted.org (or DIAG_VLLM_INDEX); "
            "once read, files are cached under " + str(wheel_cache()))


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
    write_atomic(note, json.dumps({"url": found.url, "size": found.size}).encode())
    return found


@lru_cache(maxsize=None)
def directory(version: str) -> dict[str, Member]:
    """{member name: Member} of the version's wheel; its central directory cached as
    <cache>/<version>/.central-directory."""
    wheel = release_files(version)
    return members(directory_bytes(wheel, wheel_cache() / version / ".central-directory", timeout=_TIMEOUT,
                                   hint=_hint()))


def read(version: str, path: str) -> bytes | None:
    """The member `path` of vllm==version's wheel (None if the wheel has no such file), cached."""
    cached = wheel_cache() / version / path
    if cached.is_file():
        return cached.read_bytes()
    if Path(f"{cached}.absent").is_file():
        return None
    m = directory(version).get(path)
    if m is None:
        write_atomic(Path(f"{cached}.absent"), b"")
        return None
    data = extract(release_files(version), m, timeout=_TIMEOUT, hint=_hint())
    write_atomic(cached, data)
    return data


def read_text(version: str, path: str) -> str | None:
    data = read(version, path)
    return None if data is None else data.decode("utf-8")


def listing(version: str, under: str = "") -> tuple[str, ...]:
    """Member names of the wheel that start with `under`."""
    return tuple(sorted(n for n in directory(version) if n.startswith(under)))
