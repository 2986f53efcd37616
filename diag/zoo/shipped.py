"""The zoo entries diag ships as package data: the demo's pair, so a first `diag run` costs
the install and seconds, not minutes of training (issue 35, "the first impression").

diag/zoo/entries/NAME/ holds the files a build of NAME wrote (zoo_meta.json included) and
SHIPPED.json their sha256. When the cache lacks NAME and the shipped copy's fingerprint is
the one its recipe has now (build.fingerprint), the copy is what a build would make on the
machine that made it: it is verified by content and published in place of a build. A
shipped copy of an older recipe is never served: the entry is trained as before.

tests/test_zoo_shipped.py builds the pair afresh and holds it to the shipped bytes (the same
sha256 on the platform that made them; elsewhere the same quality numbers within their
intervals). `python -m diag.zoo.shipped` refreshes the copies from the cache.

This module knows the shipped files and their digests; building is build.py's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from importlib.resources import files
from pathlib import Path

from diag.errors import DiagError

NAMES = ("llama-tiny", "llama-tiny-eagle3-embed", "llama-tiny-eagle3-embed-vllm-ids")
DIGESTS = "SHIPPED.json"


def shipped_dir(name: str) -> Path | None:
    """diag/zoo/entries/NAME, when diag ships NAME."""
    d = Path(str(files("diag.zoo").joinpath("entries", name)))
    return d if name in NAMES and d.is_dir() else None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digests(folder: Path) -> dict[str, str]:
    """{file name: sha256} of every file of an entry, the digest list itself aside."""
    return {f.name: sha256(f) for f in sorted(folder.iterdir()) if f.is_file() and f.name != DIGESTS}


def fingerprint_of(name: str) -> str | None:
    d = shipped_dir(name)
    if d is None:
        return None
    try:
        return json.loads((d / "zoo_meta.json").read_text()).get("fingerprint")
    except (OSError, ValueError):
        return None


def copy_shipped(name: str, fingerprint: str, out: Path) -> bool:
    """Copy the shipped NAME into `out` when it is what the current recipe builds; False when
    diag ships no such copy. A copy whose bytes differ from SHIPPED.json is an error."""
    d = shipped_dir(name)
    if d is None or fingerprint_of(name) != fingerprint:
        return False
    want = json.loads((d / DIGESTS).read_text())
    for fname in want:
        shutil.copyfile(d / fname, out / fname)
    found = digests(out)
    bad = sorted(f for f in want if found.get(f) != want[f])
    if bad:
        raise DiagError("a zoo entry shipped with diag is damaged (its files differ from their digests)",
                        file=str(d / bad[0]), field=DIGESTS, expected=want[bad[0]],
                        found=found.get(bad[0]), hint="reinstall diag")
    return True


def refresh(cache_entries: Path, names: tuple[str, ...] = NAMES) -> None:
    """Copy the cache's built NAMEs into diag/zoo/entries with their digests (a checkout)."""
    root = Path(__file__).with_name("entries")
    for name in names:
        src, dst = cache_entries / name, root / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        (dst / DIGESTS).write_text(json.dumps(digests(dst), indent=1) + "\n")


if __name__ == "__main__":
    from diag.zoo.cache import cache_root
    refresh(cache_root(), tuple(sys.argv[1:]) or NAMES)
