"""The zoo's training text: the running Python's standard library source.

Deterministic for a given Python installation: files are listed under
sysconfig's stdlib path, ordered by sha256 of their relative path (a fixed
pseudo-random interleave, so a byte budget samples every package instead of
a..m), long files are cut at a line boundary, and a file is held out when
its path hash is 0 mod `heldout_every`.

    "json/decoder.py" -> sha256 -> int 0x3fa1... ; % 20 == 0 ? held-out : train

Tests, encodings tables, bundled data and site-packages are skipped: they
are not the Python-looking text the replay prompts resemble. Each file is
normalised so a tiny model does not learn comment rulers as its favourite
loop: the leading comment block (shebang, licence) goes, lines that are
only "#" go, and runs of blank lines collapse to one:

    "#!/usr/bin/env python\n# Copyright\n#\nimport os\n#\n\n\n\nx = 1\n"
    -> "import os\n\nx = 1\n"

This module knows files and bytes; it knows nothing about tokens or models.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from diag.zoo.recipes import CorpusRecipe

_SKIP_DIRS = frozenset({"site-packages", "test", "tests", "idle_test", "encodings", "pydoc_data",
                        "__pycache__", "ensurepip", "turtledemo"})
_SKIP_PREFIXES = ("_sysconfigdata", "config-")


@dataclass(frozen=True)
class Document:
    path: str   # relative to the stdlib root, "/"-separated
    text: str


@dataclass(frozen=True)
class Corpus:
    train: tuple[Document, ...]
    heldout: tuple[Document, ...]
    stdlib: str                     # where the files came from
    sha256: str                     # over (path, text) of every document, in order

    @property
    def num_bytes(self) -> int:
        return sum(len(d.text.encode()) for d in self.train + self.heldout)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _path_hash(rel: str) -> int:
    return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big")


def _wanted(rel_parts: tuple[str, ...]) -> bool:
    if any(p in _SKIP_DIRS for p in rel_parts[:-1]):
        return False
    return not rel_parts[0].startswith(_SKIP_PREFIXES) and not rel_parts[-1].startswith(_SKIP_PREFIXES)


def list_sources(root: Path) -> list[str]:
    """Relative paths of usable .py files, in path-hash order."""
    rels = []
    for p in root.rglob("*.py"):
        rel_parts = p.relative_to(root).parts
        if _wanted(rel_parts):
            rels.append("/".join(rel_parts))
    return sorted(rels, key=lambda r: (_path_hash(r), r))


def _cut(text: str, max_bytes: int) -> str:
    """Keep whole lines while the UTF-8 size stays <= max_bytes."""
    if len(text.encode()) <= max_bytes:
        return text
    out, size = [], 0
    for line in text.splitlines(keepends=True):
        size += len(line.encode())
        if size > max_bytes:
            break
        out.append(line)
    return "".join(out)


def normalise(text: str) -> str:
    """Drop the leading comment block and "#"-only lines; collapse blank-line runs."""
    lines = text.replace("\r\n", "\n").split("\n")
    start = 0
    while start < len(lines) and (not lines[start].strip() or lines[start].lstrip().startswith("#")):
        start += 1
    out: list[str] = []
    for line in lines[start:]:
        if line.strip() == "#":
            continue
        if not line.strip() and out and not out[-1].strip():
            continue
        out.append(line.rstrip())
    return "\n".join(out).strip("\n") + "\n"


def _read(root: Path, rel: str) -> str | None:
    try:
        text = (root / rel).read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    text = normalise(text)
    return text if text.strip() else None


def collect(recipe: CorpusRecipe, root: Path | None = None) -> Corpus:
    """Read files in path-hash order until the byte budget is spent."""
    root = root or stdlib_root()
    train, heldout, used = [], [], 0
    digest = hashlib.sha256()
    for rel in list_sources(root):
        text = _read(root, rel)
        if text is None:
            continue
        text = _cut(text, recipe.max_file_bytes)
        size = len(text.encode())
        if used + size > recipe.byte_budget:
            continue  # a smaller file later may still fit
        used += size
        doc = Document(rel, text)
        (heldout if _path_hash(rel) % recipe.heldout_every == 0 else train).append(doc)
        digest.update(rel.encode() + b"\0" + text.encode() + b"\0")
    return Corpus(tuple(train), tuple(heldout), str(root), digest.hexdigest())
