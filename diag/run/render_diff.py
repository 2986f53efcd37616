"""Where two renderings of the same prompts part: the first differing token, decoded.

Index arithmetic, worked: serving ids [0, 4, 9, 17, 5, 30] and trained ids [0, 4, 9, 17, 5, 12, 41]
share the first 5 ids, so the first difference is at index 5; `context` shows the shared ids
just before it (decoded), `serving` and `other` the next `width` ids of each from index 5.
A rendering that only appends (ids [0, 4] vs [0, 4, 7]) differs at index 2, where the shorter
one has nothing left (decoded as "").

This module knows token ids and a decode function; nothing about models or files.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

CONTEXT = 4        # shared tokens shown before the difference
WIDTH = 12         # tokens shown from the difference on


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ (the shorter length when one is a
    prefix of the other), None when they are equal. [1, 2, 3] vs [1, 5] -> 1."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def difference(pid: str, serving: list[int], other: list[int], decode: Callable[[list[int]], str]) -> dict | None:
    k = first_difference(serving, other)
    if k is None:
        return None
    return {"prompt": pid, "index": k, "context": decode(serving[max(0, k - CONTEXT):k]),
            "serving": decode(serving[k:k + WIDTH]), "other": decode(other[k:k + WIDTH]),
            "serving_tokens": len(serving), "other_tokens": len(other)}


def differences(serving: list[tuple[str, str, list[int]]], other: list[tuple[str, str, list[int]]],
                decode: Callable[[list[int]], str], *, examples: int = 3) -> dict:
    """Over a prompt set under two renderings (same prompts, same order): how many prompts
    render identically, the most common way they part, and the first `examples` differences."""
    rows = [d for (pid, _, a), (_, _, b) in zip(serving, other) if (d := difference(pid, a, b, decode))]
    common = Counter((d["serving"], d["other"]) for d in rows).most_common(1)
    return {"prompts": len(serving), "identical": len(serving) - len(rows),
            "most_common": None if not common else {"serving": common[0][0][0], "other": common[0][0][1],
                                                    "prompts": common[0][1]},
            "examples": rows[:examples]}
