"""Is a tiny target good enough to diagnose with? Greedy continuations that
are varied and structured (not loops) make acceptance numbers meaningful.

Measures, per continuation of n tokens:
  distinct_2  = |distinct bigrams| / (n - 1)      1.0: no bigram repeats; a
                                                  4-token loop over 64 tokens gives 4/63 = 0.06
  loop_period = smallest p <= 8 such that the last 32 tokens repeat with
                period p (0 when they do not): what a stuck greedy decode shows

This module knows token sequences and a model's generate(); nothing about files.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diag.zoo.corpus import Document


@dataclass(frozen=True)
class Continuation:
    prompt: str
    text: str
    distinct_2: float
    loop_period: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def distinct_2(ids: list[int]) -> float:
    if len(ids) < 2:
        return 1.0
    return len(set(zip(ids, ids[1:]))) / (len(ids) - 1)


def loop_period(ids: list[int], tail: int = 32, max_period: int = 8) -> int:
    """Example: [.., 5, 6, 7, 5, 6, 7, 5, 6, 7] (tail all period 3) -> 3."""
    end = ids[-tail:]
    if len(end) < tail:
        return 0
    for p in range(1, max_period + 1):
        if all(end[i] == end[i - p] for i in range(p, len(end))):
            return p
    return 0


def python_prompts(docs: tuple[Document, ...], count: int = 8, lines: int = 6) -> list[str]:
    """Code, not licence headers: from each of the first `count` held-out files, the
    first line starting with "def " or "class " (at any indent) and the non-empty lines
    after it, `lines` in all; a file without one gives its first `lines` non-empty lines.

    A prompt ends on code, never on "\n": byte-level BPE merges a newline with the next
    line's indentation ("\n        "), so a bare trailing "\n" token is rare in training
    and sends a tiny model into blank-line loops (seen: deepseek-tiny, 8 of 8 prompts)."""
    prompts = []
    for d in docs[:count]:
        body = [ln for ln in d.text.splitlines() if ln.strip()]
        start = next((i for i, ln in enumerate(body) if ln.lstrip().startswith(("def ", "class "))), 0)
        prompts.append("\n".join(body[start:start + lines]).rstrip())
    return prompts


@torch.no_grad()
def greedy_continuations(model, tokenizer, prompts: list[str], max_new_tokens: int = 64) -> list[Continuation]:
    """Greedy decode of all prompts (bos + text) in one left-padded batch:
    prompts of 5 and 3 ids -> rows [a a a a a], [pad pad b b b], mask 0 on the pads."""
    encs = [tokenizer.encode(p).ids for p in prompts]
    width, pad = max(len(e) for e in encs), model.config.pad_token_id
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in encs])                  # [P, width]
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encs])
    gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                         max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    out = []
    for prompt, row in zip(prompts, gen[:, width:].tolist()):
        out.append(Continuation(prompt, tokenizer.decode(row), distinct_2(row), loop_period(row)))
    return out


def summarize(conts: list[Continuation]) -> dict:
    """Mean distinct-2, how many loop, and how many continuations are pairwise distinct."""
    return {
        "mean_distinct_2": sum(c.distinct_2 for c in conts) / max(1, len(conts)),
        "looping": sum(1 for c in conts if c.loop_period),
        "distinct_texts": len({c.text for c in conts}),
        "count": len(conts),
    }
