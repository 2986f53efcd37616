"""Drafter evaluations cached by content, as the target pass is: a repeat run replays nothing it
replayed before, and a run that adds one layout replays only that layout.

One entry per variant (layout x mode x tree x regimes x rendering x decoding), holding its raw
replay result (accepted drafts and root index per round, per sequence), never a summary: the
bootstrap, buckets and verdicts are recomputed from it, so changing them costs no replay.
The key hashes everything that decides those numbers:
  the target pass of the features and of the verifying tokens (their PassKey digests: the
    target's content, the exact token ids, regime, points, max_new_tokens, dtype, placement,
    torch / transformers), the target's content again (its embedding and lm_head feed the
    drafter), the drafter's content (checkpoint identity: a retrained drafter with the same
    sizes and timestamps is another key), the drafter's dtype and device (a GPU by its name);
  the variant: the layout's label and its capture points, the mode, the tree (num_steps,
    topk, num_draft_tokens), the rendering, the decoding, the engine's draft tables for the
    mode (whose embedding / lm_head, vocab limit, d2t);
  what sets the rounds and the batches: the run's deepest tree (max_steps), the round
    accounting, the token budget;
  the code: diag's version, REPLAY_VERSION, FORMAT and torch's version.
Not in it: the seed, the bootstrap and the position buckets (the replay is greedy and seedless;
they shape only the summary, recomputed from the entry), the other variants of the run (each
draft group is independent; a chain's first steps do not depend on how deep it runs).
A new layout over new capture points changes the target pass's key (its points), so that run
recomputes the pass and every variant; one over points already captured replays only itself.
Worked example: a cached case with layouts [A, B] x trees [chain-3, s3-k4-d5] gains layout C:
4 keys hit, 2 miss, and only C's two variants are replayed (one draft group). Adding a deeper
tree changes max_steps, so every variant is replayed (the rounds scored change with it).

Entry: $DIAG_CACHE_DIR/evals/<digest>.safetensors, tensors accepted.<i>, roots.<i>; metadata
"diag" = {format, key, variant, prompt_ids, categories} and "sha256" over metadata and tensors
(pass_cache.content_digest). A torn or unreadable entry, one whose bytes disagree with its
sha256, or one written by another version or under another key is a miss with a note saying
which (the variant is replayed and the entry rewritten), never an answer. Writes go to a
temporary file renamed into place. This module knows variants, files and hashes; it knows
nothing about reports.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

import diag
from diag.checkpoint.identity import cache_root, checkpoint_identity, drain_notes
from diag.replay.replay import Variant, VariantResult, replay
from diag.target.pass_cache import content_digest, read_checked

FORMAT = "diag-evaluation-v1"
REPLAY_VERSION = 1


def _device_name(dev: torch.device) -> str:
    """"cpu", or "cuda:NVIDIA H200": another GPU model may round a matmul otherwise."""
    return f"cuda:{torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else dev.type


@dataclass
class EvalCache:
    """The keys' run-wide fields, the pass digest of every pass a variant may read (regime ->
    digest, and extra pass name -> digest), and counts of what this run replayed and reused."""

    base: tuple[tuple[str, str], ...]
    regime_passes: dict[str, str]
    extra_passes: dict[str, str]
    computed: int = 0
    reused: int = 0
    notes: list[str] = field(default_factory=list)

    @classmethod
    def for_run(cls, target: Path, drafter: Path, drafter_dtype, device, pass_meta: dict) -> "EvalCache | None":
        """None when a pass has no cache key (a --no-cache run caches no evaluation either)."""
        regimes = {r: m.get("cache_key") for r, m in pass_meta.get("regimes", {}).items()}
        extra = {n: m.get("cache_key") for n, m in pass_meta.get("extra_passes", {}).items()}
        if not regimes or None in regimes.values() or None in extra.values():
            return None
        base = (("format", FORMAT), ("replay_version", str(REPLAY_VERSION)), ("diag", diag.__version__),
                ("torch", torch.__version__), ("target", checkpoint_identity(Path(target))),
                ("drafter", checkpoint_identity(Path(drafter))), ("drafter_dtype", str(drafter_dtype)),
                ("device", _device_name(torch.device(device))))
        notes = [f"checkpoint digest: {n}" for n in drain_notes()]   # the drafter's memo, if not believed
        return cls(base, regimes, extra, notes=notes)

    def key(self, v: Variant, passes: dict[str, str], layout, tables, *, max_steps: int, accounting: str,
            token_budget: int) -> tuple[tuple[str, str], ...]:
        t = tables.get(v.mode) if tables else None
        table = "default" if t is None else f"{t.embed},{t.lm_head},{t.vocab_limit},{t.uses_d2t}"
        return self.base + (
            ("features_pass", passes[v.regime]), ("tokens_pass", passes[v.tokens_regime]),
            ("layout", f"{v.layout}={layout}"), ("mode", v.mode),
            ("tree", f"{v.tree.num_steps},{v.tree.topk},{v.tree.num_draft_tokens}"),
            ("rendering", v.rendering), ("decoding", v.decoding), ("tables", table),
            ("max_steps", str(max_steps)), ("accounting", accounting), ("token_budget", str(token_budget)))

    def replay(self, passes_ids: dict[str, str], drafter, embed, head, passes, variants: list[Variant],
               layouts: dict, *, token_budget: int, progress: bool, tables=None, accounting=None
               ) -> list[VariantResult]:
        """replay() of `variants`, each from its entry when it has one; only the misses are
        replayed (at the rounds the whole list sets), then saved."""
        kw = {"accounting": accounting} if accounting is not None else {}
        max_steps = max(v.tree.num_steps for v in variants)
        acc_name = accounting.name if accounting is not None else "window"
        keys = {v: self.key(v, passes_ids, layouts.get(v.layout), tables, max_steps=max_steps,
                            accounting=acc_name, token_budget=token_budget) for v in variants}
        found = {}
        for v in variants:
            hit, why = load_entry(keys[v], v)
            if why:
                self.notes.append(f"drafter evaluation {v.key}: {why}")
            if hit is not None:
                found[v] = hit
        missing = [v for v in variants if v not in found]
        if missing:
            for res in replay(drafter, embed, head, passes, missing, layouts, token_budget=token_budget,
                              progress=progress, tables=tables, max_steps=max_steps, **kw):
                save_entry(keys[res.variant], res)
                found[res.variant] = res
        self.computed += len(missing)
        self.reused += len(variants) - len(missing)
        return [found[v] for v in variants]


def entry_file(key: tuple[tuple[str, str], ...]) -> Path:
    return cache_root() / "evals" / (hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32] + ".safetensors")


def _tensors(res: VariantResult) -> dict[str, torch.Tensor]:
    out = {}
    for i, (acc, roots) in enumerate(zip(res.accepted, res.roots)):
        out[f"accepted.{i}"] = acc.detach().contiguous().cpu()
        out[f"roots.{i}"] = torch.as_tensor(roots).detach().contiguous().cpu()
    return out


def save_entry(key, res: VariantResult) -> Path | None:
    """Write the entry (temporary file renamed into place); None when the cache cannot be
    written (the run goes on: the next one replays the variant again)."""
    from safetensors.torch import save_file

    path = entry_file(key)
    tensors = _tensors(res)
    meta = json.dumps({"format": FORMAT, "key": key, "variant": res.variant.key,
                       "prompt_ids": res.prompt_ids, "categories": res.categories})
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata={"diag": meta, "sha256": content_digest(tensors, meta)})
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    except BaseException:                 # an interrupt leaves no half-written entry
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_entry(key, variant: Variant) -> tuple[VariantResult | None, str | None]:
    """(the cached result, None); (None, why) for an entry that cannot be believed; (None, None)
    when there is none."""
    path = entry_file(key)
    meta, tensors, why = read_checked(path, "replayed again")
    if meta is None:
        return None, why
    if meta.get("format") != FORMAT:
        return None, (f"cache entry {path.name} was written by another diag version (format "
                      f"{meta.get('format')!r}, this one reads {FORMAT!r}); replayed again")
    if tuple(tuple(f) for f in meta.get("key", ())) != tuple(key) or meta.get("variant") != variant.key:
        return None, f"cache entry {path.name} was written under another key; replayed again"
    n = len(meta["prompt_ids"])
    return VariantResult(variant, [tensors[f"accepted.{i}"] for i in range(n)],
                         [tensors[f"roots.{i}"] for i in range(n)], list(meta["prompt_ids"]),
                         list(meta["categories"])), None


# ---- results computed from one pass alone (output health, the near-ties diagnosis) ---------

PASS_RESULT_FORMAT = "diag-pass-result-v1"


def cached_pass_json(cache: EvalCache | None, regime: str, name: str, params: dict, compute) -> dict:
    """compute() -> a JSON-able dict computed from the `regime` pass (and the target's lm_head,
    which a repeat run must not read: Kimi's is 2.3 GB), from its entry when this pass had it
    computed before with the same params. Key: format, name, params, the pass digest (the
    target's content is in it), the versions. Entry: $DIAG_CACHE_DIR/evals/<name>-<digest>.json
    {format, key, result, check}; a damaged entry or one under another key is computed again
    with a note, never believed."""
    if cache is None:
        return compute()
    key = [["format", PASS_RESULT_FORMAT], ["name", name], ["diag", diag.__version__], ["torch", torch.__version__],
           ["pass", cache.regime_passes[regime]], ["params", json.dumps(params, sort_keys=True)]]
    path = cache_root() / "evals" / f"{name}-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]}.json"
    try:
        entry = json.loads(path.read_text())
        if entry["key"] == key and entry["check"] == _check(entry["result"]):
            return entry["result"]
        cache.notes.append(f"cache entry {path.name} failed its check or was written under another key; "
                           f"the {name} of the target pass was computed again")
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        cache.notes.append(f"cache entry {path.name} is unreadable; the {name} of the target pass was computed again")
    result = compute()
    _write_json(path, {"format": PASS_RESULT_FORMAT, "key": key, "result": result, "check": _check(result)})
    return result


def cached_output_health(cache: EvalCache | None, regime: str, tp, head, vocab_size: int):
    """output_health of the reference pass (target/output_health.py): its prompt fit reads the
    whole lm_head, so a repeat run takes it from the pass's entry."""
    from dataclasses import asdict

    from diag.target.output_health import OutputHealth, output_health

    fields = cached_pass_json(cache, regime, "output-health", {"vocab_size": vocab_size},
                              lambda: asdict(output_health(tp.sequences, tp.states.get("final"), head, vocab_size)))
    return OutputHealth(**fields)


def _check(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _write_json(path: Path, entry: dict) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
