"""The packed-word layout the fused kernel reads (diag.int4.fast_kernel.moe_int4_gemm_grouped),
and the way back to the checkpoint's layout. Pure functions on int32 tensors.

Checkpoint layout (compressed-tensors, format.py): column k of a row sits in word k // 8,
nibble k % 8. Kernel layout, piece width P (16 or 32, dividing the group size G): the row is
cut into blocks of 8P columns; in block b, word b*P + j holds, in nibble i, column
b*8P + i*P + j. So shifting a block's P words right by 4i and masking yields P consecutive
columns, all inside one group (one scale): unpacking is one shift and one mask per element,
and no shuffle. The kernel's K step is one block (P = 16: 128 columns).

Worked example, P = 32 (blocks of 256 columns): column 33 = block 0, i = 1, j = 1 sits in
word 1, nibble 1 (checkpoint layout: word 4, nibble 1); column 300 = block 1, i = 1, j = 12
sits in word 32 + 12 = 44, nibble 1 (checkpoint: word 37, nibble 4).

Both directions are one transposition of (nibble index, word index): `_swap`. This module
knows bit layouts only: no modules, no files.
"""

from __future__ import annotations

import torch

PER_WORD = 8


def fits(width: int, group: int, piece: int = 16) -> bool:
    """Whole blocks of 8P columns, P >= 16 (one tl.dot per piece) and P dividing the group.
    Kimi, P 16: 7168 and 2048 with G 32 -> blocks of 128: 56 and 16 blocks."""
    return piece >= 16 and piece % 16 == 0 and group % piece == 0 and width % (PER_WORD * piece) == 0


def _swap(x: torch.Tensor) -> torch.Tensor:
    """x [..., 8, B] int32 words -> y [..., B, 8]: nibble a of y[..., b, c] = nibble c of
    x[..., a, b]."""
    v = x.to(torch.int64) & 0xFFFFFFFF                                       # [..., 8, B] unsigned
    shifts = torch.arange(PER_WORD, device=x.device, dtype=torch.int64) * 4  # [8]
    nib = (v.unsqueeze(-1) >> shifts) & 0xF                                  # [..., a, b, c]
    y = (nib << shifts.view(PER_WORD, 1, 1)).sum(dim=-3)                     # [..., b, c]
    return torch.where(y >= 2 ** 31, y - 2 ** 32, y).to(torch.int32)


def to_kernel(words: torch.Tensor, piece: int) -> torch.Tensor:
    """[..., N, K/8] checkpoint words -> [..., N, K/8] kernel words (same bytes count)."""
    *lead, n, w = words.shape
    blocks = w // piece                                     # K / (8P)
    x = words.reshape(*lead, n, blocks, PER_WORD, piece // PER_WORD)       # (i, j // 8)
    y = _swap(x)                                            # [..., P/8, 8]: (j // 8, j % 8)
    return y.reshape(*lead, n, w)


def to_checkpoint(words: torch.Tensor, piece: int) -> torch.Tensor:
    """Inverse of to_kernel."""
    *lead, n, w = words.shape
    blocks = w // piece
    x = words.reshape(*lead, n, blocks, piece // PER_WORD, PER_WORD)       # (j // 8, j % 8)
    y = _swap(x.transpose(-1, -2))                          # [..., P/8, 8] as (j // 8, i)
    return y.transpose(-1, -2).reshape(*lead, n, w)


def relayout_(buf: torch.Tensor, piece: int, *, forward: bool = True, chunk: int = 2) -> None:
    """In place over the expert dimension, `chunk` experts at a time, so the temporary
    memory stays about 40x one chunk's words (Kimi gate_up, 2 experts: ~1.2 GB of int64)."""
    fn = to_kernel if forward else to_checkpoint
    for e in range(0, buf.shape[0], chunk):
        buf[e:e + chunk] = fn(buf[e:e + chunk], piece)


def scales_group_major(scale: torch.Tensor) -> torch.Tensor:
    """[E, N, K/G] scales with the same values, stored [E, K/G, N] (stride 1 along N), so
    the kernel reads one group's scales for BLOCK_N rows as one contiguous vector."""
    return scale.transpose(-1, -2).contiguous().transpose(-1, -2)
