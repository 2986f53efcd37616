"""The target side of a replay: continuations, then one teacher-forced capture pass.

Sequences are prompt + continuation. The continuation is the target's greedy one (KV-cached
generation) or a recorded one (what a live server produced). The capture pass runs over the
sequences in token-budget batches (right padded; on a target placed over several devices,
the microbatches of a pipeline through its layer stages, stages.py) and keeps, per sequence,
the captured points [T, H] and the argmax [T] (argmax[j] = the target's greedy token after j).

This module knows the target model and token ids; it knows nothing about drafters, files
or reports (the on-disk cache of a TargetPass lives in pass_cache.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from diag.target.capture import capture_pass
from diag.target.generate import cut_at_eos, greedy_continuations
from diag.target.stages import Stage, staged_captures, stages_of
from diag.layouts import CapturePoint


@dataclass
class Sequence:
    prompt_id: str
    category: str
    prompt_len: int
    ids: torch.Tensor              # [T] int64, prompt then continuation (then any lookahead)
    end: int | None = None         # prompt + what the server emits; ids past it are the target's greedy
                                   # lookahead that scores the request's last rounds (None: len(ids))

    @property
    def emitted(self) -> int:
        """Length of the emitted sequence: ids [5 prompt + 6 emitted + 3 lookahead] -> 11."""
        return len(self.ids) if self.end is None else self.end


@dataclass
class TargetPass:
    regime: str
    sequences: list[Sequence]
    states: dict[str, list[torch.Tensor]]   # point name -> per sequence [T_i, H]
    argmax: list[torch.Tensor]              # per sequence [T_i]
    cached: bool = False

    def agreement_with_sequence(self) -> float:
        """Fraction of continuation tokens equal to the target's own argmax along the sequence:
        1.0 for the target's own greedy continuation (up to numerics), lower for a recorded one."""
        hit = total = 0
        for seq, am in zip(self.sequences, self.argmax):
            cont = seq.ids[seq.prompt_len:]
            pred = am[seq.prompt_len - 1:-1]
            hit += int((cont == pred).sum())
            total += len(cont)
        return hit / max(total, 1)


def build_sequences(model: nn.Module, prompts: list[tuple[str, str, list[int]]], max_new_tokens: int, *,
                    pad_id: int, eos_ids: set[int], recorded: dict[str, list[int]] | None = None,
                    batch_size: int = 16, progress: bool = True, lookahead: int = 0,
                    microbatches: int = 1) -> list[Sequence]:
    """prompts: (id, category, token ids). Recorded continuations win over generation (and have
    no lookahead). microbatches: parts of each generation batch (greedy_continuations). lookahead > 0: the target's greedy tokens continue that far past the end (past
    max_new_tokens or past the end-of-sequence token), `end` marks where the emitted part stops.
    Example: max_new_tokens 4, lookahead 2, greedy [5, 1, 7, 8, 9, 3] with eos {1} -> emitted
    [5, 1], ids prompt + [5, 1, 7, 8], end = prompt + 2."""
    if recorded is not None:
        conts = [recorded[pid][:max_new_tokens] for pid, _, _ in prompts]
        return [Sequence(pid, cat, len(p), torch.tensor(p + c, dtype=torch.long))
                for (pid, cat, p), c in zip(prompts, conts)]
    longer = greedy_continuations(model, [p for _, _, p in prompts], max_new_tokens + lookahead, pad_id=pad_id,
                                  eos_ids=set(), batch_size=batch_size, progress=progress,
                                  microbatches=microbatches)
    out = []
    for (pid, cat, p), c in zip(prompts, longer):
        emitted = len(cut_at_eos(c[:max_new_tokens], eos_ids))
        ids = torch.tensor(p + c[:emitted + lookahead], dtype=torch.long)
        out.append(Sequence(pid, cat, len(p), ids, len(p) + emitted if lookahead else None))
    return out


def budget_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices grouped so that len(group) * max length <= token_budget, longest first.
    Example: lengths [5, 9, 3, 8], budget 18 -> [[1, 3], [0, 2]] (2*9 <= 18, 2*5 <= 18)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def pad_right(rows: list[torch.Tensor], value: int | float = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[T_i, ...] tensors -> padded [B, T_max, ...] and valid mask [B, T_max]."""
    T = max(r.shape[0] for r in rows)
    out = rows[0].new_full((len(rows), T, *rows[0].shape[1:]), value)
    valid = torch.zeros(len(rows), T, dtype=torch.bool)
    for b, r in enumerate(rows):
        out[b, :r.shape[0]] = r
        valid[b, :r.shape[0]] = True
    return out, valid


def run_capture(model: nn.Module, sequences: list[Sequence], points: tuple[CapturePoint, ...], *,
                regime: str, token_budget: int, progress: bool = True,
                store: torch.device | str = "cpu", stages: list[Stage] | None = None) -> TargetPass:
    """Teacher-forced pass over every sequence in token-budget batches. A target whose layers
    span several devices (stages: stages_of(model) unless given) runs the batches as the
    microbatches of a pipeline (stages.py), one stage per device busy at once; the captures
    and argmax are the same tensors as one batch after another gives."""
    states: dict[str, list] = {p.name: [None] * len(sequences) for p in points}
    argmax: list = [None] * len(sequences)
    groups = budget_batches([len(s.ids) for s in sequences], token_budget)
    stages = stages_of(model) if stages is None else stages
    desc = f"target pass [{regime}]"
    for group, got in zip(groups, _captured(model, sequences, groups, points, stages, store, desc, progress)):
        for b, i in enumerate(group):
            n = len(sequences[i].ids)
            for name, t in got.states.items():
                states[name][i] = t[b, :n].clone()
            argmax[i] = got.argmax[b, :n].clone()
    return TargetPass(regime, sequences, states, argmax)


def capture_microbatches(sequences: list[Sequence], token_budget: int) -> int:
    """How many microbatches the pass over `sequences` streams through a pipeline: its
    token-budget batches. 48 sequences of at most 1,422 tokens, budget 16384 -> 5."""
    return len(budget_batches([len(s.ids) for s in sequences], token_budget))


def _captured(model, sequences, groups, points, stages, store, desc: str, progress: bool):
    """One Captured per group, in order: staged when there are several stages, else batch
    after batch (lazily, so one batch's tensors are alive at a time)."""
    padded = lambda group: pad_right([sequences[i].ids for i in group])  # noqa: E731
    if len(stages) > 1:
        batches = [(ids, valid.long()) for ids, valid in map(padded, groups)]
        return staged_captures(model, batches, points, stages, store=store, desc=desc, progress=progress)
    return (capture_pass(model, ids, valid.long(), points, to_device=store)
            for ids, valid in map(padded, tqdm(groups, desc=desc, disable=not progress, leave=False)))
