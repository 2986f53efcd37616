"""diag's prediction of one served configuration, as the engine's own counters.

A server runs one drafter with one layout, one chain of num_speculative_tokens drafts, one
dtype, greedy. Its counters (vLLM's /metrics: num_drafts, num_draft_tokens, num_accepted_tokens,
num_accepted_tokens_per_pos) are sums over the rounds its round accounting counts
(replay/round_accounting.py). This module predicts them from the same pieces `diag run` uses:
the target's greedy continuations (with the lookahead the accounting needs), one teacher-forced
capture pass, the drafter's replay of the served layout, the trajectory of each request.
Worked example: K = 3, two requests visiting a = [3, 1] and [0] -> drafts 3, draft tokens 9,
accepted 4, per position [2, 1, 1].

The caller names the served dtype (vLLM's --dtype); the drafter runs in it unless told otherwise,
as the engine runs it (inputs.served_dtypes), and both round where the engine's kernels round
(EngineRules.numerics: vLLM-CPU's float32 sums in bf16, target/engine_numerics.py). This module knows models and counts; nothing about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from diag.drafter.checkpoint import load_drafter
from diag.engines import engine, rules
from diag.layouts import Layout, union_points
from diag.replay.evaluation import trajectory_rounds
from diag.replay.replay import Variant, replay
from diag.replay.round_accounting import accounting_for
from diag.target.engine_numerics import apply_numerics
from diag.target.load import load_embed_and_head, load_target
from diag.target.passes import build_sequences, run_capture
from diag.trees import TreeShape

@dataclass(frozen=True)
class ServedCounters:
    """The four counters of one served configuration over a prompt set (vLLM's names)."""
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: tuple[int, ...]
    rounds: tuple[tuple[int, ...], ...] = ()   # per request, accepted drafts of each visited round

    @classmethod
    def from_rounds(cls, rounds: list[list[int]], k: int) -> "ServedCounters":
        flat = [a for r in rounds for a in r]
        return cls(len(flat), len(flat) * k, sum(flat), tuple(sum(a > i for a in flat) for i in range(k)),
                   tuple(tuple(r) for r in rounds))

    @property
    def accept_length(self) -> float | None:
        return None if not self.num_drafts else 1.0 + self.num_accepted_tokens / self.num_drafts

    def counts(self) -> dict:
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens, "accepted_per_pos": list(self.accepted_per_pos)}


@dataclass
class ServedPrediction:
    """The target's side, computed once per (prompts, max_tokens, dtype, deepest chain) and
    shared by every drafter, layout and chain length served on it."""
    target: Path
    dtype: torch.dtype
    prompts: list[tuple[str, str, list[int]]]
    max_tokens: int
    max_steps: int
    eos_ids: set[int]
    pad_id: int
    engine: str                 # the served release, e.g. the engine a /metrics scrape came from
    token_budget: int = 16384
    progress: bool = False

    @property
    def numerics(self) -> str:
        """Where the served engine rounds in bf16 (EngineRules.numerics; float32 is unaffected)."""
        return rules(self.engine).numerics(engine(self.engine))

    def __post_init__(self):
        self._model = None
        self._sequences = None
        self._passes = {}

    def _pass(self, layout: Layout):
        """The capture pass of the layout's points over the greedy sequences (generated once)."""
        key = tuple(p.name for p in layout.points)
        if key not in self._passes:
            if self._model is None:
                self._model, _ = load_target(self.target, dtype=self.dtype)
                apply_numerics(self._model, self.numerics)
            if self._sequences is None:
                acc = accounting_for(rules(self.engine).round_accounting(engine(self.engine)))
                self._sequences = build_sequences(self._model, self.prompts, self.max_tokens, pad_id=self.pad_id,
                                                  eos_ids=self.eos_ids, progress=self.progress,
                                                  lookahead=acc.lookahead(self.max_steps))
            self._passes[key] = run_capture(self._model, self._sequences, union_points([layout]),
                                            regime="as-loaded", token_budget=self.token_budget,
                                            progress=self.progress)
        return self._passes[key]

    def counters(self, drafter_path: Path, layout: Layout, k: int, *,
                 drafter_dtype: torch.dtype | None = None) -> ServedCounters:
        """The engine's counters for `drafter_path` served `layout` with a chain of k drafts."""
        tp = self._pass(layout)
        drafter, ckpt = load_drafter(drafter_path, dtype=drafter_dtype or self.dtype)
        drafter.set_numerics(self.numerics)
        embed, head = load_embed_and_head(self.target)
        if drafter.cfg.lm_head_from_target:
            drafter.use_target_head(head)
        shape = TreeShape(k, 1, k + 1)
        tables = {"eagle3": rules(self.engine).draft_tables(ckpt.flat, "eagle3", release=engine(self.engine))}
        res = replay(drafter, embed, head, {"as-loaded": tp}, [Variant(str(layout), "eagle3", shape)],
                     {str(layout): layout}, token_budget=self.token_budget, progress=self.progress,
                     tables=tables, accounting=accounting_for(rules(self.engine).round_accounting(engine(self.engine))))[0]
        rounds, _ = trajectory_rounds(res.accepted, res.roots)
        return ServedCounters.from_rounds(rounds, k)
