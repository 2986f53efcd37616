"""One teacher-forced target pass: the capture points some layout needs, and the argmax.

Capture points (DESIGN.md §2) map onto a transformers decoder as forward hooks:
  embed  -> output of the input embedding                     (= hidden_states[0])
  L{i}   -> output of decoder layer i-1, 1 <= i <= N          (= hidden_states[i], i < N)
  final  -> output of the final norm                          (= hidden_states[N])
Worked example, N = 6: L3 is the output of layers[2]; L6 is the output of layers[5], un-normed.

The argmax at index j is the target's greedy prediction of token j+1, computed from the
final-normed state through lm_head in vocabulary chunks, never a [tokens, vocab] tensor at
once. This module registers hooks and runs forwards; it knows nothing about drafters,
files or reports.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from diag.layouts import CapturePoint


@dataclass
class Captured:
    states: dict[str, torch.Tensor]   # point name -> [B, T, H]
    argmax: torch.Tensor              # [B, T] int64: greedy prediction of token j+1 at index j


def decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, nn.ModuleList, nn.Module, nn.Module]:
    """(base model, embed, layers, final norm, lm_head) of a transformers causal LM."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if layers is None or norm is None:
        raise TypeError(f"{type(model).__name__}: no `layers`/`norm` on its decoder; not a decoder-only LM")
    return base, model.get_input_embeddings(), layers, norm, model.get_output_embeddings()


def _module_for(point: CapturePoint, embed, layers, norm) -> nn.Module:
    if point.is_final:
        return norm
    if point.index == 0:
        return embed
    return layers[point.index - 1]


@contextmanager
def hooks(model: nn.Module, points: tuple[CapturePoint, ...], sink: dict[str, torch.Tensor],
          to_device: torch.device | None = None):
    """Register forward hooks writing each point's output into sink[name]."""
    _, embed, layers, norm, _ = decoder_parts(model)
    handles = []
    for p in points:
        def grab(_mod, _inp, out, name=p.name):
            t = out[0] if isinstance(out, (tuple, list)) else out
            sink[name] = t.detach() if to_device is None else t.detach().to(to_device)
        handles.append(_module_for(p, embed, layers, norm).register_forward_hook(grab))
    try:
        yield sink
    finally:
        for h in handles:
            h.remove()


def chunked_argmax(hidden: torch.Tensor, lm_head: nn.Module, chunk: int = 32768) -> torch.Tensor:
    """hidden [..., H] (final-normed) -> argmax over the vocabulary [...], chunk rows of lm_head
    at a time. Ties go to the lowest id, as torch.argmax does."""
    weight = lm_head.weight                                               # [V, H]
    flat = hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype).to(weight.device)
    best_val = torch.full((flat.shape[0],), float("-inf"), device=weight.device)
    best_idx = torch.zeros(flat.shape[0], dtype=torch.long, device=weight.device)
    for start in range(0, weight.shape[0], chunk):
        logits = flat @ weight[start:start + chunk].T                    # [N, chunk]
        if getattr(lm_head, "bias", None) is not None:
            logits = logits + lm_head.bias[start:start + chunk]
        val, idx = logits.float().max(-1)
        better = val > best_val
        best_val = torch.where(better, val, best_val)
        best_idx = torch.where(better, idx + start, best_idx)
    return best_idx.view(hidden.shape[:-1]).cpu()


@torch.no_grad()
def capture_pass(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 points: tuple[CapturePoint, ...], *, vocab_chunk: int = 32768,
                 to_device: torch.device | str | None = "cpu") -> Captured:
    """input_ids, attention_mask [B, T] (right padding). Captures exactly `points` plus the argmax.
    Each captured state streams to `to_device` (host memory by default) as its layer finishes,
    so GPU memory holds at most one captured point at a time beyond the model's own
    activations; the final-normed state stays where it is for the chunked argmax."""
    base, _, _, norm, lm_head = decoder_parts(model)
    target = torch.device(to_device) if to_device is not None else None
    sink: dict[str, torch.Tensor] = {}
    final: dict[str, torch.Tensor] = {}
    dev = next(model.parameters()).device
    with hooks(model, tuple(points), sink, target), hooks(model, (CapturePoint("final"),), final, None):
        base(input_ids=input_ids.to(dev), attention_mask=attention_mask.to(dev), use_cache=False)
    argmax = chunked_argmax(final["final"], lm_head, vocab_chunk)
    return Captured({p.name: sink[p.name] for p in points}, argmax)
