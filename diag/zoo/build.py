"""Building zoo entries on demand: dependency order, dispatch by recipe type,
atomic publication (cache.py) and a zoo_meta.json per entry.

zoo_meta.json holds what was built and how well it came out:
  {"name", "builder_version", "fingerprint", "recipe" (the frozen recipe as a dict), "seconds",
   "torch", "transformers", "python", "amx" (amx_cpu), "avx512" (avx512_cpu), "threads",
   "metrics": {... builder-specific ...}}

An entry is served from the cache only while it is what its recipe would build now: its
`fingerprint` (BUILDER_VERSION, its recipe, its dependencies' fingerprints, hashed) equals
the current one, so changing a recipe rebuilds that entry and everything built from it, and
no test or demo reads a checkpoint of an older recipe. An entry built before fingerprints
existed is served while its own recipe is unchanged and nothing it needs was rebuilt.

This module knows the order of things; the work is in build_targets.py and
build_drafters.py, the numerics of INT4 in diag.int4.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm

from diag.errors import DiagError
from diag.zoo import cache
from diag.zoo.allocator import keep_freed_memory
from diag.zoo.recipes import (BUILDER_VERSION, ZOO, CorpusRecipe, DerivedDrafterRecipe, DrafterRecipe, Int4Recipe,
                              TargetRecipe)
from diag.zoo.recipes_prompt_side import PromptDrafterRecipe, ThinkingRecipe
from diag.zoo.shipped import copy_shipped
from diag.zoo.train import BUILD_THREADS, cpu_has

META_FILE = "zoo_meta.json"


def entry(name: str):
    if name not in ZOO:
        raise DiagError("unknown zoo entry", field="name", expected=", ".join(ZOO), found=repr(name))
    return ZOO[name]


def closure(names: list[str]) -> list[str]:
    """Every entry the names need, dependencies first, each once.
    ["llama-tiny-eagle3-l1"] -> ["stdlib-corpus", "llama-tiny", "llama-tiny-eagle3-l1"]."""
    order: list[str] = []

    def visit(n: str) -> None:
        for dep in entry(n).needs:
            visit(dep)
        if n not in order:
            order.append(n)

    for n in names:
        visit(n)
    return order


def _run_builder(name: str, out: Path, deps: dict[str, Path]) -> dict:
    recipe = entry(name).recipe
    if isinstance(recipe, CorpusRecipe):
        from diag.zoo.build_targets import build_corpus
        return build_corpus(recipe, out)
    if isinstance(recipe, TargetRecipe):
        from diag.zoo.build_targets import build_target
        return build_target(recipe, out, deps)
    if isinstance(recipe, (DrafterRecipe, PromptDrafterRecipe)):
        from diag.zoo.build_drafters import build_drafter
        target = recipe.target if isinstance(recipe, DrafterRecipe) else recipe.drafter.target
        return build_drafter(recipe, out, deps, corpus=entry(target).recipe.corpus)
    if isinstance(recipe, ThinkingRecipe):
        from diag.zoo.build_thinking import build_thinking
        return build_thinking(recipe, out, deps)
    if isinstance(recipe, Int4Recipe):
        return _build_int4(recipe, out, deps)
    if isinstance(recipe, DerivedDrafterRecipe):
        from diag.zoo.build_derived import build_derived
        drafter = entry(recipe.source).recipe
        return build_derived(recipe, out, deps[recipe.source], deps[drafter.target], drafter.layout)
    raise TypeError(f"no builder for {type(recipe).__name__}")


def _build_int4(recipe: Int4Recipe, out: Path, deps: dict[str, Path]) -> dict:
    from safetensors import safe_open

    from diag.int4.write import quantize_checkpoint
    quantize_checkpoint(deps[recipe.source], out, group_size=recipe.group_size)
    packed = 0
    for f in sorted(out.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            packed += sum(1 for k in fh.keys() if k.endswith(".weight_packed"))
    return {"packed_linears": packed, "group_size": recipe.group_size}


def _plain(recipe) -> dict:
    """A recipe as zoo_meta.json holds it (tuples become lists): its fields, or what the recipe
    says it is itself (recipes.DerivedDrafterRecipe.plain)."""
    fields = recipe.plain() if callable(getattr(recipe, "plain", None)) else dataclasses.asdict(recipe)
    return json.loads(json.dumps(fields))


def fingerprint(name: str) -> str:
    """What `name` is built from, hashed: BUILDER_VERSION, its recipe and the fingerprints of
    what it needs. A change to any recipe upstream changes it."""
    e = entry(name)
    payload = {"builder_version": BUILDER_VERSION, "recipe": _plain(e.recipe),
               "needs": {d: fingerprint(d) for d in e.needs}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def stale(name: str, rebuilt: set[str] = frozenset()) -> str | None:
    """Why the cached `name` may not be served (None: it may). rebuilt: entries rebuilt in
    this pass (what was built from their old selves is stale too)."""
    if not cache.is_built(name):
        return "not built"
    meta = read_meta(name)
    if meta is None:
        return f"its {META_FILE} is missing or unreadable"
    if (damaged := _damaged(name, meta)) is not None:
        return damaged
    if "fingerprint" in meta:
        return None if meta["fingerprint"] == fingerprint(name) else "its recipe or one it needs changed"
    if meta.get("recipe") != _plain(entry(name).recipe):
        return "its recipe changed"
    changed = [d for d in entry(name).needs if d in rebuilt]
    return f"{', '.join(changed)} was rebuilt" if changed else None


def _digests(folder: Path) -> dict[str, str]:
    """The content digest (checkpoint.identity.file_digest, the pass cache's) of every file an
    entry holds but its zoo_meta.json, recorded when it is built."""
    from diag.checkpoint.identity import file_digest
    return {f.name: file_digest(f) for f in sorted(folder.iterdir()) if f.is_file() and f.name != META_FILE}


def _digest_of(path: Path, kind: str) -> str:
    """`path`'s digest in the form its entry recorded: "sha256" (entries of the first diag that
    recorded digests) or the identity's current DIGEST_VERSION."""
    from diag.checkpoint.identity import file_digest
    return hashlib.sha256(path.read_bytes()).hexdigest() if kind == "sha256" else file_digest(path)


def _damaged(name: str, meta: dict) -> str | None:
    """Why an entry's files are not the ones it was built with (verified by content, as the
    pass cache is), None when they are. Digests come from the memo while a file's stat is
    unchanged (checkpoint.identity), so a served entry is not re-read on every use; an entry
    built before digests were recorded is not checked. Example: one byte of model.safetensors
    flipped on disk -> "its model.safetensors changed on disk since it was built"."""
    from diag.checkpoint.identity import DIGEST_VERSION
    files = meta.get("files")
    if not isinstance(files, dict):
        return None
    kind = meta.get("files_digest", "sha256")
    if kind not in ("sha256", DIGEST_VERSION):
        return f"its file digests are of a kind this diag does not compute ({kind})"
    for fname, digest in sorted(files.items()):
        path = cache.entry_dir(name) / fname
        if not path.is_file():
            return f"its {fname} is missing"
        if _digest_of(path, kind) != digest:
            return f"its {fname} changed on disk since it was built ({kind} {digest[:12]} recorded)"
    return None


def outdated(names: list[str]) -> set[str]:
    """The entries of closure(names) a build would make now: stale ones, and (dependencies
    first) those built from them."""
    found: set[str] = set()
    for n in closure(names):
        if stale(n, found) is not None:
            found.add(n)
    return found


def _meta(name: str, seconds: float, metrics: dict) -> dict:
    return {"name": name, "builder_version": BUILDER_VERSION, "fingerprint": fingerprint(name),
            "recipe": _plain(entry(name).recipe), "seconds": round(seconds, 2),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "amx": amx_cpu(), "avx512": avx512_cpu(), "threads": BUILD_THREADS,
            "metrics": metrics}


def amx_cpu() -> bool:
    """Whether this CPU has AMX tiles, which oneDNN's bf16 matmuls then take: a recipe trained under
    bf16 autocast rounds otherwise there, so the same torch, transformers and Python make other
    bytes (the shipped pair, built without AMX: tests/test_zoo_shipped.py)."""
    return cpu_has("_is_amx_tile_supported")


def avx512_cpu() -> bool:
    """Whether this CPU has AVX-512: without it torch's and oneDNN's float kernels take 8-wide
    vectors and their sums another order, so a recipe's bytes differ again (an AMD EPYC with AVX2
    only made other bytes than the shipped pair's, twenty-ninth stop: tests/test_zoo_shipped.py)."""
    return cpu_has("_is_avx512_supported")


def build_one(name: str, deps: dict[str, Path], rebuilt: set[str] = frozenset()) -> tuple[Path, bool]:
    """Build `name` (its dependencies must be in deps) unless a servable one exists (stale:
    checked again under the entry's lock). Returns (path, built_now)."""
    def work(tmp: Path) -> None:
        if copy_shipped(name, fingerprint(name), tmp):      # the demo's pair: shipped, not trained
            return
        start = time.perf_counter()
        metrics = _run_builder(name, tmp, deps)
        from diag.checkpoint.identity import DIGEST_VERSION
        meta = {**_meta(name, time.perf_counter() - start, metrics), "files": _digests(tmp),
                "files_digest": DIGEST_VERSION}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return cache.publish(name, work, keep=lambda _path: stale(name, rebuilt) is None)


def ensure(names: list[str], progress: bool = True) -> dict[str, Path]:
    """Build whatever of names (and their dependencies) is missing or stale; return every path."""
    paths: dict[str, Path] = {}
    todo = closure(names)
    planned = outdated(todo)
    if planned:
        keep_freed_memory()                  # same bits, a fifth less time (allocator.py)
    bar = tqdm(total=len(planned), desc="diag zoo", unit="entry", disable=not progress or not planned)
    rebuilt: set[str] = set()
    for n in todo:
        if n not in planned:
            paths[n] = cache.entry_dir(n)
            continue
        bar.set_postfix_str(n)
        if cache.is_built(n) and (why := stale(n, rebuilt)) is not None:
            tqdm.write(f"diag zoo: rebuilding {n}: {why}", file=sys.stderr)
        paths[n], now = build_one(n, paths, rebuilt)
        if now:
            rebuilt.add(n)
        bar.update(1)
    bar.close()
    return paths


def read_meta(name: str) -> dict | None:
    """An entry's zoo_meta.json; None when missing or unreadable (one cut short by a full disk
    or a killed copy makes the entry stale, so it is rebuilt, not a JSONDecodeError)."""
    f = cache.entry_dir(name) / META_FILE
    try:
        meta = json.loads(f.read_text()) if f.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return meta if isinstance(meta, dict) else None
