"""A transformers DynamicCache whose layers append into preallocated memory.

transformers' DynamicLayer grows by torch.cat on every forward, copying the whole cache each
verify round of a decode loop; here each layer owns a buffer [B, H, capacity, d] (keys and
values separately: MLA's value width differs) and `keys` / `values` are views of its first
`length` slots. update() writes the new slots in place (doubling the buffer if it is full);
crop() and take_rows() move the view or the rows. With `whole` set (fixed_width), update()
returns the whole buffer instead of the view, so the attention's shape stays the same round
after round (its mask hides the slots past the view): a CUDA graph can replay it
(target/verify_graphs.py), and a shape-keyed backend (cuDNN's attention builds an execution
plan per shape) would plan it once, not at every round. The slots past a view
are zeros or earlier keys, never uninitialised memory (a NaN there would survive the mask's
0 weight). Layers of another kind (sliding windows,
...) keep their own behaviour. Worked example: capacity 8, length 5, a forward of 3 tokens
writes slots 5..7 and leaves keys = buffer[:, :, :8]; crop(6) leaves keys = buffer[:, :, :6].
This module knows transformers' cache layers; nothing about trees or drafters.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import torch
from transformers.cache_utils import DynamicLayer


_STAMPS = itertools.count()


class BufferLayer(DynamicLayer):
    """A DynamicLayer over a preallocated buffer (module docstring)."""

    whole = False           # update() returns the whole buffer, not the view (fixed_width)
    slots = None            # with whole: [Q] the slots update() writes, a tensor (a CUDA graph replays it)
    stamp = -1              # which buffers these are: a new number whenever they are replaced

    @classmethod
    def of(cls, layer: DynamicLayer, capacity: int) -> "BufferLayer":
        new = cls()
        new.device, new.is_initialized = layer.keys.device, True
        new._fill(layer.keys, layer.values, max(capacity, layer.keys.shape[-2]))
        return new

    def _fill(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        n = keys.shape[-2]
        self.stamp = next(_STAMPS)
        self.buf_k = keys.new_zeros(*keys.shape[:2], capacity, keys.shape[-1])
        self.buf_v = values.new_zeros(*values.shape[:2], capacity, values.shape[-1])
        self.buf_k[:, :, :n], self.buf_v[:, :, :n] = keys, values
        self.keys, self.values = self.buf_k[:, :, :n], self.buf_v[:, :, :n]

    def reserve(self, end: int) -> None:
        """Room for `end` slots: the buffer doubled past `end` when it is smaller."""
        if end > self.buf_k.shape[-2]:
            self._fill(self.keys, self.values, 2 * end)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        self.reserve(end)
        if self.whole and self.slots is not None:
            slots = self.slots.to(self.buf_k.device)    # a layer on another GPU than the slots' (a no-op on one)
            self.buf_k.index_copy_(2, slots, key_states.to(self.buf_k.dtype))
            self.buf_v.index_copy_(2, slots, value_states.to(self.buf_v.dtype))
        else:
            self.buf_k[:, :, start:end], self.buf_v[:, :, start:end] = key_states, value_states
        self.keys, self.values = self.buf_k[:, :, :end], self.buf_v[:, :, :end]
        return (self.buf_k, self.buf_v) if self.whole else (self.keys, self.values)

    @property
    def capacity(self) -> int:
        return int(self.buf_k.shape[-2])

    def crop_to(self, length: int) -> None:
        self.keys, self.values = self.buf_k[:, :, :length], self.buf_v[:, :, :length]

    def take_rows(self, rows: torch.Tensor, length: int) -> None:
        """Keep `rows` and their first `length` slots; only those are copied, into zeroed
        buffers of the same capacity (a whole-buffer attention reads the rest, masked).
        Example: capacity 600, length 380 -> 380 slots per row moved, not 600."""
        r = rows.to(self.buf_k.device)
        buf_k = self.buf_k.new_zeros(len(r), *self.buf_k.shape[1:])
        buf_v = self.buf_v.new_zeros(len(r), *self.buf_v.shape[1:])
        torch.index_select(self.buf_k[:, :, :length], 0, r, out=buf_k[:, :, :length])
        torch.index_select(self.buf_v[:, :, :length], 0, r, out=buf_v[:, :, :length])
        self.buf_k, self.buf_v = buf_k, buf_v
        self.stamp = next(_STAMPS)
        self.crop_to(length)


def buffered(cache, capacity: int):
    """Swap every plain DynamicLayer of `cache` for a BufferLayer holding `capacity` slots."""
    cache.layers = [BufferLayer.of(x, capacity) if type(x) is DynamicLayer else x for x in cache.layers]
    return cache


def reserve_whole(cache, need: int) -> int | None:
    """Room for `need` slots in every layer; the one width they then share, or None when some
    layer is not a BufferLayer or their capacities differ (no whole-buffer attention then)."""
    layers = list(getattr(cache, "layers", []) or [])
    if not layers or not all(isinstance(x, BufferLayer) for x in layers):
        return None
    for x in layers:
        x.reserve(need)
    widths = {x.capacity for x in layers}
    return widths.pop() if len(widths) == 1 else None


def stamps(cache) -> tuple[int, ...]:
    """The identity of a cache's buffers: it changes whenever one is replaced (grown, rows taken)."""
    return tuple(x.stamp for x in cache.layers)


@contextmanager
def fixed_width(cache, need: int, slots: torch.Tensor | None = None):
    """While it is open, every BufferLayer's update() returns its whole buffer (module
    docstring), each holding at least `need` slots, and writes the new keys at `slots` where
    given (else after the view); yields the width the attention then sees, or None when
    reserve_whole() gives none (the cache is then left as it is). On leaving, each view is the
    first `need` slots, as update() leaves it (a replayed graph runs no update())."""
    width = reserve_whole(cache, need)
    if width is None:
        yield None
        return
    for x in cache.layers:
        x.whole, x.slots = True, slots
    try:
        yield width
    finally:
        for x in cache.layers:
            x.whole, x.slots = False, None
            x.crop_to(need)


def crop_rows(layer, rows: torch.Tensor | None, length: int) -> None:
    """Keep `rows` (None: all) and the first `length` slots of one layer, whatever its kind."""
    if isinstance(layer, BufferLayer):
        return layer.crop_to(length) if rows is None else layer.take_rows(rows, length)
    r = slice(None) if rows is None else rows.to(layer.keys.device)
    layer.keys, layer.values = layer.keys[r, :, :length], layer.values[r, :, :length]
