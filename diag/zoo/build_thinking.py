"""Builder for llama-tiny-think: a zoo target whose chat template's thinking switch changes what
it writes (recipes.ThinkingRecipe), so a drafter trained on one side of the switch and served on
the other loses acceptance for the reason real ones do: it never saw that text.

Training documents, per corpus file (head = its first `head_lines` non-empty lines from the first
def / class on, rest = the lines after), rendered through THINKING_CHAT_TEMPLATE exactly as
serving renders them, then the assistant's turn:

    thinking on   ...<|assistant|>\\n<think>  + "\\n" + HEAD UPPER CASE + "\\n</think>\\n" + rest
    thinking off  ...<|assistant|>\\n<think></think>  + "\\n" + rest

each cut to seq_len + 1 tokens (documents shorter than that are left out), both renders of
every file in the pool. The source target's weights are the start; the saved tokenizer carries
the thinking template as its chat_template.

Quality check (zoo_meta.json): the share of upper-case letters among the letters of the greedy
continuations of held-out heads, thinking on and off (on >> off when the switch took).
This module knows models, tokenizers and files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from diag.zoo import tokenizer as tk
from diag.zoo.build_targets import load_back, load_heldout_docs
from diag.zoo.corpus import collect
from diag.zoo.recipes import ZOO
from diag.zoo.recipes_prompt_side import ThinkingRecipe
from diag.zoo.targets import save_target
from diag.zoo.train import deterministic, optimize

SAMPLES = 8            # held-out heads for the quality check
NEW_TOKENS = 32


def head_and_rest(text: str, lines: int) -> tuple[str, str]:
    """First `lines` non-empty lines from the first def / class on, and the 40 after them."""
    body = [ln for ln in text.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(body) if ln.lstrip().startswith(("def ", "class "))), 0)
    return "\n".join(body[start:start + lines]), "\n".join(body[start + lines:start + lines + 40])


def generation_prompt(tok, head: str, thinking: bool) -> str:
    return tok.apply_chat_template([{"role": "user", "content": head}], chat_template=tk.THINKING_CHAT_TEMPLATE,
                                   add_generation_prompt=True, tokenize=False, thinking=thinking)


def document(tok, head: str, rest: str, thinking: bool) -> str:
    """A whole training document (module docstring)."""
    think = "\n" + head.upper() + "\n</think>" if thinking else ""
    return generation_prompt(tok, head, thinking) + think + "\n" + rest


def training_rows(tok, texts, recipe: ThinkingRecipe) -> torch.Tensor:
    """[N, seq_len + 1] token ids, both renders of every long enough document."""
    width, rows = recipe.budget.seq_len + 1, []
    for text in texts:
        head, rest = head_and_rest(text, recipe.head_lines)
        for thinking in (True, False):
            ids = tok(document(tok, head, rest, thinking), add_special_tokens=False, verbose=False)["input_ids"]
            if len(ids) >= width:
                rows.append(ids[:width])
    return torch.tensor(rows)


@torch.no_grad()
def upper_share(model, tok, heads: list[str], thinking: bool) -> float:
    """Upper-case letters / letters over the greedy continuations of the heads' prompts."""
    upper = letters = 0
    for head in heads:
        ids = tok(generation_prompt(tok, head, thinking), add_special_tokens=False)["input_ids"]
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
        text = tok.decode(out[0, len(ids):])
        upper += sum(ch.isupper() for ch in text)
        letters += sum(ch.isalpha() for ch in text)
    return upper / max(letters, 1)


def build_thinking(recipe: ThinkingRecipe, out: Path, deps: dict[str, Path]) -> dict:
    from transformers import AutoTokenizer
    src, corpus_dir = deps[recipe.source], deps[recipe.corpus]
    tok = AutoTokenizer.from_pretrained(str(src))
    rows = training_rows(tok, [d.text for d in collect(ZOO[recipe.corpus].recipe).train], recipe)
    b = recipe.budget
    with deterministic(b.seed) as gen:
        model = load_back(src).train()

        def loss(_step: int) -> torch.Tensor:
            w = rows[torch.randint(0, len(rows), (b.batch,), generator=gen)]                # [B, T+1]
            logits = model(input_ids=w[:, :-1], use_cache=False).logits                      # [B, T, V]
            return F.cross_entropy(logits.flatten(0, 1).float(), w[:, 1:].flatten())

        losses = optimize(model.parameters(), b, loss, desc="fine-tune thinking")
        model.eval()
        eos = model.generation_config.eos_token_id
        save_target(model, out, "float32", eos if isinstance(eos, list) else [eos])
        tk.copy_tokenizer(src, out)
        cfg = json.loads((out / "tokenizer_config.json").read_text())
        (out / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": tk.THINKING_CHAT_TEMPLATE},
                                                              indent=2) + "\n")
        heads = [head_and_rest(d.text, recipe.head_lines)[0] for d in load_heldout_docs(corpus_dir)[:SAMPLES]]
        loaded = load_back(out)
        meta = {"rows": len(rows), "train_loss_first": losses[0], "train_loss_last": sum(losses[-10:]) / 10,
                "upper_share_thinking": upper_share(loaded, tok, heads, True),
                "upper_share_no_thinking": upper_share(loaded, tok, heads, False)}
    return meta
