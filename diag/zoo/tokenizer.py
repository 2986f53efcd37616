"""The zoo's tokenizer: byte-level BPE trained on the corpus, saved so that
`transformers.AutoTokenizer.from_pretrained(dir)` returns a fast tokenizer
with a chat template.

Special tokens take ids 0..6 in SPECIAL_TOKENS order:
    <|bos|>=0 <|eos|>=1 <|pad|>=2 <|system|>=3 <|user|>=4 <|assistant|>=5 <|end|>=6
Encoding with special tokens prepends <|bos|> (like Llama). The chat template
renders one user turn as

    <|bos|><|user|>\\n{content}<|end|>\\n<|assistant|>\\n

and an assistant turn ends with <|end|>; generation stops on <|eos|> or <|end|>.

This module knows tokenizers and their files; it knows nothing about models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from diag.zoo.recipes import SPECIAL_TOKENS, CorpusRecipe

BOS, EOS, PAD, SYSTEM, USER, ASSISTANT, END = SPECIAL_TOKENS

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# The chat template of llama-tiny-think (build_thinking.py): Kimi-K2.5's two switches in the zoo's
# tokens. A default system prompt when the conversation has none (Kimi's template adds "You are
# Kimi, ..."), and the thinking switch ending the generation prompt, as Kimi-K2.5 writes it:
#   {%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}
# so thinking is on unless the caller passes thinking=False. One user turn renders as
#   <|bos|><|system|>\nYou are a tiny model.<|end|>\n<|user|>\n{content}<|end|>\n<|assistant|>\n<think>
THINKING_SYSTEM_PROMPT = "You are a tiny model."
THINKING_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "<|system|>{{ '\\n' }}" + THINKING_SYSTEM_PROMPT + "<|end|>{{ '\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>{{ '\\n' }}{{ message['content'] }}<|end|>{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|assistant|>{{ '\\n' }}"
    "{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def train_tokenizer(texts: Iterable[str], recipe: CorpusRecipe) -> Tokenizer:
    """Byte-level BPE (GPT-2 pre-tokenization: runs of spaces stay together,
    so Python indentation costs few tokens)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=recipe.vocab_size, min_frequency=2,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(texts), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def chat_document(user: str, assistant: str) -> str:
    """The text a chat-formatted training document renders to: the template
    with one user turn, the generation prompt, then the assistant's turn."""
    return f"{BOS}{USER}\n{user}{END}\n{ASSISTANT}\n{assistant}{END}{EOS}"


def plain_document(text: str) -> str:
    return f"{BOS}{text}{EOS}"


def tokenizer_config(recipe: CorpusRecipe) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "additional_special_tokens": [SYSTEM, USER, ASSISTANT, END],
        "model_max_length": recipe.model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": True,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tok: Tokenizer, out_dir: Path, recipe: CorpusRecipe) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(recipe), indent=2) + "\n")


def copy_tokenizer(src_dir: Path, out_dir: Path) -> None:
    """Every checkpoint carries its own tokenizer files (loadable on its own)."""
    for name in TOKENIZER_FILES:
        (out_dir / name).write_bytes((src_dir / name).read_bytes())


def load_tokenizer(src_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(src_dir / "tokenizer.json"))


def padded_to(tok: Tokenizer, size: int) -> Tokenizer:
    """`tok` (a trained byte-level BPE) with its vocabulary filled up to `size` ids by unused
    entries "<|unused_i|>", as real checkpoints fill theirs for kernels and tensor parallelism,
    so that diag's tokenizer check (run/inputs.check_tokenizer: a tokenizer must produce >= 90%
    of vocab_size) sees a whole vocabulary. A few dozen training lines reach only a few hundred
    ids: Kimi-shaped's trainer stops at 288 of 163840. The merges are kept, so encoding is the
    trained tokenizer's; the filler ids are never produced by text.
    Example: 288 trained ids, size 512 -> ids 288..511 are <|unused_0|>..<|unused_223|>."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    added = {a["content"]: a["id"] for a in data.get("added_tokens", [])}
    taken = set(vocab.values()) | set(added.values())
    free = (i for i in range(size) if i not in taken)
    for n, i in enumerate(free):
        vocab[f"<|unused_{n}|>"] = i
    return Tokenizer.from_str(json.dumps(data))
