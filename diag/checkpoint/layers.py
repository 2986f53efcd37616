"""Decoder layers in a checkpoint's weight names against the layer count its config declares.

A config with fewer layers than its weights would make transformers drop the extra layers
without a word (it reports them only as "unexpected"), and one with more would leave layers
random; both are errors here, from the safetensors headers alone, before any weight is read.
Layer weights are named `model.layers.{i}.` (a multimodal wrapper adds `language_model.`
before or after `model.`). DeepSeek-V3 style checkpoints also ship their multi-token-
prediction layers after the decoder (`num_nextn_predict_layers` of them, which every loader
skips); such a layer is told apart by its own weights, `eh_proj`, `enorm` and `hnorm`.

Worked example: num_hidden_layers 3, weights for model.layers.0..3 -> DiagError naming
model.layers.3.*: "num_hidden_layers = 3 (layers 0-2)", found "weights for layers 0-3".
DeepSeek-V3: num_hidden_layers 61, num_nextn_predict_layers 1, weights for 0..61 where 61
holds model.layers.61.eh_proj.weight -> fine.

This module knows names and config keys; nothing about models.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from diag.checkpoint.config import text_config
from diag.errors import DiagError

_LAYER = re.compile(r"^(?:language_model\.)?model\.(?:language_model\.)?layers\.(\d+)\.")
_MTP_PARTS = (".eh_proj.", ".enorm.", ".hnorm.")


def layer_index(name: str) -> int | None:
    """"model.layers.12.mlp.up_proj.weight" -> 12; "lm_head.weight" -> None."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def _span(indices: list[int]) -> str:
    return f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0])


def check_layer_count(names: Iterable[str], config: dict, *, file: str, config_file: str) -> None:
    """The decoder layers named by the weights are exactly 0..N-1 (plus the MTP layers)."""
    tcfg = text_config(config)
    n, mtp = int(tcfg["num_hidden_layers"]), int(tcfg.get("num_nextn_predict_layers") or 0)
    by_layer: dict[int, str] = {}
    mtp_layers: set[int] = set()
    for name in names:
        i = layer_index(name)
        if i is not None:
            by_layer.setdefault(i, name)
            if any(part in name for part in _MTP_PARTS):
                mtp_layers.add(i)
    found = sorted(by_layer)
    if not found:
        return
    extra = [i for i in found if i >= n and not (i < n + mtp and i in mtp_layers)]
    if extra:
        raise DiagError("the checkpoint holds more decoder layers than config.json declares (the extra "
                        "layers would be dropped silently)", file=file, field=by_layer[extra[0]],
                        expected=f"{config_file} num_hidden_layers = {n} (layers 0-{n - 1}"
                                 + (f", plus {mtp} MTP layer(s)" if mtp else "") + ")",
                        found=f"weights for layers {_span(found)}",
                        hint="fix num_hidden_layers, or point --target at the matching checkpoint")
    missing = [i for i in range(n) if i not in by_layer]
    if missing:
        raise DiagError("config.json declares decoder layers the checkpoint has no weights for",
                        file=config_file, field="num_hidden_layers",
                        expected=f"weights for layers 0-{n - 1} in {file}",
                        found=f"no weights for layer(s) {missing[:8]}")


_EMBED = re.compile(r"^(?:language_model\.)?model\.(?:language_model\.)?embed_tokens\.weight$")


def check_embedding(shapes: dict[str, tuple[int, ...]], config: dict, *, file: str, config_file: str) -> None:
    """The embedding's header shape [vocab_size, hidden_size] against config.json, so a config
    that disagrees with its own weights is named, not the drafter built for the weights.
    Example: config hidden_size 64, model.embed_tokens.weight [300, 32] -> DiagError naming
    config.json hidden_size, expected 32 (the weights), found 64."""
    tcfg = text_config(config)
    name = next((n for n in shapes if _EMBED.match(n)), None)
    if name is None or len(shapes[name]) != 2:
        return
    for key, size in zip(("vocab_size", "hidden_size"), shapes[name]):
        if tcfg.get(key) != size:
            raise DiagError(f"the target's config.json disagrees with its own weights on {key}",
                            file=config_file, field=key,
                            expected=f"{size} ({name} is {list(shapes[name])} in {file})", found=tcfg.get(key),
                            hint="fix config.json, or point --target at the checkpoint it belongs to")
