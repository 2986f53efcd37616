"""Greedy continuations of the target, batched over prompts with a KV cache.

Prompts are left-padded for generation (so every row's next token sits in the last
column) and the continuation is cut at the first end-of-sequence token (kept). This
module knows token ids only: prompts arrive tokenized, continuations leave as id lists.
"""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p):] = 1
    return ids, mask


def cut_at_eos(tokens: list[int], eos_ids: set[int]) -> list[int]:
    """[5, 9, 2, 7] with eos {2} -> [5, 9, 2]."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1]
    return tokens


@torch.no_grad()
def greedy_continuations(model: nn.Module, prompts: list[list[int]], max_new_tokens: int, *,
                         pad_id: int, eos_ids: set[int], batch_size: int = 16,
                         progress: bool = True) -> list[list[int]]:
    """Greedy (argmax) continuation of each prompt, at most max_new_tokens long."""
    dev = next(model.parameters()).device
    out: list[list[int]] = []
    batches = range(0, len(prompts), batch_size)
    for start in tqdm(batches, desc="target: greedy continuations", disable=not progress, leave=False):
        chunk = prompts[start:start + batch_size]
        ids, mask = _left_pad(chunk, pad_id)
        gen = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             pad_token_id=pad_id, eos_token_id=None, num_beams=1,
                             temperature=None, top_p=None, top_k=None)
        new = gen[:, ids.shape[1]:].cpu().tolist()
        out.extend(cut_at_eos(row, eos_ids) for row in new)
    return out
