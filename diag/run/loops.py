"""Loops: repeated n-gram cycles in the continuations, and the accept length with and without
the verify rounds that sit inside them.

A greedy decode that falls into a cycle ("self.x = x\\n" over and over, or two tokens
alternating) is trivially predictable: every drafter accepts nearly everything there, so a few
looping continuations inflate the headline accept length (a two-token loop reads 3.9 on a
depth-3 chain). The detector (diag.zoo.quality has a tail-only loop_period for the zoo's own
checks; this one finds every cycle anywhere in a continuation):

    for each period p = 1..MAX_PERIOD, token i "repeats" when ids[i] == ids[i-p]; a run of
    consecutive repeats of length >= max(p * (MIN_REPEATS - 1), MIN_RUN) is a loop: the cycle
    ids[start-p:start] shown MIN_REPEATS times or more. Smaller periods claim tokens first.

Worked example: ids [5, 1, 2, 1, 2, 1, 2, 1, 2, 9]: with p = 2, ids[3..8] repeat (1 == ids[1],
2 == ids[2], ...), a run of 6 >= max(2 * 2, 4) -> a loop of period 2 over indices 1..8, its
repeating tokens 3..8. A round rooted at sequence index j drafts t_{j+2}.. and is "in a loop"
when t_{j+2} is a repeating token. This module knows token ids and rounds; no models, no files.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.stats import accept_length_ci, paired_bootstrap_diff

MAX_PERIOD = 8
MIN_REPEATS = 3
MIN_RUN = 4


@dataclass(frozen=True)
class Loop:
    period: int
    start: int          # first index of the first cycle
    end: int            # one past the last repeating index

    @property
    def repeating(self) -> range:
        return range(self.start + self.period, self.end)


def find_loops(ids: list[int]) -> list[Loop]:
    """Every loop (module docstring), ordered by start."""
    claimed = [False] * len(ids)
    loops = []
    for p in range(1, MAX_PERIOD + 1):
        need = max(p * (MIN_REPEATS - 1), MIN_RUN)
        i = p
        while i < len(ids):
            if ids[i] != ids[i - p] or claimed[i]:
                i += 1
                continue
            j = i
            while j < len(ids) and ids[j] == ids[j - p] and not claimed[j]:
                j += 1
            if j - i >= need:
                loops.append(Loop(p, i - p, j))
                claimed[i:j] = [True] * (j - i)
            i = j
    return sorted(loops, key=lambda lp: lp.start)


def repeating_mask(ids: list[int]) -> list[bool]:
    """[len(ids)] True where a token repeats a cycle. The example above -> True at 3..8."""
    mask = [False] * len(ids)
    for lp in find_loops(ids):
        for k in lp.repeating:
            mask[k] = True
    return mask


def split_rounds(per_prompt, masks: list[list[bool]]) -> tuple[list[list[int]], list[list[int]]]:
    """Trajectory rounds per prompt -> (rounds outside loops, rounds inside loops).
    masks[i] covers sequence i's indices; a round rooted at j is inside when masks[i][j+2]."""
    out, inside = [], []
    for p, mask in zip(per_prompt, masks):
        flags = [j + 2 < len(mask) and mask[j + 2] for j in p.roots]
        out.append([a for a, f in zip(p.accepted, flags) if not f])
        inside.append([a for a, f in zip(p.accepted, flags) if f])
    return out, inside


def _al(rounds: list[list[int]], seed: int, n_boot: int) -> dict:
    if not sum(len(r) for r in rounds):
        return {"accept_length": None, "ci95": [None, None], "rounds": 0}
    point, lo, hi = accept_length_ci(rounds, seed=seed, n=n_boot)
    return {"accept_length": point, "ci95": [lo, hi], "rounds": sum(len(r) for r in rounds)}


def loop_section(sequences, evaluation, decode, *, seed: int, n_boot: int, examples: int = 3) -> dict:
    """`sequences`: the reference pass's; `evaluation`: the trained layout on the primary tree."""
    masks, found = [], []
    for s in sequences:
        ids = s.ids.tolist()
        cont = find_loops(ids[s.prompt_len:s.emitted])
        mask = [False] * len(ids)
        for lp in cont:
            for k in lp.repeating:
                mask[s.prompt_len + k] = True
            found.append((s, lp))
        masks.append(mask)
    outside, inside = split_rounds(evaluation.per_prompt, masks)
    everything = [list(p.accepted) for p in evaluation.per_prompt]
    sec = {"layout": evaluation.layout, "tree": evaluation.tree, "sequences": len(sequences),
           "sequences_with_loops": len({id(s) for s, _ in found}),
           "periods": sorted({lp.period for _, lp in found}),
           "loop_tokens": sum(sum(m) for m in masks),
           "continuation_tokens": sum(s.emitted - s.prompt_len for s in sequences),
           "all": _al(everything, seed, n_boot), "without_loops": _al(outside, seed, n_boot),
           "in_loops": _al(inside, seed, n_boot), "difference": None,
           "examples": [{"prompt": s.prompt_id, "period": lp.period, "from": s.prompt_len + lp.start,
                         "to": s.prompt_len + lp.end, "cycle": decode(s.ids[s.prompt_len + lp.start:
                                                                              s.prompt_len + lp.start + lp.period].tolist())}
                        for s, lp in found[:examples]]}
    if sec["in_loops"]["rounds"] and sec["without_loops"]["rounds"]:
        d, lo, hi = paired_bootstrap_diff(everything, outside, seed=seed, n=n_boot)
        sec["difference"] = {"difference": d, "ci95": [lo, hi]}
    return sec
