"""Quantization regimes (DESIGN.md §7): named transformations of a loaded
target's weights, applied in place before the replay.

  as-loaded     nothing
  bf16/fp16/fp32 cast floating weights (transformers' fp32-kept modules, e.g.
                DeepSeek-V3's router, stay fp32 under bf16/fp16, as at load)
  w4a16-g32     fake-quant: symmetric INT4 RTN per group of 32 (128), then
  w4a16-g128    dequantize; compressed-tensors numerics (diag.int4.format)
  fp8-e4m3      per output channel: scale = absmax/448, torch.float8_e4m3fn
                round trip, compressed-tensors numerics
Quantizing regimes carry compressed-tensors `targets` / `ignore` (matching:
diag.int4.scheme). Scopes: `all-linear` (every Linear, the default) and
`kimi` (routed experts only, Kimi's ignore list): "w4a16-g32:kimi".

Names are checkpoint names: a fused expert tensor `mlp.experts.gate_up_proj`
[E, 2I, H] is the Linears `mlp.experts.{e}.gate_proj` (rows [0, I)) and
`.up_proj` (rows [I, 2I)); `mlp.experts.down_proj` [E, H, I] is
`mlp.experts.{e}.down_proj`. Groups run along the input dimension, so
quantizing rows of gate_up_proj[e] together or apart gives the same result.

Packed INT4 modules (diag.int4.packed): a w4a16 with their group size is a
no-op (said in the notes); another group size re-quantizes the dequantized
weights; fp8 on packed weights is refused.

This module is data: names, kinds and scopes. Applying a regime to a loaded model is
quantize.py's job.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diag.errors import DiagError
from diag.int4.scheme import KIMI_IGNORE

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448.0
SCOPES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "all-linear": (("Linear",), ()),
    "kimi": (("Linear",), KIMI_IGNORE),
}
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Regime:
    """kind: "as-loaded" | "cast" | "w4a16" | "fp8"."""

    name: str
    kind: str
    dtype: torch.dtype | None = None  # cast
    group_size: int | None = None  # w4a16
    targets: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()


def _quant(name: str, kind: str, group: int | None, scope: str) -> Regime:
    targets, ignore = SCOPES[scope]
    return Regime(name if scope == "all-linear" else f"{name}:{scope}", kind,
                  group_size=group, targets=targets, ignore=ignore)


REGIMES: dict[str, Regime] = {
    "as-loaded": Regime("as-loaded", "as-loaded"),
    **{n: Regime(n, "cast", dtype=d) for n, d in _DTYPES.items()},
    **{f"w4a16-g{g}" + ("" if s == "all-linear" else f":{s}"): _quant(f"w4a16-g{g}", "w4a16", g, s)
       for g in (32, 128) for s in SCOPES},
    **{"fp8-e4m3" + ("" if s == "all-linear" else f":{s}"): _quant("fp8-e4m3", "fp8", None, s)
       for s in SCOPES},
}


def regime(text: str | Regime) -> Regime:
    """Parse "w4a16-g32", "w4a16-g32:kimi", "fp8-e4m3:all-linear", "bf16"."""
    if isinstance(text, Regime):
        return text
    key = text.strip()
    if key.endswith(":all-linear"):
        key = key[: -len(":all-linear")]
    if key not in REGIMES:
        raise DiagError("unknown regime", field="regimes", expected=", ".join(REGIMES),
                        found=repr(text))
    return REGIMES[key]


