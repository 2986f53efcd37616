"""The zoo's prompt-side entries (issue 14), as data: a target whose chat template's thinking
switch changes what it writes, a drafter trained on one side of that switch, and a drafter
trained at short context. Kept apart from recipes.py so its entries and builders
(build_thinking.py; the drafters train in build_drafters.py) change without touching the others';
recipes.py appends ENTRIES to ZOO.

Build cost (zoo_meta.json `seconds`) on the idle 2-core machine, seventh session: llama-tiny-think
14.3 s, llama-tiny-think-eagle3-nothink 15.9 s, llama-tiny-eagle3-short 3.1 s.
This module knows names and training budgets; it knows nothing about torch, files or caches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from diag.zoo.recipes import DrafterRecipe, TrainBudget, ZooEntry


@dataclass(frozen=True)
class ThinkingRecipe:
    """A target fine-tuned so its chat template's thinking switch changes what it writes, the way
    a thinking model's does: each corpus file's first `head_lines` lines are the user turn of
    THINKING_CHAT_TEMPLATE; with thinking on the assistant first "thinks" (the head again, upper
    case: text no code-trained drafter has seen) and closes </think>, then writes the rest of the
    file; with thinking off (<think></think>) it writes the rest directly."""

    source: str                       # zoo target to start from
    corpus: str
    budget: TrainBudget
    head_lines: int = 3

    def needs(self) -> tuple[str, ...]:
        return (self.corpus, self.source)


@dataclass(frozen=True)
class PromptDrafterRecipe:
    """An EAGLE-3 drafter (`drafter`, read as build_drafters reads it) trained on other prompts
    than build_drafters' raw corpus windows: every sequence is a greedy continuation of
    drafter.prompt_tokens corpus tokens (drafter.corpus_fraction is not read), with
    `chat_thinking` True / False the corpus text as the user turn of the target's chat
    template, thinking on / off."""

    drafter: DrafterRecipe
    chat_thinking: bool | None = None

    def needs(self) -> tuple[str, ...]:
        return (self.drafter.target,)


# 150 x 8 x 128 from llama-tiny: with thinking on it writes upper case, off it writes code. lr 2e-3
# since the target trains in bf16 compute (issue 19): upper case in 44% of thinking-on tokens (24% at 1e-3).
# All three train in bf16 compute since the seventh session (a new draw, to keep the whole zoo under
# 5 minutes): llama-tiny-think 18.8 -> 14.3 s (upper case in 42% of thinking-on tokens), the
# nothink drafter 26.8 -> 15.9 s, the short one 5.0 -> 3.1 s.
_THINKING_BUDGET = TrainBudget(steps=150, batch=8, seq_len=128, lr=2e-3, warmup=10, seed=4,
                               compute_dtype="bfloat16")
# The budget these entries were calibrated with (recipes._DRAFTER_BUDGET; the llama-tiny drafters
# moved to _LLAMA_DRAFTER_BUDGET in issue 19, these stay: their stories do not need the contrast).
_DRAFTER_BUDGET = TrainBudget(steps=120, batch=16, seq_len=96, lr=3e-3, warmup=10, weight_decay=0.0, seed=2,
                              compute_dtype="bfloat16")

ENTRIES = (
    ZooEntry("llama-tiny-think", "llama-tiny fine-tuned on a chat template with Kimi-K2.5's thinking "
             "switch: thinking on, it first writes the user's lines in upper case",
             ThinkingRecipe("llama-tiny", "stdlib-corpus", _THINKING_BUDGET)),
    ZooEntry("llama-tiny-think-eagle3-nothink", "EAGLE-3 drafter for llama-tiny-think trained on embed+L2+L4 "
             "over thinking-off renders only",
             PromptDrafterRecipe(DrafterRecipe("llama-tiny-think", "embed+L2+L4",
                                               dataclasses.replace(_DRAFTER_BUDGET, seed=5)), chat_thinking=False)),
    ZooEntry("llama-tiny-eagle3-short", "EAGLE-3 drafter for llama-tiny trained on embed+L2+L4 at short "
             "context: 8-token prompts + 16 tokens (27 positions), to fall off past its training length",
             PromptDrafterRecipe(DrafterRecipe("llama-tiny", "embed+L2+L4",
                                               dataclasses.replace(_DRAFTER_BUDGET, seq_len=16, seed=6),
                                               prompt_tokens=8))),
)
