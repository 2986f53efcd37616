"""Acceptance per prompt category (a dataset, a task type): the pooled accept length of the
prompts that share a category, with a bootstrap interval over those prompts.

The category is whatever the prompt set's reader attached (a field of the prompt, or the file
the prompt came from); prompts keep their trajectory rounds, so a category pools its prompts'
rounds exactly as the whole set does. Worked example: prompts a (code, rounds [2, 1]),
b (code, rounds [0]), c (math, rounds [3]) -> code: 1 + 3/3 = 2.00 over 2 prompts, math:
1 + 3/1 = 4.00 over 1 prompt (an interval of one prompt is the point itself).

This module knows per-prompt rounds and statistics; nothing about models or files.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.stats import accept_length_ci


@dataclass(frozen=True)
class CategoryAcceptance:
    category: str
    prompts: int
    rounds: int
    accept_length: float | None          # pooled over the category's trajectory rounds
    ci95: tuple[float | None, float | None]

    def to_json(self) -> dict:
        return {"category": self.category, "prompts": self.prompts, "rounds": self.rounds,
                "accept_length": self.accept_length, "ci95": list(self.ci95)}

    @classmethod
    def from_json(cls, d: dict) -> "CategoryAcceptance":
        return cls(d["category"], d["prompts"], d["rounds"], d["accept_length"], tuple(d["ci95"]))


def grouped(per_prompt) -> dict[str, list]:
    """category -> its prompts (PromptRounds or per-prompt dicts), in first-seen order."""
    out: dict[str, list] = {}
    for p in per_prompt:
        cat = p.get("category", "") if isinstance(p, dict) else p.category
        out.setdefault(cat, []).append(p)
    return out


def by_category(per_prompt, *, seed: int, n_boot: int) -> tuple[CategoryAcceptance, ...]:
    """One row per category, sorted by name (see the module docstring)."""
    rows = []
    for cat, prompts in sorted(grouped(per_prompt).items()):
        rounds = [list(p.accepted) for p in prompts]
        total = sum(len(r) for r in rounds)
        point, lo, hi = accept_length_ci(rounds, seed=seed, n=n_boot) if total else (None, None, None)
        rows.append(CategoryAcceptance(cat, len(prompts), total, point, (lo, hi)))
    return tuple(rows)
