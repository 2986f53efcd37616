"""The target's input embedding and lm_head for the drafter, read only as far as a run uses them.

A drafter embeds with the target's table and, in EAGLE mode or without a draft vocabulary,
scores with the target's lm_head. Reading both whole costs Kimi-K2.5 4.7 GB (163840 x 7168
bf16 each) on every run, the cached ones included. Here:

  RowTable    the embedding, rows gathered on first use from a memory map of the shard and
              kept: a lookup of ids never seen reads exactly those rows (sorted, one copy each).
              Example: ids [[5, 9], [5, 2]] on an empty table -> rows 2, 5, 9 read (3 x H);
              a second lookup of [9, 2] reads nothing. A row is bit-identical to the
              checkpoint's, so a lookup equals nn.Embedding's on the whole table.
  LazyHead    the lm_head (or the embedding, when tie_word_embeddings), read whole on the
              first access of `.weight` (EAGLE mode, a drafter without its own head, the
              target's prompt fit) and never otherwise; the sampled decode loop, which holds
              the loaded target, drafts with the target's own tables (run/sampled.loaded_tables).

What the checks cover now: the headers (tensor present, dtype, shape, extent inside the
file) are checked when the tables are opened, before any weight is read. NaN / Inf is checked
on every gathered block of rows and on the whole head when it is read, so every value a run
computes with is checked; rows a run never touches are checked by the target load that
computed its (content-keyed) pass, target/load.py, which scans every weight it places.
This module knows safetensors files and tensors; nothing about drafters, variants or caches.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from diag.checkpoint.config import text_config
from diag.checkpoint.finite import check_finite
from diag.checkpoint.headers import TORCH_DTYPES, TensorInfo, tensor_infos
from diag.errors import DiagError

EMBED_KEYS = ("model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
              "model.language_model.embed_tokens.weight")
HEAD_KEYS = ("lm_head.weight", "language_model.lm_head.weight")


def _rows_of(info: TensorInfo) -> np.memmap:
    """The tensor's bytes as a [rows, bytes per row] uint8 memory map (nothing read yet).
    Example: BF16 [300, 32] at offset 1024 -> memmap of shape [300, 64] from byte 1024."""
    dtype = TORCH_DTYPES.get(info.dtype)
    if dtype is None or not dtype.is_floating_point or len(info.shape) != 2:
        raise DiagError("the target's embedding table is not a 2-D float tensor", file=str(info.file),
                        field=info.name, expected="F16, BF16, F32 or F64 [vocab_size, hidden_size]",
                        found=f"{info.dtype} {list(info.shape)}")
    rows, width = info.shape
    row_bytes = width * torch.tensor([], dtype=dtype).element_size()
    return np.memmap(info.file, dtype=np.uint8, mode="r", offset=info.offset, shape=(rows, row_bytes))


class RowTable(nn.Module):
    """An embedding [V, H] whose rows are read from the shard when first looked up."""

    def __init__(self, info: TensorInfo):
        super().__init__()
        self.info, self._map = info, _rows_of(info)
        self.num_embeddings, self.embedding_dim = info.shape
        self.dtype = TORCH_DTYPES[info.dtype]
        self.device = torch.device("cpu")
        self.slot = torch.full((self.num_embeddings,), -1, dtype=torch.long)    # id -> row of `rows`
        self.rows = torch.zeros(0, self.embedding_dim, dtype=self.dtype)        # [n read, H]
        self.rows_read = 0

    def near(self, dev) -> "RowTable":
        """Keep the gathered rows on `dev` (the drafter's device): a lookup is then a gather
        there; new rows are read on the CPU and copied over once."""
        dev = torch.device(dev)
        self.slot, self.rows, self.device = self.slot.to(dev), self.rows.to(dev), dev
        return self

    def gather(self, ids: torch.Tensor) -> None:
        """Read every id of `ids` not read before (checked: in range, finite)."""
        flat = ids.reshape(-1).to(self.device, torch.long)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise DiagError("a token id is outside the target's embedding table", file=str(self.info.file),
                            field=self.info.name, expected=f"ids in [0, {self.num_embeddings})",
                            found=f"ids from {int(flat.min())} to {int(flat.max())}")
        new = torch.unique(flat[self.slot[flat] < 0]).cpu()                    # sorted ascending
        if new.numel() == 0:
            return
        raw = torch.from_numpy(np.ascontiguousarray(self._map[new.numpy()]))   # [n, bytes per row]
        block = raw.view(self.dtype).reshape(len(new), self.embedding_dim)
        check_finite(f"{self.info.name} rows {new[:4].tolist()}..", block, str(self.info.file))
        self.slot[new.to(self.device)] = torch.arange(len(self.rows), len(self.rows) + len(new), device=self.device)
        self.rows = torch.cat([self.rows, block.to(self.device)])
        self.rows_read += len(new)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> rows [..., H], on the table's device, in the file's dtype."""
        ids = ids.to(self.device)
        self.gather(ids)
        return self.rows[self.slot[ids]]


class LazyHead(nn.Module):
    """The lm_head [V, H] (bias-free), read whole on the first access of `.weight`."""

    def __init__(self, info: TensorInfo):
        super().__init__()
        self.info, self._weight = info, None
        self.out_features, self.in_features = info.shape
        self.bias = None

    @property
    def read(self) -> bool:
        return self._weight is not None

    @property
    def weight(self) -> torch.Tensor:
        if self._weight is None:
            from safetensors import safe_open
            with safe_open(str(self.info.file), framework="pt") as fh:
                w = fh.get_tensor(self.info.name)
            check_finite(self.info.name, w, str(self.info.file))
            self._weight = w
        return self._weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)


def target_tables(path: str | Path, config: dict) -> tuple[RowTable, LazyHead]:
    """(embedding, lm_head) of the target at `path` (`config`: its config.json), from the
    headers alone; DiagError when the embedding is missing, or the head is missing and not tied."""
    path = Path(path)
    infos = tensor_infos(path)
    emb = next((infos[k] for k in EMBED_KEYS if k in infos), None)
    if emb is None:
        raise DiagError("target checkpoint has no input embedding", file=str(path), field=" | ".join(EMBED_KEYS),
                        expected="one of these tensors", found="none")
    head = next((infos[k] for k in HEAD_KEYS if k in infos), None)
    if head is None:
        if not text_config(config).get("tie_word_embeddings", False):
            raise DiagError("target checkpoint has no lm_head and does not tie it to the embedding",
                            file=str(path), field="lm_head.weight", expected="present or tie_word_embeddings",
                            found="missing")
        head = emb
    return RowTable(emb), LazyHead(head)
