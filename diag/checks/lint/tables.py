"""Lint checks of the tables the engine swaps in (EngineRules.draft_tables): a drafter's own
embed_tokens or lm_head that the server never reads, the EAGLE vocabulary limit, and
eagle_config.use_aux_hidden_state (EngineRules.drafter_support), each in the engine's terms.

Each check takes the Pair (pair.py) and returns Findings; none reads a weight value.
"""

from __future__ import annotations

from diag.checks.lint.pair import Finding, Pair, algorithm, find
from diag.engines import engine, rules
from diag.engines.common import ServingError


def check_tables(p: Pair) -> list[Finding]:
    if "hidden_size" not in p.drafter or "vocab_size" not in p.drafter:
        return []
    out = []
    mode = "eagle" if algorithm(p) == "EAGLE" else "eagle3"
    rel = engine(p.engine)
    tables = rules(rel).draft_tables(p.drafter, mode, release=rel)
    embed, head = find(p.tensors, "embed_tokens.weight"), find(p.tensors, "lm_head.weight")
    if embed is not None and tables.embed == "target":
        out.append(Finding("info", "DRAFTER_EMBED_UNUSED", "the drafter checkpoint ships embed_tokens, "
                           "but the server embeds with the target's table", tables.why + (f" ({tables.source})" if tables.source else ""),
                           "nothing to do if the drafter was trained on the target's embeddings; "
                           "otherwise set target_hidden_size != hidden_size only if the widths "
                           "really differ", embed[1].file, embed[0]))
    if head is not None and tables.lm_head == "target" and mode == "eagle3":
        out.append(Finding("warning", "DRAFTER_HEAD_UNUSED", "the drafter config has no "
                           "draft_vocab_size, so its lm_head.weight is never read", tables.why,
                           "add draft_vocab_size (and d2t) if the drafter's own head was trained",
                           p.drafter_file, "draft_vocab_size"))
    if mode == "eagle" and tables.vocab_limit is not None:
        out.append(Finding("warning", "EAGLE_VOCAB_LIMIT", f"under EAGLE drafts are limited to the "
                           f"first {tables.vocab_limit} target token ids", tables.why,
                           "launch with --speculative-algorithm EAGLE3", None, "draft_vocab_size"))
    support = rules(rel).drafter_support(p.drafter, release=rel)
    aux, note = support.aux, support.aux_note
    if note is not None and not isinstance(p.plan, ServingError):
        out.append(Finding("warning" if not aux else "info", "USE_AUX_HIDDEN_STATE", note,
                           f"{p.engine} serves {p.plan.layout}", "remove the key, or put "
                           "use_aux_hidden_state = true in eagle_config for an EAGLE-3 drafter",
                           p.drafter_file, "eagle_config.use_aux_hidden_state"))
    return out
