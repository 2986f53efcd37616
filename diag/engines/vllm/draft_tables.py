"""Whose embedding and lm_head a vLLM release gives an EAGLE-3 drafter, and whether d2t maps its ids,
from table.py's "draft_weights" and "draft_vocab" rows (read from the proposer's load_model and
llama_eagle3.py in each wheel).

The rows, by release range:
    0.8.5–0.8.5.post1  embed: the target's unless the checkpoint has model.embed_tokens.weight; lm_head: own
    0.9.0–0.9.1        embed: always the target's;                                     lm_head: own
    0.9.2–0.10.2       embed: the target's when the shapes are equal;                  lm_head: own
    0.11.0             embed and lm_head: the target's when the shapes are equal
    0.11.1–0.34.0      embed and lm_head: the target's when the checkpoint has none or an identical one
Shapes come from config.json: embed [vocab_size, hidden_size] against the target's
[vocab_size, target_hidden_size or hidden_size]; lm_head [draft_vocab_size or vocab_size, hidden].
Worked example (vLLM 0.11.0, drafter hidden 2048 = target's, vocab 32000, draft_vocab_size 32000):
embed "target", lm_head "target" — the drafter's trained lm_head is not used.
Where the answer depends on the checkpoint's tensors (0.8.5, 0.11.1+), the embedding is the
target's when the shapes match (a checkpoint without embed_tokens, or with the target's, is served
so; one with its own distinct table is not, and `why` says so) and the lm_head the drafter's.
Method "eagle" (EAGLE-1): the lm_head is the target's up to 0.11.0 (`method != "eagle3"`), then
the same checkpoint rule; no d2t.
This module knows config keys and the rows.
"""

from __future__ import annotations

from diag.engines.common import DraftTables
from diag.engines.vllm.releases import VllmRelease, rule_row, span
from diag.errors import DiagError


def _same_shape(cfg: dict) -> bool:
    """The drafter's embedding has the target's shape: its hidden size is the target's."""
    target_hidden = cfg.get("target_hidden_size")
    return target_hidden is None or int(target_hidden) == int(cfg["hidden_size"])


def draft_tables(drafter_config: dict, mode: str, eng: str | VllmRelease | None) -> DraftTables:
    if mode not in ("eagle3", "eagle"):
        raise DiagError("not a vLLM EAGLE method", field="method", expected="eagle3 or eagle", found=mode)
    weights, vocab = rule_row("draft_weights", eng), rule_row("draft_vocab", eng)
    embed_rule, head_rule = weights.value
    shape = _same_shape(drafter_config)
    if mode == "eagle":
        # method "eagle": the proposer's sharing rule with EAGLE-1's lm_head branch; d2t is EAGLE-3's only.
        head = "target" if "only EAGLE-1 takes the target's" in head_rule or "shape equals" in head_rule \
            else "drafter"
        lm = "lm_head: the target's (method eagle)" if head == "target" else head_rule
        return DraftTables("target" if embed_rule.startswith("embed: always") or shape else "drafter", head, None,
                           False, f"vLLM {span(weights)} ({weights.source}), method eagle: {embed_rule}; {lm}")
    draft_vocab, full = drafter_config.get("draft_vocab_size"), drafter_config.get("vocab_size")
    full_head = draft_vocab is None or draft_vocab == full
    # "always": the target's; shape rules and checkpoint rules alike: the target's when the shapes
    # match (a checkpoint rule keeps the drafter's own only if its tensor differs, which config.json
    # cannot show: `why` says so), the drafter's own otherwise.
    embed = "target" if embed_rule.startswith("embed: always the target's") or shape else "drafter"
    head = "target" if "shape equals" in head_rule and shape and full_head else "drafter"
    uses_d2t = vocab.value[1].startswith("d2t always") or not full_head
    why = f"vLLM {span(weights)} ({weights.source}): {embed_rule}; {head_rule}. " \
          f"vLLM {span(vocab)}: {vocab.value[0]}, {vocab.value[1]}"
    return DraftTables(embed, head, None, uses_d2t, why)
