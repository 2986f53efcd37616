"""Whose embedding table and lm_head the served drafter uses, and how many logits it scores.

SGLang's draft worker (speculative/eagle_worker.py, eagle_worker_v2.py) takes the target's
`get_embed_and_head()` and, identically in every release 0.5.6-0.5.23:
- EAGLE3, drafter config with "draft_vocab_size": null (or, for the MLA class, without the
  key; the Llama class then fails to build: drafter_keys.draft_vocab_crash), so that
  llama_eagle3.py sets load_lm_head_from_target: `set_embed_and_head(embed, head)`, the
  target's embedding AND lm_head; the drafter's own lm_head weights are never used.
- EAGLE3 otherwise: `set_embed(embed)` (models/llama.py), which keeps the drafter's own
  embed_tokens only when its config has target_hidden_size != hidden_size ("the embed
  weight cannot be shared"); else the target's table replaces it, even when the drafter
  checkpoint ships embed_tokens. The drafter's lm_head and d2t stay.
- EAGLE (and NEXTN): `set_embed_and_head(embed, head)` always; d2t is not read.
- The draft logits processor keeps `vocab_size = draft_vocab_size` (llama_eagle3.py,
  `config_.vocab_size = config_.draft_vocab_size`; LogitsProcessor slices
  `logits[:, :vocab_size]`). With the target's head swapped in under EAGLE, drafts are
  limited to the FIRST draft_vocab_size target ids.
Worked example (Kimi drafter: hidden 7168, no target_hidden_size, draft_vocab_size 32000,
target vocab 163840):
  eagle3 -> embed "target", lm_head "drafter" (32000 rows, mapped with d2t), no limit
  eagle  -> embed "target", lm_head "target", drafts among target ids 0..31999 only.
With target_hidden_size 4096 != hidden_size 2048 under eagle3 -> embed "drafter".

This module knows config values and names; it knows nothing about tensors or files.
"""

from __future__ import annotations


from diag.engines.common import DraftTables

SOURCE = ("python/sglang/srt/speculative/eagle_worker.py (eagle_worker_v2.py), "
          "models/llama.py set_embed, models/llama_eagle3.py")


def draft_tables(mode: str, *, hidden_size: int, target_hidden_size: int | None,
                 draft_vocab_size: int | None, vocab_size: int) -> DraftTables:
    """The tables SGLang's draft worker uses in `mode` ("eagle3" or "eagle").
    target_hidden_size / draft_vocab_size: None when the drafter config has no such key or
    null (whether a missing key crashes is drafter_keys.draft_vocab_crash's question)."""
    own_embed = target_hidden_size is not None and target_hidden_size != hidden_size
    if mode == "eagle":
        limit = draft_vocab_size if draft_vocab_size and draft_vocab_size < vocab_size else None
        why = ("EAGLE: set_embed_and_head swaps in the target's embedding and lm_head; the draft "
               "logits processor keeps vocab_size = draft_vocab_size"
               + (f", so drafts are limited to target ids 0..{limit - 1}" if limit else ""))
        return DraftTables("target", "target", limit, False, why)
    if draft_vocab_size is None:
        return DraftTables("target", "target", None, False,
                           "EAGLE3 with draft_vocab_size null: load_lm_head_from_target, so "
                           "set_embed_and_head uses the target's embedding and lm_head")
    if own_embed:
        return DraftTables("drafter", "drafter", None, True,
                           f"EAGLE3: target_hidden_size {target_hidden_size} != hidden_size "
                           f"{hidden_size}, so set_embed keeps the drafter's own embed_tokens")
    return DraftTables("target", "drafter", None, True,
                       "EAGLE3: set_embed replaces the drafter's embed_tokens with the target's "
                       "(target_hidden_size equals hidden_size or is absent)")


def draft_tables_for(drafter_config: dict, mode: str) -> DraftTables:
    """draft_tables read off a drafter config.json dict (missing keys stay None)."""
    def opt(key):
        value = drafter_config.get(key)
        return None if value is None else int(value)
    return draft_tables(mode, hidden_size=int(drafter_config["hidden_size"]),
                        target_hidden_size=opt("target_hidden_size"),
                        draft_vocab_size=opt("draft_vocab_size"),
                        vocab_size=int(drafter_config["vocab_size"]))
