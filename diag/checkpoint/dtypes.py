"""A tensor whose header dtype disagrees with the rest of its checkpoint, found from the
headers alone (issue 35): a drafter whose header calls one BF16 tensor F16 loads "fine", and
every value of that tensor is garbage.

The declared dtype is config.json's `dtype` (transformers 5) or `torch_dtype` (older), inside
`text_config` for a multimodal wrapper: "bfloat16" -> "BF16". A tensor's kind is its name with
the layer numbers replaced: model.layers.1.mlp.up_proj.weight -> model.layers.#.mlp.up_proj.weight.
A floating tensor of the declared dtype's width (F16 <-> BF16: the swap that keeps every byte
range valid; any other mislabel changes the range and fails in headers.py) is flagged when its
dtype is not the declared one and no other tensor of its kind carries it; a kind of one tensor (embed_tokens, lm_head, a
drafter's midlayer) is compared with every other floating tensor of the checkpoint instead.
Worked examples, declared bfloat16:
  layer 1's up_proj F16, the other 3 up_proj BF16          -> flagged (F16 != BF16, kind is BF16)
  every input_layernorm F32 (norms kept in fp32)           -> kept (another width, a real F32)
  embed_tokens F16, no other tensor F16                    -> flagged
  declared float16, one tensor BF16 among F16              -> flagged the same way

This module knows header dtypes and names; nothing about models or loading.
"""

from __future__ import annotations

import re
from collections import defaultdict

from diag.checkpoint.config import text_config
from diag.errors import DiagError

_WIDTH = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
FLOATS = {"float16": "F16", "half": "F16", "bfloat16": "BF16", "float32": "F32", "float": "F32",
          "float64": "F64"}
_LAYER = re.compile(r"\.\d+\.")


def declared_dtype(config: dict) -> tuple[str, str] | None:
    """(key, safetensors dtype) that config.json declares, or None: {"dtype": "bfloat16"} ->
    ("dtype", "BF16"); {"torch_dtype": "float16"} -> ("torch_dtype", "F16")."""
    for cfg in (config, text_config(config)):
        for key in ("dtype", "torch_dtype"):
            value = cfg.get(key)
            if isinstance(value, str) and value.removeprefix("torch.") in FLOATS:
                return key, FLOATS[value.removeprefix("torch.")]
    return None


def kind(name: str) -> str:
    """model.layers.12.mlp.experts.3.up_proj.weight -> model.layers.#.mlp.experts.#.up_proj.weight."""
    while (new := _LAYER.sub(".#.", name)) != name:
        name = new
    return name


def check_header_dtypes(infos: dict, config: dict, *, what: str, config_file: str) -> None:
    """DiagError naming the first tensor whose header dtype disagrees (module docstring).
    `infos`: name -> TensorInfo (diag.checkpoint.headers); `what`: "target" or "drafter"."""
    declared = declared_dtype(config)
    if declared is None:
        return
    key, want = declared
    floats = {n: i for n, i in infos.items() if _WIDTH.get(i.dtype) == _WIDTH[want]}
    kinds: dict[str, list[str]] = defaultdict(list)
    for name in floats:
        kinds[kind(name)].append(name)
    for name, info in sorted(floats.items()):
        if info.dtype == want:
            continue
        peers = [n for n in kinds[kind(name)] if n != name] or [n for n in floats if n != name]
        if peers and all(floats[n].dtype != info.dtype for n in peers):
            others = sorted({floats[n].dtype for n in peers})
            raise DiagError(f"{what} checkpoint: a tensor's header dtype disagrees with the checkpoint's "
                            "declared dtype and with every other tensor of its kind (a mislabelled header: "
                            "its bytes would be read as the wrong type)", file=str(info.file), field=name,
                            expected=f"{want} ({config_file} {key}; the {len(peers)} other tensors "
                                     f"{'of its kind' if kinds[kind(name)][1:] else 'of the checkpoint'}: "
                                     f"{', '.join(others)})",
                            found=info.dtype, hint="re-export the checkpoint, or fix that tensor's header")
