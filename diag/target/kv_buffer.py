"""A transformers DynamicCache whose layers append into preallocated memory.

transformers' DynamicLayer grows by torch.cat on every forward, copying the whole cache each
verify round of a decode loop; here each layer owns a buffer [B, H, capacity, d] (keys and
values separately: MLA's value width differs) and `keys` / `values` are views of its first
`length` slots. update() writes the new slots in place (doubling the buffer if it is full);
crop() and take_rows() move the view or the rows. Layers of another kind (sliding windows,
...) keep their own behaviour. Worked example: capacity 8, length 5, a forward of 3 tokens
writes slots 5..7 and leaves keys = buffer[:, :, :8]; crop(6) leaves keys = buffer[:, :, :6].
This module knows transformers' cache layers; nothing about trees or drafters.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class BufferLayer(DynamicLayer):
    """A DynamicLayer over a preallocated buffer (module docstring)."""

    @classmethod
    def of(cls, layer: DynamicLayer, capacity: int) -> "BufferLayer":
        new = cls()
        new.device, new.is_initialized = layer.keys.device, True
        new._fill(layer.keys, layer.values, max(capacity, layer.keys.shape[-2]))
        return new

    def _fill(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        n = keys.shape[-2]
        self.buf_k = keys.new_zeros(*keys.shape[:2], capacity, keys.shape[-1])
        self.buf_v = values.new_zeros(*values.shape[:2], capacity, values.shape[-1])
        self.buf_k[:, :, :n], self.buf_v[:, :, :n] = keys, values
        self.keys, self.values = self.buf_k[:, :, :n], self.buf_v[:, :, :n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.buf_k.shape[-2]:
            self._fill(self.keys, self.values, 2 * end)
        self.buf_k[:, :, start:end], self.buf_v[:, :, start:end] = key_states, value_states
        self.keys, self.values = self.buf_k[:, :, :end], self.buf_v[:, :, :end]
        return self.keys, self.values

    def crop_to(self, length: int) -> None:
        self.keys, self.values = self.buf_k[:, :, :length], self.buf_v[:, :, :length]

    def take_rows(self, rows: torch.Tensor, length: int) -> None:
        """Keep `rows` and their first `length` slots; only those are copied (the slots past
        `length` are written by the next update before anything reads them), into buffers of
        the same capacity. Example: capacity 600, length 380 -> 380 slots per row moved, not 600."""
        r = rows.to(self.buf_k.device)
        buf_k = self.buf_k.new_empty(len(r), *self.buf_k.shape[1:])
        buf_v = self.buf_v.new_empty(len(r), *self.buf_v.shape[1:])
        torch.index_select(self.buf_k[:, :, :length], 0, r, out=buf_k[:, :, :length])
        torch.index_select(self.buf_v[:, :, :length], 0, r, out=buf_v[:, :, :length])
        self.buf_k, self.buf_v = buf_k, buf_v
        self.crop_to(length)


def buffered(cache, capacity: int):
    """Swap every plain DynamicLayer of `cache` for a BufferLayer holding `capacity` slots."""
    cache.layers = [BufferLayer.of(x, capacity) if type(x) is DynamicLayer else x for x in cache.layers]
    return cache


def crop_rows(layer, rows: torch.Tensor | None, length: int) -> None:
    """Keep `rows` (None: all) and the first `length` slots of one layer, whatever its kind."""
    if isinstance(layer, BufferLayer):
        return layer.crop_to(length) if rows is None else layer.take_rows(rows, length)
    r = slice(None) if rows is None else rows.to(layer.keys.device)
    layer.keys, layer.values = layer.keys[r, :, :length], layer.values[r, :, :length]
