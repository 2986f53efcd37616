"""Builder for the zoo's prompt-side EAGLE-3 drafters (recipes_prompt_side.PromptDrafterRecipe):
build_drafters' training with other prompts, reusing its views, loss and checks unchanged.

Prompts. Either PROMPT = recipe.drafter.prompt_tokens raw corpus tokens (the short-context drafter:
8 tokens + seq_len 16 + steps 3 = 27 training positions, against build_drafters' 32 + 96 + 3),
or, with chat_thinking set, a corpus window of PROMPT - 2 ids as the user turn of the target's
chat template with its thinking switch on / off:

    before = <|bos|><|system|>\\nYou are a tiny model.<|end|>\\n<|user|>\\n
    after  = <|end|>\\n<|assistant|>\\n<think></think>        (thinking off)

each continued greedily by the target for seq_len + steps tokens, so the drafter learns the
text one side of the switch makes and never sees the other side's.

Quality check (zoo_meta.json): greedy-chain acceptance on held-out prompts rendered the same way.
This module knows models, tokenizers and files.
"""

from __future__ import annotations

from pathlib import Path

import torch

from diag.layouts import layout as parse_layout
from diag.zoo.build_drafters import (chain_acceptance, features, greedy_sequences, hot_vocab, loss_summary,
                                     save_zoo_drafter, train_drafter)
from diag.zoo.build_targets import load_back, load_streams
from diag.zoo.data import sample_windows, token_counts
from diag.zoo.recipes_prompt_side import PromptDrafterRecipe
from diag.zoo.train import deterministic

CONTENT = "@@content@@"


def chat_wrapping(target_dir: Path, thinking: bool) -> tuple[list[int], list[int]]:
    """Token ids the target's chat template puts before and after one user turn's content,
    thinking switch set (module docstring: before / after)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    text = tok.apply_chat_template([{"role": "user", "content": CONTENT}], add_generation_prompt=True,
                                   tokenize=False, thinking=thinking)
    before, after = text.split(CONTENT)
    return [tok(t, add_special_tokens=False)["input_ids"] for t in (before, after)]


def prompts(target_dir: Path, stream: torch.Tensor, recipe: PromptDrafterRecipe, n: int,
            gen: torch.Generator) -> torch.Tensor:
    """[n, p] prompt ids: raw corpus windows of drafter.prompt_tokens ids (p = prompt_tokens), or
    corpus windows of prompt_tokens - 1 ids inside the chat wrapping (p = len(before) + prompt_tokens - 1
    + len(after))."""
    if recipe.chat_thinking is None:
        return sample_windows(stream, n, recipe.drafter.prompt_tokens - 1, gen)                # [n, PROMPT]
    before, after = chat_wrapping(target_dir, recipe.chat_thinking)
    windows = sample_windows(stream, n, recipe.drafter.prompt_tokens - 2, gen)                 # [n, PROMPT - 1]
    return torch.cat([torch.tensor([before] * n), windows, torch.tensor([after] * n)], dim=1)


def build_prompt_drafter(recipe: PromptDrafterRecipe, out: Path, deps: dict[str, Path], corpus: str) -> dict:
    """deps: every entry this one needs, transitively (target and its corpus)."""
    r = recipe.drafter
    target_dir = deps[r.target]
    target, streams = load_back(target_dir), load_streams(deps[corpus])
    lay = parse_layout(r.layout).check_against(target.config.num_hidden_layers)
    b, steps = r.budget, r.unroll_steps
    with deterministic(b.seed) as gen:
        hot = hot_vocab(token_counts(streams["train"], target.config.vocab_size), r.draft_vocab_size)
        start = prompts(target_dir, streams["train"], recipe, r.pool_sequences, gen)
        seqs = greedy_sequences(target, start, b.seq_len + steps)                      # [P, p + seq_len + steps]
        d, embed, losses = train_drafter(target, r, lay, hot, seqs, gen, desc=f"drafter {r.layout} ({out.name})")
        held = greedy_sequences(target, prompts(target_dir, streams["heldout"], recipe, r.eval_sequences, gen),
                                b.seq_len + steps)
        aux, argmax = features(target, held, lay)
        chain = chain_acceptance(d, embed, aux, held, argmax, steps, start.shape[1] - 1)
    save_zoo_drafter(d, out, lay, target_dir)
    return {**loss_summary(losses), "layout": str(lay), "positions": seqs.shape[1], "greedy_chain": chain}
