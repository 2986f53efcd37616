"""INT4 numerics of compressed-tensors' `pack-quantized` format (symmetric,
per-group), bit for bit.

Conventions (compressed-tensors 0.20, `pack_to_int32` / `calculate_qparams` /
`quantize` / `dequantize`):
  q        int8 in [-8, 7]                      # [..., out, in]
  stored   nibble u = q + 8 in [0, 15]
  packed   int32, 8 nibbles per word, element k of a word sits in bits
           [4k, 4k+4) (least significant first)  # [..., out, in/8]
  scale    one per group of `group_size` columns, in the weight's dtype
           scale = absmax(group) / 7.5  (7.5 = (7 - (-8)) / 2), computed in
           the weight's dtype; an all-zero group gets finfo(dtype).eps
                                                 # [..., out, in/group]
  quantize q = clamp(round_half_even(w / scale), -8, 7), w / scale computed in
           the weight's dtype (so bf16 weights round twice, as the library does)
  dequant  w' = q.to(scale.dtype) * scale, then cast to the requested dtype

Worked example (one word): q = [-8, -7, 0, 7, 1, 2, 3, -1]
  u = q + 8 = [0, 1, 8, 15, 9, 10, 11, 7]
  word = 0x7BA9F810 (u[0] in bits 0-3 ... u[7] in bits 28-31) = 2074736656.
  With u[7] = 15 the top bit is set and the int32 is negative:
  q = [7]*8 -> u = [15]*8 -> 0xFFFFFFFF -> int32 -1.

This module knows tensors only: no files, no modules, no matching of names.
"""

from __future__ import annotations

import torch

from diag.errors import DiagError

NUM_BITS = 4
OFFSET = 8  # stored nibble = q + OFFSET
Q_MIN, Q_MAX = -8, 7
PER_WORD = 32 // NUM_BITS  # 8 nibbles per int32
_SHIFTS = torch.arange(PER_WORD, dtype=torch.int64) * NUM_BITS  # [0, 4, ..., 28]


def check_group(width: int, group_size: int, *, field: str | None = None,
                file: str | None = None) -> int:
    """Number of groups along a row; fails unless group_size divides width and
    is a multiple of 8 (one int32 word never straddles two groups).
    Example: width 7168, group 32 -> 224 groups."""
    if group_size <= 0 or group_size % PER_WORD or width % group_size:
        raise DiagError("INT4 group size does not divide the weight width",
                        file=file, field=field,
                        expected=f"a multiple of {PER_WORD} dividing {width}",
                        found=f"group_size={group_size}")
    return width // group_size


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7] -> int32 words, 8 per word, least significant
    first.  [..., in] -> [..., in/8]."""
    if q.dtype != torch.int8:
        raise TypeError(f"pack_int4 wants int8 values, got {q.dtype}")
    width = q.shape[-1]
    if width % PER_WORD:
        raise DiagError("INT4 packing needs a width divisible by 8", field="weight",
                        expected="in % 8 == 0", found=f"in = {width}")
    u = (q.to(torch.int64) + OFFSET) & 0xF  # [..., in]
    u = u.unflatten(-1, (width // PER_WORD, PER_WORD))  # [..., in/8, 8]
    words = (u << _SHIFTS.to(u.device)).sum(dim=-1)  # [..., in/8], in [0, 2^32)
    words = torch.where(words >= 2**31, words - 2**32, words)  # two's complement
    return words.to(torch.int32)


def unpack_int4(packed: torch.Tensor, width: int) -> torch.Tensor:
    """int32 words -> int8 values in [-8, 7].  [..., in/8] -> [..., width].
    Byte order of the host does not matter: nibbles are read arithmetically."""
    if packed.dtype != torch.int32:
        raise TypeError(f"unpack_int4 wants int32 words, got {packed.dtype}")
    # int32 shifts are arithmetic (sign bits come in from the left) but the
    # & 0xF keeps only the 4 bits we want: 0x7BA9F810 >> 28 = 7; -1 >> 28 = -1, & 0xF = 15
    shifts = _SHIFTS.to(device=packed.device, dtype=torch.int32)
    u = (packed.unsqueeze(-1) >> shifts) & 0xF  # [..., in/8, 8] int32
    return (u.flatten(-2)[..., :width] - OFFSET).to(torch.int8)


def group_scales(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """Symmetric scale per group, in w's dtype: absmax / 7.5, zeros -> eps.
    [..., out, in] -> [..., out, in/group].
    Example: group [0.3, -1.5, 0.75, 0] -> absmax 1.5 -> scale 0.2."""
    check_group(w.shape[-1], group_size)
    groups = w.unflatten(-1, (w.shape[-1] // group_size, group_size))  # [..., out, G, g]
    absmax = groups.abs().amax(dim=-1)  # [..., out, G]
    half_range = torch.tensor((Q_MAX - Q_MIN) / 2, dtype=w.dtype, device=w.device)  # 7.5
    scale = absmax / half_range
    eps = torch.tensor(torch.finfo(w.dtype).eps, dtype=w.dtype, device=w.device)
    return torch.where(scale == 0, eps, scale)


def quantize_with(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q = clamp(round(w / scale), -8, 7) as int8, group size implied by
    scale's last dim.  [..., out, in], [..., out, G] -> int8 [..., out, in]."""
    num_groups = scale.shape[-1]
    groups = w.unflatten(-1, (num_groups, w.shape[-1] // num_groups))  # [..., out, G, g]
    scaled = groups / scale.unsqueeze(-1)  # in w's dtype, like the library
    q = torch.round(torch.clamp(scaled, Q_MIN, Q_MAX))  # half to even
    return q.flatten(-2).to(torch.int8)


def quantize_rtn(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest symmetric INT4 with per-group scales.
    [..., out, in] -> (q int8 [..., out, in], scale [..., out, in/group])."""
    scale = group_scales(w, group_size)
    return quantize_with(w, scale), scale


def dequantize_values(q: torch.Tensor, scale: torch.Tensor,
                      dtype: torch.dtype | None = None) -> torch.Tensor:
    """w' = q * scale per group, computed in scale's dtype, cast to dtype.
    [..., out, in] int8, [..., out, G] -> [..., out, in]."""
    num_groups = scale.shape[-1]
    groups = q.unflatten(-1, (num_groups, q.shape[-1] // num_groups))  # [..., out, G, g]
    w = (groups.to(scale.dtype) * scale.unsqueeze(-1)).flatten(-2)
    return w if dtype is None else w.to(dtype)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, shape: tuple[int, int] | torch.Size,
               group_size: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Packed checkpoint tensors -> dense weight.
    packed [..., out, in/8] int32, scale [..., out, in/group] -> [..., out, in]."""
    width = int(shape[-1])
    check_group(width, group_size)
    return dequantize_values(unpack_int4(packed, width), scale, dtype)


def fake_quantize(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """Quantize then dequantize, in w's dtype (compressed-tensors'
    fake_quantize numerics).  [..., out, in] -> [..., out, in]."""
    q, scale = quantize_rtn(w, group_size)
    return dequantize_values(q, scale, w.dtype)


def packed_width(width: int) -> int:
    """Number of int32 words per row: 7168 columns -> 896 words."""
    return width // PER_WORD
