"""Greedy continuations of the target, batched over prompts with a KV cache.

Prompts are left-padded for generation (so every row's next token sits in the last
column) and the continuation is cut at the first end-of-sequence token (kept). A batch may
be split into microbatches that go through a multi-GPU placement's stages at once
(stage_gates.py). This module knows token ids only: prompts arrive tokenized, continuations
leave as id lists.
"""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from diag.target.mla_latent import latent_mla, latent_wanted
from diag.target.sdpa import attention_without_cudnn
from diag.target.stage_gates import run_in_stages, split_rows
from diag.target.stages import Stage, stages_of


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
                         progress: bool = True, microbatches: int = 1,
                         stages: list[Stage] | None = None) -> list[list[int]]:
    """Greedy (argmax) continuation of each prompt, at most max_new_tokens long. microbatches > 1:
    each batch is split into that many parts (split_rows), each generated on its own, through
    the placement's stages at once when the target spans several (stage_gates.py; stages:
    stages_of(model) unless given). A part is padded and batched on its own, so a prompt's
    continuation is the one its part gives, whether the parts run at once or in turn."""
    if stages is None:
        stages = stages_of(model) if microbatches > 1 else []       # one part a batch: nothing to overlap
    out: list[list[int]] = []
    batches = range(0, len(prompts), batch_size)
    for start in tqdm(batches, desc="target: greedy continuations", disable=not progress, leave=False):
        parts = split_rows(prompts[start:start + batch_size], microbatches)
        jobs = [lambda part=part: _greedy(model, part, max_new_tokens, pad_id) for part in parts]
        done = run_in_stages(model, stages, jobs) if len(stages) > 1 and len(jobs) > 1 else [j() for j in jobs]
        out.extend(cut_at_eos(row, eos_ids) for rows in done for row in rows)
    return out


@torch.no_grad()
def _greedy(model: nn.Module, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> list[list[int]]:
    """One generation call: the prompts left padded together, exactly max_new_tokens each."""
    dev = next(model.parameters()).device
    ids, mask = _left_pad(prompts, pad_id)
    with attention_without_cudnn(dev), latent_mla(model, latent_wanted(dev)):
        gen = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             pad_token_id=pad_id, eos_token_id=None, num_beams=1,
                             temperature=None, top_p=None, top_k=None)
    return gen[:, ids.shape[1]:].cpu().tolist()

