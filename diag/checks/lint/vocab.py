"""Lint checks of the vocabularies and widths: vocab sizes, d2t / t2d, hidden sizes, embeddings.

Each check takes the Pair (pair.py) and returns Findings; none reads a weight value.
"""

from __future__ import annotations

from diag.checkpoint.config import hidden_size, text_config
from diag.checks.lint.pair import Finding, Pair, find
from diag.engines import rules


def _vocab_findings(p: Pair, draft_vocab: int, vocab: int) -> list[Finding]:
    out = []
    expect = {"lm_head.weight": (0, draft_vocab, "draft_vocab_size"),
              "d2t": (0, draft_vocab, "draft_vocab_size"), "t2d": (0, vocab, "vocab_size")}
    for key, (dim, want, label) in expect.items():
        hit = find(p.tensors, key)
        if hit is not None and hit[1].shape[dim] != want:
            out.append(Finding("error", "VOCAB_SHAPE", f"{key} has {hit[1].shape[dim]} rows, "
                               f"{label} is {want}", "weight loading fails or draft ids map to "
                               "the wrong target tokens", f"make {key} and {label} agree",
                               hit[1].file, hit[0]))
    if draft_vocab < vocab and p.tensors and find(p.tensors, "d2t") is None:
        out.append(Finding("error", "D2T_MISSING", f"draft_vocab_size {draft_vocab} < vocab_size "
                           f"{vocab} but the checkpoint has no d2t", f"{rules(p.engine).display} has no hot-token map: "
                           "draft ids are taken as target ids and almost never accepted",
                           "save the d2t tensor from training", p.drafter_file, "d2t"))
    return out


def check_vocab(p: Pair) -> list[Finding]:
    text = text_config(p.target)
    vocab, target_vocab = p.drafter.get("vocab_size"), text.get("vocab_size")
    draft_vocab = p.drafter.get("draft_vocab_size") or vocab
    out = []
    if isinstance(vocab, int) and isinstance(target_vocab, int) and vocab != target_vocab:
        out.append(Finding("error", "TARGET_VOCAB", f"drafter vocab_size {vocab} != target "
                           f"vocab_size {target_vocab}", "the target's embedding table is "
                           "shared with the drafter; token ids beyond either table fail",
                           "set the drafter's vocab_size to the target's", p.drafter_file,
                           "vocab_size"))
    for key, dtype in (("d2t", "I64"), ("t2d", "BOOL")):
        hit = find(p.tensors, key)
        if hit is not None and hit[1].dtype != dtype:
            out.append(Finding("warning", "VOCAB_DTYPE", f"{key} is {hit[1].dtype}, expected "
                               f"{dtype}", f"{rules(p.engine).display} uses d2t as integer offsets",
                               f"save {key} as {dtype}", hit[1].file, hit[0]))
    if isinstance(vocab, int) and isinstance(draft_vocab, int):
        out += _vocab_findings(p, draft_vocab, vocab)
    return out


def check_hidden(p: Pair) -> list[Finding]:
    h_t, h = hidden_size(p.target), hidden_size(p.drafter)
    declared = p.drafter.get("target_hidden_size")
    if declared is not None and declared != h_t:
        return [Finding("error", "TARGET_HIDDEN_SIZE", f"target_hidden_size {declared} != "
                        f"target hidden_size {h_t}", "fc is built for the wrong width; loading "
                        "or the first draft forward fails", f"set target_hidden_size to {h_t}",
                        p.drafter_file, "target_hidden_size")]
    if h == h_t:
        return []
    if declared is None:
        return [Finding("error", "HIDDEN_SIZE", f"drafter hidden {h} != target hidden {h_t} and "
                        "no target_hidden_size", f"{rules(p.engine).display} assumes target width = drafter width: fc "
                        "is built for the wrong input and the target's embeddings replace the "
                        "drafter's", f"add \"target_hidden_size\": {h_t}", p.drafter_file,
                        "hidden_size")]
    if p.tensors and find(p.tensors, "embed_tokens.weight") is None:
        return [Finding("error", "EMBED_MISSING", f"drafter hidden {h} != target hidden {h_t} "
                        "but the checkpoint has no embed_tokens", f"{rules(p.engine).display} keeps the drafter's own "
                        "embedding when widths differ; it stays uninitialised",
                        "save embed_tokens.weight with the drafter", p.drafter_file,
                        "embed_tokens.weight")]
    return []
