"""How many prompts one greedy-generation batch holds: as many as the KV cache leaves room
for on the GPUs the target sits on, instead of a fixed 16.

  kv bytes / token   layers * heads * (key width + value width) * dtype bytes; transformers'
                     MLA (DeepSeek-V3, Kimi) caches full keys (qk_nope + qk_rope) and values
                     (v_head_dim) per head: Kimi 61 * 64 * (192 + 128) * 2 = 2.5 MB per token
  room               sum over the target's GPUs of (total memory - what the loaded model
                     allocated) * ROOM_FRACTION, the rest left to the prefill's activations
  prefill tokens     the prefill keeps one row of logits per sequence and captures nothing, so
                     it holds as many tokens as one decoder layer's activations
                     (placement.activation_bytes without points and logits: Kimi 557 kB a
                     token) fit in the smallest GPU's other (1 - ROOM_FRACTION) share; never
                     fewer than the case's token budget, which placement reserved room for
  batch              the most rows whose caches of max_len tokens fit the room, whose prefill
                     (rows * longest prompt) stays inside the prefill tokens, at most CAP; then
                     evened out: 48 prompts, at most 32 a batch -> 2 batches of 24, not 32 + 16

Worked example: 48 prompts of at most 512 + 512 tokens on Kimi (2.5 MB per token), 200 GB
of room -> 200e9 / (1024 * 2.5e6) = 78 rows -> CAP 64; a GPU with 30 GB for activations
-> 30e9 / 557e3 = 53.8k prefill tokens = 105 rows of 512 -> one batch of 48. With only the
token budget of 16384 it would be 32 rows -> 2 batches of 24, twice the decode steps.

Determinism: the room is read from the device's total memory and the model's own
allocation, never from the free memory of the moment (which other processes move), so the
batch, and with it the padding every prompt sees, depends only on the inputs, the model and
the device. Greedy outputs can depend on the batch a prompt is in (padding and matrix
shapes change the bf16 rounding), so a run is reproducible for a given device and model,
and may differ in rare near-ties across devices of other sizes. On CPU the batch stays
DEFAULT. This module knows configs and byte counts; nothing about files.
"""

from __future__ import annotations

import math

import torch

from diag.target.placement import activation_bytes

DEFAULT = 16          # the batch on CPU, and when the room cannot be read
CAP = 64              # more rows buy little: a decode step at 64 rows already routes 512 pairs
ROOM_FRACTION = 0.5


def kv_bytes_per_token(config, dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token costs over all layers. Llama-shaped: 32 layers, 8 KV heads of
    128 -> 32 * 8 * 256 * 2 = 131072 (128 KiB)."""
    c = getattr(config, "text_config", None) or config
    heads = c.num_attention_heads
    if getattr(c, "kv_lora_rank", None):                      # MLA, as transformers caches it
        k, v = c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim
    else:
        heads = getattr(c, "num_key_value_heads", None) or heads
        k = v = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers * heads * (k + v) * dtype_bytes


def batch_for(num_prompts: int, max_len: int, longest_prompt: int, kv_per_token: int, room: int | None,
              prefill_limit: int, cap: int = CAP) -> int:
    """Rows per generation batch (see the module docstring); room None -> DEFAULT."""
    if num_prompts <= 0:
        return 1
    if room is None:
        most = DEFAULT
    else:
        most = min(cap, room // max(1, max_len * kv_per_token), prefill_limit // max(1, longest_prompt))
    most = max(1, min(most, num_prompts))
    batches = math.ceil(num_prompts / most)
    return math.ceil(num_prompts / batches)


def _beyond_model(model: torch.nn.Module) -> list[int]:
    """Per GPU the target sits on: total memory minus what the loaded model allocated."""
    devs = sorted({p.device.index for p in model.parameters() if p.device.type == "cuda"})
    return [max(0, torch.cuda.get_device_properties(d).total_memory - torch.cuda.memory_allocated(d))
            for d in devs]


def rooms(free: list[int]) -> tuple[int | None, int | None]:
    """GPUs with `free` bytes each beyond the model -> (KV room: ROOM_FRACTION of their sum,
    activation room: the rest of the smallest, as a prefill runs one layer at a time on one
    GPU at a time); (None, None) for no GPU. [100, 60] -> (80, 30)."""
    if not free:
        return None, None
    return int(sum(free) * ROOM_FRACTION), int(min(free) * (1 - ROOM_FRACTION))


def room_bytes(model: torch.nn.Module) -> int | None:
    """The KV room of the model's GPUs (rooms); None on CPU."""
    return rooms(_beyond_model(model))[0]


def activation_room_bytes(model: torch.nn.Module) -> int | None:
    """The activation room of the model's GPUs (rooms); None on CPU."""
    return rooms(_beyond_model(model))[1]


def prefill_tokens(config, token_budget: int, activation_room: int | None) -> int:
    """Tokens one generation prefill may hold (module docstring). Kimi, 30 GB -> 53.8k; CPU
    (room None) -> token_budget."""
    if activation_room is None:
        return token_budget
    per_token = activation_bytes(config, 1, num_points=0, vocab_chunk=0)
    return max(token_budget, activation_room // max(1, per_token))


def generation_batch(model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int,
                     token_budget: int) -> int:
    """The batch for greedy continuations of `prompts` on `model` as loaded."""
    if not prompts:
        return 1
    return batch_in_room(model.config, len(prompts), max(len(p) for p in prompts), max_new_tokens,
                         room_bytes(model), activation_room_bytes(model), token_budget,
                         next(model.parameters()).element_size())


def batch_in_room(config, num_prompts: int, longest: int, max_new_tokens: int, room: int | None,
                  activation_room: int | None, token_budget: int, dtype_bytes: int = 2) -> int:
    """The batch for prompts of at most `longest` tokens given the KV room and the activation
    room (rooms); both None on CPU."""
    kv = kv_bytes_per_token(config, dtype_bytes)
    return batch_for(num_prompts, longest + max_new_tokens, longest, kv, room,
                     prefill_tokens(config, token_budget, activation_room))
