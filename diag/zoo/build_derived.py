"""Builder for derived zoo drafters (recipes.DerivedDrafterRecipe): a trained drafter with
documented changes, no training. Each change is optional; they compose in this order.

Hot vocabulary cut (`hot_vocab_excludes`): the source's hot ids minus a token class
(TOKEN_CLASSES, judged on each id's decoded text), the matching rows of lm_head kept in order,
d2t / t2d rebuilt for the smaller draft vocabulary. Worked example: hot ids [4, 9, 12, 30] where
9 and 30 are whitespace -> kept draft rows [0, 2] (ids [4, 12]), draft_vocab_size 2, d2t [4, 11].
Every kept token's logit is the source's, so the drafter proposes what the source proposed
wherever that was a kept token. Without a cut the source's weights are copied byte for byte.

Layer ids (`convention`): config.json's ids written in that convention for the trained layout,
diag_trained_layout removed (the weights do not change; what the engine reads does).
embed+L2+L4 on 6 layers, "vllm" -> eagle_aux_hidden_state_layer_ids [0, 2, 4].

This module knows drafters, tokenizers and files; the recipe says what to change.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch

from diag.drafter.checkpoint import load_drafter, save_drafter
from diag.drafter.model import Eagle3Drafter
from diag.engines.conventions import to_ids
from diag.errors import DiagError
from diag.layouts import layout as parse_layout
from diag.zoo import tokenizer as tk
from diag.zoo.recipes import DerivedDrafterRecipe

TOKEN_CLASSES = {
    "whitespace": ("tokens whose text is only whitespace: newlines and indentation runs",
                   lambda s: s != "" and s.strip() == ""),
    "digits": ("tokens holding a decimal digit", lambda s: any(ch.isdigit() for ch in s)),
}


def cut_vocabulary(d: Eagle3Drafter, drop: torch.Tensor) -> Eagle3Drafter:
    """A copy of d without the hot ids where drop [V] (bool, target ids) is true."""
    hot = d.to_target_ids(torch.arange(d.cfg.draft_vocab_size))                  # [Vd] ascending
    rows = (~drop[hot]).nonzero().flatten()                                     # kept draft ids
    out = Eagle3Drafter(dataclasses.replace(d.cfg, draft_vocab_size=len(rows)))
    state = {k: v for k, v in d.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    out.load_state_dict({**out.state_dict(), **state})
    out.lm_head.weight.data.copy_(d.lm_head.weight.data[rows])
    out.set_vocab(hot[rows])
    return out


def build_derived(recipe: DerivedDrafterRecipe, out: Path, source: Path, target: Path, trained: str) -> dict:
    """source: the trained drafter's entry, target: its target's, trained: its layout."""
    meta: dict = {"source": recipe.source}
    if recipe.hot_vocab_excludes:
        meta.update(_cut(recipe, out, source, target))
    else:
        for fname in ("config.json", "model.safetensors"):
            shutil.copyfile(source / fname, out / fname)
    if recipe.convention is not None:
        meta.update(_rewrite_ids(recipe.convention, out, target, trained))
    return meta


def _cut(recipe: DerivedDrafterRecipe, out: Path, source: Path, target: Path) -> dict:
    """The source without recipe.hot_vocab_excludes in its hot vocabulary, written to out."""
    d, ckpt = load_drafter(source)
    before = d.cfg.draft_vocab_size
    extra = {k: v for k, v in ckpt.config.items() if k.startswith("diag_") and k != "diag_trained_layout"}
    summary, test = TOKEN_CLASSES[recipe.hot_vocab_excludes]
    tok = tk.load_tokenizer(target)
    drop = torch.tensor([test(tok.decode([i])) for i in range(d.cfg.vocab_size)])
    d = cut_vocabulary(d, drop)
    extra["diag_hot_vocab_excludes"] = recipe.hot_vocab_excludes
    ids = (ckpt.config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    save_drafter(d, out, aux_layer_ids=ids, trained_layout=ckpt.config.get("diag_trained_layout"),
                 extra_config={**extra, "diag_derived_from": recipe.source})
    return {"draft_vocab_size_source": before, "hot_vocab_excludes": recipe.hot_vocab_excludes,
            "token_class": summary, "removed_from_hot": before - d.cfg.draft_vocab_size,
            "draft_vocab_size": d.cfg.draft_vocab_size}


def _rewrite_ids(convention: str, out: Path, target: Path, trained: str) -> dict:
    """out's config.json with its ids written in `convention` for the trained layout and
    diag_trained_layout removed. embed+L2+L4, vllm -> [0, 2, 4]."""
    n = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    ids = to_ids(parse_layout(trained), convention, n)
    if ids is None:
        raise DiagError("the layout cannot be written in this convention", field="convention",
                        expected=f"a convention that captures {trained} on {n} layers", found=convention)
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    cfg.pop("diag_trained_layout", None)
    cfg["diag_layer_id_convention"] = convention
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return {"eagle_aux_hidden_state_layer_ids": ids, "convention": convention, "trained_layout": trained}
