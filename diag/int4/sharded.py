"""One layer's routed experts split over N devices (expert parallelism): ShardedExperts holds
N PackedExperts, shard j the contiguous experts [start_j, start_j + n_j) on its own device,
and is a drop-in for the layer's experts module (forward(hidden [T, H], top_k_index [T, K],
top_k_weights [T, K]) -> [T, H]).

A round's verify then reads every layer's experts on all N devices at once, each device 1/N
of them, instead of one device reading the whole layer while the others wait for their stage
(Kimi: 9.5 GB of routed experts a layer, 1.2 GB a GPU on 8).

  split     E experts into N shards: n_j = E // N, the first E % N shards one more
  local     shard j sees expert e as e - start_j when it holds it, else as the sentinel n_j,
            which its routing and its eager loop skip (diag.int4.routing, PackedExperts.add_into)
  sum       out[t] = sum over shards of shard j's sum over its slots

Worked example, E 5 over N 2: shards [0, 3) and [3, 5); top_k_index [[4, 0]] is [[3, 0]] to
shard 0 (3 = its sentinel) and [[1, 2]] to shard 1 (2 = its sentinel).

Numerics. The eager loop (CPU, or no Triton) adds every hit expert's output into one running
tensor, shard after shard, in ascending expert order: the bits of the unsplit module's loop.
The fused path (CUDA) gives each shard's sum in fp32, and the shards' sum is rounded once to
the hidden dtype: the unsplit fused path sums the K slots in fp32 in slot order, so the two
differ by fp32 reassociation below bf16's rounding, not bit for bit.

Inputs are sent to every device before any shard runs, in one buffer a device (`packed`: the
index, the hidden states and the weights; each shard takes its local index on its own device),
and the partial sums gathered after all were issued, so the devices' kernels overlap (the
copies between devices are queued, not waited for by the host), all of them before the first
add where they fit (`summed`). The placement (diag.target.placement, `experts = "split"`) puts
shard j on GPU j; the loader (diag.int4.load) reads each expert into its shard. This module
knows tensors and modules; it reads no files.
"""

from __future__ import annotations

import re
from contextlib import nullcontext

import torch
from torch import nn

from diag.int4.packed import PackedExperts

SHARDS = "shards"                     # the child list's name: layer.mlp.experts.shards.{j}
GATHERED_BYTES = 256 * 2**20         # the shards' partial sums handed home together up to this (`summed`)
_SHARD_NAME = re.compile(rf"^(?P<owner>.*)\.{SHARDS}\.(?P<j>\d+)$")


def split_sizes(num_experts: int, shards: int) -> list[int]:
    """Experts per shard: 384 over 8 -> [48] * 8; 5 over 2 -> [3, 2]."""
    if shards < 1 or shards > num_experts:
        raise ValueError(f"{num_experts} experts cannot be split into {shards} shards")
    base, extra = divmod(num_experts, shards)
    return [base + (j < extra) for j in range(shards)]


def shard_pairs(pairs: int, shard_experts: int, experts: int) -> int:
    """The pairs a shard of `shard_experts` of `experts` holds on average of `pairs` routed
    uniformly (what its row blocks are sized for: fast.fused_experts' pairs), at least 1:
    768 tokens of Kimi, top 8, one shard of 48 of 384 experts -> 6144 * 48 / 384 = 768, 16 an
    expert, not the 128 an expert that all 6144 pairs over 48 experts would size them for."""
    return max(1, -(-pairs * shard_experts // experts))


def packed(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """A shard's three inputs as one byte buffer, so another device receives them in one copy
    (a cross-device copy is a barrier between the two devices' streams, and a step of a program:
    target/device_program.py): [index | hidden | weights], each part's bytes at a multiple of 16.
    Worked example: T 2, K 2, H 4 in bf16, int64 index, bf16 weights -> index bytes 0..32,
    hidden 32..48, weights 48..56: 56 bytes."""
    parts = []
    for t in (top_k_index, hidden, top_k_weights):
        if parts and parts[-1].numel() % 16:
            parts.append(parts[-1].new_zeros(16 - parts[-1].numel() % 16))
        parts.append(t.contiguous().reshape(-1).view(torch.uint8))
    return torch.cat(parts)


def unpacked(buf: torch.Tensor, like: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`packed`'s inverse on buf's device: (hidden, top_k_index, top_k_weights) as views of it,
    shaped and typed like `like` = (hidden, top_k_index, top_k_weights)."""
    hidden, index, weights = like
    out, at = [], 0
    for t in (index, hidden, weights):
        at += -at % 16
        size = t.numel() * t.element_size()
        out.append(buf[at:at + size].view(t.dtype).view(t.shape))
        at += size
    return out[1], out[0], out[2]


def local_index(top_k_index: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """Global expert ids -> a shard's own ids, the sentinel `count` for the others'."""
    mine = (top_k_index >= start) & (top_k_index < start + count)
    return torch.where(mine, top_k_index - start, torch.full_like(top_k_index, count))


def shard_of(name: str) -> tuple[str, int] | None:
    """"model.layers.3.mlp.experts.shards.1" -> ("model.layers.3.mlp.experts", 1); else None."""
    m = _SHARD_NAME.match(name)
    return (m["owner"], int(m["j"])) if m else None


def checkpoint_owner(name: str, module: nn.Module) -> tuple[str, int]:
    """(the experts module's name in the checkpoint, its first expert's id): a shard
    "model.layers.3.mlp.experts.shards.1" holding experts from 48 -> ("model.layers.3.mlp.experts",
    48); any other module -> (name, 0)."""
    got = shard_of(name)
    if got is not None and isinstance(module, PackedExperts):
        return got[0], int(getattr(module, "first_expert", 0))
    return name, 0


class ShardedExperts(nn.Module):
    """A layer's routed experts as contiguous PackedExperts shards, each on its device."""

    def __init__(self, shards: list[PackedExperts]):
        super().__init__()
        self.shards = nn.ModuleList(shards)
        start = 0
        for shard in shards:
            shard.first_expert = start
            start += shard.num_experts
        self.num_experts = start
        first = shards[0]
        self.hidden_dim, self.intermediate_dim = first.hidden_dim, first.intermediate_dim
        self.group_size, self.act_fn = first.group_size, first.act_fn

    @classmethod
    def like(cls, experts: nn.Module, group_size: int, devices: list) -> "ShardedExperts":
        """Empty shards shaped like a transformers fused-experts module, one per device."""
        num, two_i, hidden = experts.gate_up_proj.shape
        return cls([PackedExperts(n, hidden, two_i // 2, group_size, experts.act_fn, device=dev)
                    for n, dev in zip(split_sizes(num, len(devices)), devices)])

    @classmethod
    def of(cls, module: PackedExperts, devices: list) -> "ShardedExperts":
        """A loaded PackedExperts (fast or not) split over `devices`: each shard of its class
        holds its slice of the module's buffers moved to its device (a view where that is the
        module's own), in the module's kernel layout if it has one. The fused path lays the
        words out in place at a module's first forward: split a module after its own (bench/
        expert_split.py), or one whose words nothing else reads."""
        shards, start = [], 0
        for n, dev in zip(split_sizes(module.num_experts, len(devices)), devices):
            shard = module.__class__.__new__(module.__class__)
            nn.Module.__init__(shard)
            for name, buf in module.named_buffers(recurse=False):
                shard.register_buffer(name, buf[start:start + n].to(dev))
            shard.num_experts, shard.hidden_dim, shard.intermediate_dim = n, module.hidden_dim, module.intermediate_dim
            shard.group_size, shard.act_fn = module.group_size, module.act_fn
            if "kernel_layout" in vars(module):
                shard.kernel_layout = module.kernel_layout
            shards.append(shard)
            start += n
        return cls(shards)

    def devices(self) -> list[torch.device]:
        return [shard.gate_up_proj_packed.device for shard in self.shards]

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        home, inputs, buf = hidden_states.device, (hidden_states, top_k_index, top_k_weights), None
        sent = []
        for shard, dev in zip(self.shards, self.devices()):
            if dev == home:
                x, idx, w = inputs
            else:                                  # one copy a device: the three inputs in one buffer
                buf = packed(*inputs) if buf is None else buf
                x, idx, w = unpacked(buf.to(dev, non_blocking=True), inputs)
            sent.append((shard, dev, x, local_index(idx, shard.first_expert, shard.num_experts), w))
        if all(runs_fused(shard, x) for shard, _, x, _, _ in sent):
            from diag.int4.fast import fused_experts

            parts = []
            for shard, dev, x, idx, w in sent:
                with torch.cuda.device(dev) if dev.type == "cuda" else nullcontext():   # Triton launches
                    parts.append(fused_experts(shard, x, idx, w, partial=True,          # on the current device
                                               pairs=shard_pairs(idx.numel(), shard.num_experts, self.num_experts)))
            return summed(parts[0].to(home), parts[1:], lambda part: part.to(home)).to(hidden_states.dtype)
        final = torch.zeros_like(hidden_states)
        for shard, dev, x, idx, w in sent:
            final = shard.add_into(final.to(dev), x, idx, w).to(home)
        return final

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, shards={[s.num_experts for s in self.shards]}"


def summed(first: torch.Tensor, others: list[torch.Tensor], hand) -> torch.Tensor:
    """first + others[0] + others[1] + ..., in that order, added in place into `first` (on the
    home device), each of `others` brought there by hand(t). Where the others fit in
    GATHERED_BYTES (a decode round's tokens) all are handed before the first add, so a program
    replays their copies one after another and the adds as one graph (target/device_program.py:
    7 one-add graphs fewer a layer on 8 GPUs); past it (a capture pass's thousands of tokens:
    7 x 16,384 x 7168 x 4 B = 3.3 GB on Kimi) one at a time, one part's bytes held. The same
    sums either way. Worked example: 3 parts of [64, 7168] fp32 -> 2 x 1.8 MB handed, then 2 adds."""
    together = sum(t.numel() * t.element_size() for t in others) <= GATHERED_BYTES
    if together:
        others = [hand(t) for t in others]
    for t in others:
        first += t if together else hand(t)
    return first


def runs_fused(shard: nn.Module, hidden: torch.Tensor) -> bool:
    """Whether `shard`'s forward on `hidden` runs the fused kernels (a fast module's fused_runs)."""
    runs = getattr(shard, "fused_runs", None)
    return bool(runs and runs(hidden))
