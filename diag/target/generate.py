"""Greedy continuations of the target, batched over prompts with a KV cache.

Prompts are left-padded for generation (so every row's next token sits in the last
column) and the continuation is cut at the first end-of-sequence token (kept). A batch may
be split into microbatches that go through a multi-GPU placement's stages at once
(stage_gates.py).

Two paths, the same argmax: a target on one CUDA device decodes on diag's own cache (`on_cache`):
the prompt's keys and all max_new_tokens slots preallocated (kv_buffer.py), every step the same
shapes (the attention reads the whole buffer, the slots not yet written masked), so the step,
head and argmax included, is replayed from one CUDA graph (verify_graphs.py) and the tokens stay
on the device until the batch ends: a step is a replay and a few copies, not the ~40 launches a
layer of transformers' generate, with a host sync at every step (issue 36: 2.62 ms a layer-step
at batch 8 on the H100, 0.23 of the copy bandwidth). Elsewhere (the CPU, a target placed over
several devices) transformers' generate. Worked example: prompts of 3 and 5 tokens, 4 new ->
left padded to P 5, cache of W = 5 + 3 slots (the last token is never fed back); step t (1..3)
feeds token t-1 at slot 5 + t - 1 and position len + t - 1 (row 0: 3, 4, 5) and sees the row's
valid slots up to it. This module knows token ids only: prompts arrive tokenized, continuations
leave as id lists.
"""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from diag.int4.packed import dense_held
from diag.target.kv_buffer import buffered, fixed_width, stamps
from diag.target.fused_norm import fused_norms, fused_wanted
from diag.target.mla_latent import latent_mla, latent_wanted
from diag.target.sdpa import attention_without_cudnn
from diag.target.stage_gates import run_in_stages, split_rows
from diag.target.stages import Stage, stages_of
from diag.target.tree_forward import FINAL, attention_bias, cache_layers, device_and_dtype, forward_points, head_logits
from diag.target.verify_graphs import VerifyGraphs, graphs_wanted


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
                         stages: list[Stage] | None = None, own_cache: bool = True) -> list[list[int]]:
    """Greedy (argmax) continuation of each prompt, at most max_new_tokens long. microbatches > 1:
    each batch is split into that many parts (split_rows), each generated on its own, through
    the placement's stages at once when the target spans several (stage_gates.py; stages:
    stages_of(model) unless given). A part is padded and batched on its own, so a prompt's
    continuation is the one its part gives, whether the parts run at once or in turn. own_cache
    False: transformers' generate on one CUDA device too (the bench's comparison of the two)."""
    if stages is None:
        stages = stages_of(model) if microbatches > 1 else []       # one part a batch: nothing to overlap
    out: list[list[int]] = []
    batches = range(0, len(prompts), batch_size)
    for start in tqdm(batches, desc="target: greedy continuations", disable=not progress, leave=False):
        parts = split_rows(prompts[start:start + batch_size], microbatches)
        jobs = [lambda part=part: _greedy(model, part, max_new_tokens, pad_id, own_cache) for part in parts]
        done = run_in_stages(model, stages, jobs) if len(stages) > 1 and len(jobs) > 1 else [j() for j in jobs]
        out.extend(cut_at_eos(row, eos_ids) for rows in done for row in rows)
    return out


@torch.no_grad()
def _greedy(model: nn.Module, prompts: list[list[int]], max_new_tokens: int, pad_id: int,
            own_cache: bool = True) -> list[list[int]]:
    """One generation call: the prompts left padded together, exactly max_new_tokens each; on
    diag's own cache from CUDA graphs where the target sits on one CUDA device (module docstring)."""
    dev = next(model.parameters()).device
    graphs = VerifyGraphs()
    with attention_without_cudnn(dev), latent_mla(model, latent_wanted(dev)), fused_norms(model, fused_wanted(dev)), \
            dense_held(model):                     # the CPU's dequantized experts kept for the call's steps
        if own_cache and graphs.how(model) == "graph":   # one device (over several: transformers' generate)
            return on_cache(model, prompts, max_new_tokens, pad_id, graphs=graphs if graphs_wanted() else None)
        ids, mask = _left_pad(prompts, pad_id)
        gen = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             pad_token_id=pad_id, eos_token_id=None, num_beams=1,
                             temperature=None, top_p=None, top_k=None)
    return gen[:, ids.shape[1]:].cpu().tolist()


@torch.no_grad()
def on_cache(model: nn.Module, prompts: list[list[int]], max_new_tokens: int, pad_id: int, *,
             graphs: VerifyGraphs | None = None) -> list[list[int]]:
    """Greedy decoding on a preallocated cache at fixed widths (module docstring), each step
    replayed from `graphs` where given and usable, else run eagerly: the same numbers."""
    dev, dtype = device_and_dtype(model)
    if max_new_tokens <= 0:
        return [[] for _ in prompts]
    ids, mask = _left_pad(prompts, pad_id)
    ids, seen = ids.to(dev), mask.to(dev).bool()                            # [B, P]
    B, P = ids.shape
    width = P + max_new_tokens - 1                                           # W: the last token is not fed back
    pos = (seen.long().cumsum(-1) - 1).clamp(min=0)                           # left pads: real tokens from 0
    causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
    bias = attention_bias(seen[:, :0], causal[None] & seen[:, None], dtype)  # [B, 1, P, P]: causal, pads unseen
    sink, cache = forward_points(model, ids, pos, bias, None, ())
    out = torch.empty(B, max_new_tokens, dtype=torch.long, device=dev)       # [B, N], on the device till the end
    out[:, 0] = head_logits(model, sink[FINAL.name][:, -1]).argmax(-1)
    if max_new_tokens > 1:
        _steps(model, buffered(cache, width), out, seen, pos[:, -1] + 1, graphs)
    return out.cpu().tolist()


def _steps(model, cache, out: torch.Tensor, seen: torch.Tensor, start: torch.Tensor,
           graphs: VerifyGraphs | None) -> None:
    """Steps 1..N-1: out[:, t] from out[:, t-1] fed at slot P + t - 1 (module docstring).
    seen [B, P] the prompts' valid slots; start [B] each row's first new position."""
    B, P = seen.shape
    width = P + out.shape[1] - 1
    valid = torch.cat([seen, seen.new_ones(B, out.shape[1] - 1)], dim=-1)          # [B, W]
    col = torch.arange(width, device=seen.device)
    slots = torch.arange(P, width, device=seen.device)
    dtype = device_and_dtype(model)[1]
    at = P

    def step(x: dict) -> dict:                       # the same shapes every step: one graph replays it
        for layer in cache_layers(cache):            # update() appends after the view: end it at the slot
            layer.crop_to(at)
        see = valid & (col <= x["slot"])                                            # [B, W]
        bias = torch.zeros(B, 1, 1, width, dtype=dtype, device=seen.device).masked_fill_(
            ~see[:, None, None], torch.finfo(dtype).min)                           # [B, 1, 1, W]
        with fixed_width(cache, at + 1, x["slot"]):
            sink, _ = forward_points(model, x["ids"], start[:, None] + (x["slot"] - P), bias, cache, ())
        return {"next": head_logits(model, sink[FINAL.name][:, -1]).argmax(-1)}

    use = graphs is not None and graphs.usable(model)
    for t in range(1, out.shape[1]):
        at = P + t - 1
        x = {"ids": out[:, t - 1:t], "slot": slots[t - 1:t]}
        got = graphs.run(stamps(cache), x, ("greedy", B, width), step, model=model) if use else None
        out[:, t] = (got or step(x))["next"]
