"""Builder for derived zoo drafters: a trained drafter with one documented change, no training.

Hot vocabulary cut: the source's hot ids minus a token class (TOKEN_CLASSES, judged on each
id's decoded text), the matching rows of lm_head kept in order, d2t / t2d rebuilt for the
smaller draft vocabulary. Worked example: hot ids [4, 9, 12, 30] where 9 and 30 are
whitespace -> kept draft rows [0, 2] (ids [4, 12]), draft_vocab_size 2, d2t [4, 11].
Every kept token's logit is the source's, so the drafter proposes what the source proposed
wherever that was a kept token.

Config overrides: config.json keys replaced after the weights are written (the weights do not
change; what the engine reads does).

This module knows drafters, tokenizers and files; the recipe says what to change.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from diag.drafter.checkpoint import load_drafter, save_drafter
from diag.drafter.model import Eagle3Drafter
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


def build_derived(recipe: DerivedDrafterRecipe, out: Path, deps: dict[str, Path], target: str) -> dict:
    src = deps[recipe.source]
    d, ckpt = load_drafter(src)
    meta: dict = {"source": recipe.source, "draft_vocab_size_source": d.cfg.draft_vocab_size}
    extra = {k: v for k, v in ckpt.config.items() if k.startswith("diag_") and k != "diag_trained_layout"}
    if recipe.hot_vocab_excludes:
        summary, test = TOKEN_CLASSES[recipe.hot_vocab_excludes]
        tok = tk.load_tokenizer(deps[target])
        drop = torch.tensor([test(tok.decode([i])) for i in range(d.cfg.vocab_size)])
        d = cut_vocabulary(d, drop)
        meta.update({"hot_vocab_excludes": recipe.hot_vocab_excludes, "token_class": summary,
                     "removed_from_hot": meta["draft_vocab_size_source"] - d.cfg.draft_vocab_size})
        extra["diag_hot_vocab_excludes"] = recipe.hot_vocab_excludes
    extra.update(dict(recipe.config_overrides))
    ids = (ckpt.config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    save_drafter(d, out, aux_layer_ids=ids, trained_layout=ckpt.config.get("diag_trained_layout"),
                 extra_config={**extra, "diag_derived_from": recipe.source})
    meta.update({"draft_vocab_size": d.cfg.draft_vocab_size, "config_overrides": dict(recipe.config_overrides)})
    return meta
