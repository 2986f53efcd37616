"""The target's side of a speculative decode: prefill, then one tree-attention verify forward per
round over the drafted nodes, on a KV cache, as the server runs it (DESIGN.md §11).

The cache is the model's own transformers cache, one row per request. Row b's committed
tokens fill its first `length[b]` slots (a row behind the longest has dead slots after them).
A verify appends the D tree nodes after the longest row; `commit` then moves each row's root
and accepted path into its own next slots and crops the cache to the longest row, so no slot
is ever wasted for long and nothing is re-packed. Queries see the row's committed slots plus
their tree ancestors (diag.trees.ancestor_mask), at positions root_position + depth
(diag.trees.positions).
Worked example: lengths [7, 5], cache length 7; tree parents [-1, 0, 0, 1] at slots 7..10,
rooted at positions [7, 5] -> node positions [[7, 8, 8, 9], [5, 6, 6, 7]]; node 3 of row 1
sees slots 0..4 and nodes 0, 1, 3. Row 1 accepts path [0, 1, 3] -> slots 7, 8, 10 move to
5, 6, 7; lengths [.., 8]; the cache is cropped to max(lengths).

Keys carry RoPE at their true positions, so where a key sits in the cache changes nothing.
This module knows transformers decoders and masks; nothing about drafters, sampling or reports.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from diag.layouts import CapturePoint
from diag.target.capture import decoder_parts, hooks
from diag.target.kv_buffer import BufferLayer, buffered, crop_rows, fixed_width, reserve_whole, stamps
from diag.target.sdpa import attention_without_cudnn
from diag.target.verify_graphs import VerifyGraphs
from diag.trees import ancestor_mask, positions, reach

FINAL = CapturePoint("final")


@dataclass
class TargetKV:
    cache: object            # the decoder's cache object (transformers DynamicCache)
    length: torch.Tensor     # [B] committed slots of each row (a prefix), on the model's device
    block: int = 0           # first slot of the last verify's tree nodes

    def valid(self, width: int) -> torch.Tensor:
        """[B, width] bool: slot < length."""
        return torch.arange(width, device=self.length.device)[None] < self.length[:, None]


@dataclass(frozen=True)
class NodeLogits:
    """A verify's logits, computed only at the nodes asked for: the head over every node of
    every tree is mostly unread (the accept step reads nodes with a child and the leaf a walk
    ended on). final [B, D, H] the final norm's output; shape (B, D, V). Example: chain-3 on
    288 rows -> at most 864 + 288 of the 1152 nodes through the head, not all 1152."""
    model: nn.Module
    final: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        return (*self.final.shape[:2], self.model.get_output_embeddings().weight.shape[0])

    @property
    def device(self) -> torch.device:
        return self.final.device

    def rows(self, flat: torch.Tensor, *, native: bool = False) -> torch.Tensor:
        """flat [n] indices b * D + node -> logits [n, V] float32 (native: in the head's own
        dtype, the same values: bf16 widens to float32 exactly)."""
        return head_logits(self.model, self.final.reshape(-1, self.final.shape[-1])[flat.to(self.final.device)],
                           native=native)

    def part(self, rows: slice, nodes: int) -> "NodeLogits":
        """The same logits for rows `rows` and their first `nodes` nodes (one tree of a verify
        that scored several, padded to the widest)."""
        return NodeLogits(self.model, self.final[rows, :nodes])


@dataclass(frozen=True)
class Scored:
    """One forward: logits at every query (prefill: [B, Q, V] float32; verify: NodeLogits,
    computed where read), and the captured points [B, Q, H] (always "final"), on the model's
    device."""
    logits: "torch.Tensor | NodeLogits"
    states: dict[str, torch.Tensor]


def cache_kwarg(module: nn.Module) -> str:
    """The forward argument that takes a KV cache: transformers 5.24 names it `cache`
    (`past_key_values` deprecated), earlier 5.x (5.17) only `past_key_values`."""
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def attention_bias(past: torch.Tensor, block: torch.Tensor, dtype: torch.dtype,
                   tail: torch.Tensor | None = None) -> torch.Tensor:
    """past [B, L] bool (valid slots), block [B, Q, Q] bool (query i sees new query j), tail
    [B, R] bool (slots after the new ones; none by default) -> additive mask [B, 1, Q, L + Q + R]:
    0 where attended, the dtype's minimum elsewhere."""
    B, Q, _ = block.shape
    parts = [past[:, None, :].expand(B, Q, past.shape[1]), block]
    if tail is not None:
        parts.append(tail[:, None, :].expand(B, Q, tail.shape[1]))
    see = torch.cat(parts, dim=-1)
    bias = torch.zeros(see.shape, dtype=dtype, device=see.device)
    return bias.masked_fill_(~see, torch.finfo(dtype).min)[:, None]


def device_and_dtype(model: nn.Module):
    p = next(model.parameters())
    dtype = p.dtype if p.is_floating_point() else torch.float32
    return model.get_input_embeddings().weight.device, dtype


def forward_points(model, ids, pos, bias, cache, points) -> tuple[dict, object]:
    base, _, _, _, _ = decoder_parts(model)
    sink: dict[str, torch.Tensor] = {}
    with hooks(model, tuple(dict.fromkeys((*points, FINAL))), sink):
        out = base(input_ids=ids, attention_mask=bias, position_ids=pos, use_cache=True,
                   **{cache_kwarg(base): cache})
    return sink, out.past_key_values


def head_logits(model, final: torch.Tensor, *, native: bool = False) -> torch.Tensor:
    """The head at `final`: float32 logits, or (native) in the head's dtype, whose widening to
    float32 is exact, so a reader that widens them (a softmax in float32) reads the same numbers;
    at Kimi's 163,840 ids and 1,536 nodes the float32 copy alone is 1 GB written a round."""
    head = model.get_output_embeddings()
    out = head(final.to(head.weight.device, head.weight.dtype))
    return out if native else out.float()


@torch.no_grad()
def prefill(model: nn.Module, ids: torch.Tensor, valid: torch.Tensor, points: tuple[CapturePoint, ...], *,
            capacity: int = 0) -> tuple[TargetKV, Scored]:
    """Prompts ids, valid [B, P] (right padded). Returns the cache (preallocated for `capacity`
    slots per row, kv_buffer.py) and, for every prompt index, the captured points; logits only
    at each row's last valid index ([B, 1, V])."""
    dev, dtype = device_and_dtype(model)
    ids, valid = ids.to(dev), valid.to(dev)
    B, P = ids.shape
    causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
    block = causal[None] & valid[:, None, :]
    pos = torch.arange(P, device=dev).expand(B, P)
    sink, cache = forward_points(model, ids, pos, attention_bias(valid[:, :0], block, dtype), None, points)
    last = valid.sum(-1) - 1                                                   # [B]
    final = sink[FINAL.name][torch.arange(B, device=dev), last.to(sink[FINAL.name].device)]
    return TargetKV(buffered(cache, capacity), valid.sum(-1)), Scored(head_logits(model, final[:, None]), sink)


@torch.no_grad()
def verify_forward(model: nn.Module, kv: TargetKV, tokens: torch.Tensor, parents: torch.Tensor,
                   node_valid: torch.Tensor, root_position: torch.Tensor,
                   points: tuple[CapturePoint, ...], *, fixed: bool | None = None,
                   graphs: VerifyGraphs | None = None) -> Scored:
    """Score the trees: tokens, parents, node_valid [B, D] (node 0 the root, at root_position
    [B]); logits only where read (NodeLogits). Appends the D nodes after the longest row;
    `commit` keeps the accepted ones. fixed (default: on CUDA): the attention reads the cache's
    whole buffer, the slots past the tree masked (kv_buffer.fixed_width), so its shape is the
    same every round of a batch; the same scores up to the sums' rounding. graphs (with fixed
    widths, a model on CUDA): the forward replayed from a CUDA graph per bucket, or a program of
    graphs over several devices (target/verify_graphs.py), the same numbers as the eager forward
    on the same shapes."""
    dev, dtype = device_and_dtype(model)
    tokens, parents, node_valid = tokens.to(dev), parents.to(dev), node_valid.to(dev)
    B, D = tokens.shape
    kv.block = _width(kv)
    need = kv.block + D
    width = reserve_whole(kv.cache, need) if _fixed(kv, fixed) else None
    if width is None:
        sees, pos = tree_sees_and_positions(parents, node_valid, root_position.to(dev))
        sink, kv.cache = forward_points(model, tokens.clamp(min=0), pos, attention_bias(kv.valid(kv.block), sees, dtype),
                                        kv.cache, points)
        return Scored(NodeLogits(model, sink[FINAL.name]), sink)
    # fixed widths: the tree at slots block .. block + D of the whole buffer, the slots past it hidden;
    # the masks, positions and slots are computed inside the forward (a graph's replay computes them)
    inputs = {"ids": tokens, "parents": parents, "valid": node_valid, "root": root_position.to(dev),
              "length": kv.length, "block": torch.tensor([kv.block]).to(dev, non_blocking=True)}
    forward = _fixed_forward(model, kv, D, need, width, points, dtype)
    sink = None
    if graphs is not None and graphs.usable(model):
        sink = graphs.run(stamps(kv.cache), inputs, (B, D, width, points), forward, model=model)
        if sink is not None:
            for layer in cache_layers(kv.cache):            # as an update leaves it: the view ends after the tree
                layer.crop_to(need)
    if sink is None:
        if graphs is not None:
            graphs.counts["eager"] += 1
        sink = forward(inputs)
    return Scored(NodeLogits(model, sink[FINAL.name]), sink)


def _fixed_forward(model, kv: TargetKV, D: int, need: int, width: int, points, dtype):
    """verify_forward's forward on fixed widths: x (ids, parents, valid, root, length [B], block
    [1]) -> the captured points; cuDNN's attention left out (a graph is captured). `need` only
    sizes the host's views around an eager call (a replay runs no Python)."""
    def forward(x: dict) -> dict:
        slots = x["block"] + torch.arange(D, device=x["block"].device)
        sees, pos = tree_sees_and_positions(x["parents"], x["valid"], x["root"])
        bias = fixed_bias(x["length"], x["block"], sees, width, dtype)
        with fixed_width(kv.cache, need, slots), attention_without_cudnn(kv.length.device):
            return forward_points(model, x["ids"].clamp(min=0), pos, bias, kv.cache, points)[0]
    return forward


def verify_queued(model: nn.Module, kv: TargetKV, tokens: torch.Tensor, parents: torch.Tensor,
                  node_valid: torch.Tensor, root_position: torch.Tensor, length: torch.Tensor,
                  points: tuple[CapturePoint, ...], graphs: VerifyGraphs, grow: int
                  ) -> "tuple[Scored, Callable[[], None]] | None":
    """verify_forward queued behind a commit whose new lengths `length` [B] only the device holds
    yet (commit_fixed's): the tree at the longest of them, found on the device, replayed from
    the graph verify_forward captured for this bucket on these buffers. Returns (scored,
    placed): placed() is the host's part, once it has cropped the cache to the committed rows
    (crop_committed): kv.block and the views then stand as verify_forward leaves them. None
    where it cannot be queued: no graph of the bucket yet, or a tree that might not fit the
    buffer (the longest row grows by at most `grow` slots a commit). The decode loop queues the
    next round's verify so, to run while the host reads a round back (decode_loop._round). Example:
    lengths after the commit [9, 12] on views of 14 (block 10, D 4) -> the tree at slots 12..15;
    placed() -> block 12, views 16."""
    B, D = tokens.shape
    layers = cache_layers(kv.cache)
    widths = {x.capacity for x in layers if isinstance(x, BufferLayer)}
    if len(widths) != 1 or len(layers) != sum(isinstance(x, BufferLayer) for x in layers):
        return None
    width = widths.pop()
    if kv.block + grow + D > width:
        return None
    dev = kv.length.device
    inputs = {"ids": tokens.to(dev), "parents": parents.to(dev), "valid": node_valid.to(dev),
              "root": root_position.to(dev), "length": length, "block": length.max().reshape(1)}
    sink = graphs.replay(stamps(kv.cache), inputs, (B, D, width, points))
    if sink is None:
        return None

    def placed() -> None:
        kv.block = _width(kv)
        for layer in layers:
            layer.crop_to(kv.block + D)
    return Scored(NodeLogits(model, sink[FINAL.name]), sink), placed


def tree_sees(parents: torch.Tensor, node_valid: torch.Tensor, reached: torch.Tensor | None = None) -> torch.Tensor:
    """[B, D, D] bool: node i sees node j (an ancestor or itself; a query always sees itself).
    reached: trees.reach(parents) where the caller has it already."""
    eye = torch.eye(parents.shape[-1], dtype=torch.bool, device=parents.device)
    return ((ancestor_mask(parents) if reached is None else reached) & node_valid[:, None, :]) | eye


def tree_sees_and_positions(parents: torch.Tensor, node_valid: torch.Tensor, root_position: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """`tree_sees` and the nodes' positions (trees.positions), both from one trees.reach."""
    reached = reach(parents)
    return tree_sees(parents, node_valid, reached), positions(parents, root_position, reached)


def fixed_bias(length: torch.Tensor, block: torch.Tensor, sees: torch.Tensor, width: int,
               dtype: torch.dtype) -> torch.Tensor:
    """attention_bias over a whole buffer of `width` slots, from tensors only (no host int, so a
    graph replays it for any block): slot s is seen by row b's query i where s < length[b] (its
    committed slots; length <= block) or block <= s < block + D and i sees node s - block.
    length [B], block [1], sees [B, D, D] -> [B, 1, D, width], the values attention_bias gives
    for past = slots < length up to block, the tree, then the tail hidden. Example: length [3],
    block 4, D 2, width 8 -> row 0 sees slots 0..2, and 4, 5 as the tree allows."""
    B, D, _ = sees.shape
    s = torch.arange(width, device=length.device)
    rel = s[None] - block[:, None]                                          # [1, width]
    in_tree = (rel >= 0) & (rel < D)
    tree = sees.gather(-1, rel.clamp(0, D - 1).expand(B, D, width)) & in_tree[:, None, :]
    see = (s[None, None, :] < length[:, None, None]) | tree
    bias = torch.zeros(see.shape, dtype=dtype, device=see.device)
    return bias.masked_fill_(~see, torch.finfo(dtype).min)[:, None]


def _fixed(kv: TargetKV, fixed: bool | None) -> bool:
    """fixed_width's default: on CUDA (its attention plans per shape), not on the CPU (the
    masked slots would cost work, and nothing there plans by shape)."""
    return kv.length.device.type == "cuda" if fixed is None else fixed


def cache_layers(cache) -> list:
    """The per-layer (keys, values) holders of a transformers 5 DynamicCache."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(isinstance(getattr(x, "keys", None), torch.Tensor) for x in layers):
        raise TypeError(f"{type(cache).__name__}: not a transformers 5 DynamicCache (layers[i].keys/values)")
    return list(layers)


def _width(kv: TargetKV) -> int:
    return int(cache_layers(kv.cache)[0].keys.shape[-2])


def cache_bytes(kv: TargetKV, fixed: bool | None = None) -> int:
    """Bytes of keys and values a forward's attention reads: every layer's live views, all B rows
    over the cache's width (a row behind the longest reads its dead slots too, masked), in the
    cache's own layout. Example, transformers 5.25's MLA cache (keys [B, 1, L, kv_lora_rank],
    values [B, 1, L, qk_rope_head_dim]) at Kimi's widths: 2 layers, B 96, width 200, bf16:
    2 * 96 * 200 * (512 + 64) * 2 = 44.2e6. A verify on fixed widths (verify_forward's `fixed`)
    reads each layer's whole buffer instead (its capacity for the width)."""
    layers = cache_layers(kv.cache)
    if _fixed(kv, fixed) and all(isinstance(x, BufferLayer) for x in layers):
        return sum(t.numel() * t.element_size() for layer in layers for t in (layer.buf_k, layer.buf_v))
    return sum(t.numel() * t.element_size() for layer in layers for t in (layer.keys, layer.values))


def commit(kv: TargetKV, path: torch.Tensor) -> None:
    """Keep each row's root and accepted nodes: path [B, S+1] node indices (-1 past the accepted
    depth, path[:, 0] = 0). Node k of the path moves from slot block + path[k] to
    length + k (never later than where it was), lengths grow by the path's length, and the
    cache is cropped to the longest row."""
    dev = kv.length.device
    path = path.to(dev)
    keep = path >= 0
    rows = torch.arange(len(path), device=dev)[:, None].expand_as(path)[keep]         # [M]
    src = (kv.block + path)[keep]
    dst = (kv.length[:, None] + torch.arange(path.shape[1], device=dev)[None])[keep]
    for layer in cache_layers(kv.cache):
        for name in ("keys", "values"):
            t = getattr(layer, name)                                                 # [B, H, L, d]
            r, a, b = rows.to(t.device), src.to(t.device), dst.to(t.device)
            t[r, :, b] = t[r, :, a]
    length = kv.length + keep.sum(-1)
    crop_committed(kv, length, int(length.max()))


def commit_fixed(kv: TargetKV, path: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """`commit` on fixed shapes, asking the host nothing (a CUDA graph replays it): the same moves
    within each layer's whole buffer (kv_buffer.BufferLayer), every path slot written (one past a
    row's accepted depth, or of a finished row, takes its own slot's value: a move to itself), the
    tree at `block` (a [1] tensor); returns the new lengths, which the caller assigns and crops to
    (`crop_committed`). Example: length 5, block 7, path [0, 2, -1] -> slot 7 to 5, 9 to 6, 7 to 7."""
    dev = kv.length.device
    path = path.to(dev)
    keep = path >= 0
    dst = kv.length[:, None] + torch.arange(path.shape[1], device=dev)[None]
    src = torch.where(keep, block + path, dst)
    rows = torch.arange(len(path), device=dev)[:, None].expand_as(path)
    for layer in cache_layers(kv.cache):
        for t in (layer.buf_k, layer.buf_v):                                        # [B, H, capacity, d]
            r, a, b = rows.to(t.device), src.to(t.device), dst.to(t.device)
            t[r, :, b] = t[r, :, a]
    return kv.length + keep.sum(-1)


def crop_committed(kv: TargetKV, length: torch.Tensor, longest: int) -> None:
    """After `commit_fixed`: the rows' new lengths, every layer's view cropped to the longest
    (a host int the caller already holds, so nothing asks the device)."""
    kv.length = length
    for layer in cache_layers(kv.cache):
        crop_rows(layer, None, longest)


def rewind_verify(kv: TargetKV) -> None:
    """The cache as it was before the last verify_forward, whose commit the host has not applied
    (a round run again, decode_loop._undo): every layer's view cropped back to where the tree
    was appended (kv.block); the lengths are untouched (commit_fixed returns its new ones, the
    caller assigns them). The next verify writes the tree at the same slots. Example: width 12
    before a verify of 4 nodes -> 16 after -> 12 again."""
    for layer in cache_layers(kv.cache):
        crop_rows(layer, None, kv.block)


def select_rows(kv: TargetKV, rows: torch.Tensor) -> None:
    """Keep (or repeat) cache rows: rows [B'] indices. Example: rows [0, 0, 1] doubles row 0."""
    kv.length = kv.length[rows.to(kv.length.device)]
    top = int(kv.length.max()) if kv.length.numel() else 0
    for layer in cache_layers(kv.cache):
        crop_rows(layer, rows, top)
