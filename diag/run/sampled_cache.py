"""Sampled decode loops cached by content, as the target pass and the greedy evaluations are: a
repeat run of a sampled case decodes nothing and loads no target (issue 34.2: "an unchanged
variant costs nothing").

One entry per decode loop (the lanes of one tree shape that share its verify forwards, run/
sampled.py), holding every row's raw rounds (the Decoded records: roots, accepted drafts, the
exact P(a >= d) of each round, the ids, the length), never a summary: the bootstrap, buckets and
round accounting are recomputed from them, so changing those costs no decode.
The key hashes everything that decides those rounds:
  the target as the loop runs it: the reference regime's pass key over the prompts (the
    target's content, the regime, the prompts' token ids with the end and pad ids, dtype,
    placement, max_new_tokens, torch / transformers);
  the drafter's content, dtype and device;
  the loop: the decoding (every field: temperature, top-p, top-k, thresholds), the tree
    (num_steps, topk, num_draft_tokens), the lanes in order (variant key, its layout's capture
    points, seed: the seeds drive the coins), the engine's draft tables of each mode, the
    sampled verification rule, the token budget (it sets the batches, and a row's floats may
    depend on its batch's width);
  the code: diag's version, FORMAT and LOOP_VERSION (raise it with any change to the loop that
    changes a number it records: the key does not hash the loop's source).
The lanes are the whole loop's, not one variant's: rows of every lane share each forward, so a
variant is answered only beside the lanes it was decoded with (a run that adds a layout decodes
that tree shape's loop again; the other shapes' loops are answered).
Worked example: demo-sampled run twice -> the 2 loops (chain-3 x 6 lanes, s3-k4-d8 x 2 lanes)
hit, no target is loaded, the report is byte-identical; seeds = 3 -> every lane list changes ->
both miss.

Entry: $DIAG_CACHE_DIR/evals/sampled-<digest>.json {format, key, rows, check (sha256 of rows)},
written through a temporary file renamed into place. A torn entry, one under another key or
whose rows disagree with their check is a miss with a note, never an answer. This module knows
keys, files and Decoded records; the loop is replay/decode_loop.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import diag
from diag.checkpoint.identity import cache_root
from diag.replay.decode_rows import Decoded, Lane

FORMAT = "diag-sampled-v1"
LOOP_VERSION = 1


def loop_key(base: list[list[str]], decoding, shape, lanes: list[Lane], layouts: dict, tables: dict,
             verification: str, token_budget: int) -> list[list[str]]:
    """base (the run-wide fields: target pass key, drafter) + the loop's own fields, as JSON-able pairs."""
    def table(t) -> str:
        return "default" if t is None else f"{t.embed},{t.lm_head},{t.vocab_limit},{t.uses_d2t}"
    lane_rows = [[ln.variant.key, str(layouts.get(ln.variant.layout)), str(ln.seed)] for ln in lanes]
    return [["format", FORMAT], ["loop_version", str(LOOP_VERSION)], ["diag", diag.__version__], *base,
            ["decoding", repr(decoding)],
            ["tree", f"{shape.num_steps},{shape.topk},{shape.num_draft_tokens}"],
            ["lanes", json.dumps(lane_rows)],
            ["tables", json.dumps({m: table(t) for m, t in sorted((tables or {}).items())})],
            ["verification", verification], ["token_budget", str(token_budget)]]


def entry_file(key: list[list[str]]) -> Path:
    return cache_root() / "evals" / f"sampled-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]}.json"


def _row(o: Decoded, lane_index: int) -> dict:
    return {"lane": lane_index, "prompt": o.prompt, "roots": o.roots, "accepted": o.accepted,
            "expected": o.expected, "ids": o.ids, "length": o.length}


def _check(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def load(key: list[list[str]], lanes: list[Lane]) -> tuple[list[Decoded] | None, str | None]:
    """(the loop's Decoded rows in the order decoded, None); (None, why) for an entry that cannot
    be believed; (None, None) when there is none."""
    path = entry_file(key)
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError):
        return None, f"cache entry {path.name} is unreadable; decoded again"
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        return None, f"cache entry {path.name} was written by another version or under another key; decoded again"
    rows = entry.get("rows")
    if not isinstance(rows, list) or entry.get("check") != _check(rows):
        return None, f"cache entry {path.name} disagrees with its check (damaged); decoded again"
    try:
        return [Decoded(lanes[r["lane"]], r["prompt"], list(r["roots"]), list(r["accepted"]),
                        [list(e) for e in r["expected"]], list(r["ids"]), r["length"]) for r in rows], None
    except (KeyError, IndexError, TypeError):
        return None, f"cache entry {path.name} does not hold this loop's rows; decoded again"


def save(key: list[list[str]], lanes: list[Lane], decoded: list[Decoded]) -> None:
    """Write the entry (temporary file renamed into place); an unwritable cache costs the next
    run a decode, never this run's result."""
    index = {id(ln): i for i, ln in enumerate(lanes)}
    rows = [_row(o, index[id(o.lane)]) for o in decoded]
    path = entry_file(key)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"format": FORMAT, "key": key, "rows": rows, "check": _check(rows)}))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
    except BaseException:                 # an interrupt leaves no half-written entry
        tmp.unlink(missing_ok=True)
        raise
