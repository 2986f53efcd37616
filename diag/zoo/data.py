"""Token streams for training and evaluating the zoo's models.

Documents become one flat id stream each for train and held-out. Every
`chat_every`-th train document is wrapped in the chat template (the file's
head as the user turn, the rest as the assistant turn), so replay prompts
that go through `apply_chat_template` are in-distribution:

    doc 0 plain, 1 plain, 2 plain, 3 chat, 4 plain, ...   (chat_every = 4)
    chat: <|bos|><|user|>\\n{first k lines}<|end|>\\n<|assistant|>\\n{rest}<|end|><|eos|>
          k = clamp(lines // 4, 1, 16)

Windows are [B, T+1] slices: inputs are [:, :T], next-token labels [:, 1:].

This module knows ids and windows; it knows nothing about models.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from diag.zoo.corpus import Document
from diag.zoo.tokenizer import chat_document, plain_document


def render(doc: Document, index: int, chat_every: int) -> str:
    """The training text for the index-th document (see module docstring)."""
    if chat_every <= 0 or index % chat_every != chat_every - 1:
        return plain_document(doc.text)
    lines = doc.text.splitlines(keepends=True)
    k = max(1, min(16, len(lines) // 4))
    head, tail = "".join(lines[:k]), "".join(lines[k:])
    return chat_document(head.rstrip("\n"), tail)


def encode_stream(tok: Tokenizer, docs: tuple[Document, ...], chat_every: int) -> torch.Tensor:
    """All documents, rendered and encoded, concatenated: int32 [N]."""
    texts = [render(d, i, chat_every) for i, d in enumerate(docs)]
    encs = tok.encode_batch(texts, add_special_tokens=False)
    return torch.tensor([i for e in encs for i in e.ids], dtype=torch.int32)


def sample_windows(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """B random windows of T+1 ids: int64 [B, T+1]. Starts are uniform in
    [0, N - T - 1], drawn from `gen` (so a seed fixes the whole run)."""
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch,), generator=gen)
    offsets = torch.arange(seq_len + 1)
    return stream[starts[:, None] + offsets[None, :]].long()  # [B, T+1]


def tile_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping windows from the start of the stream: int64 [W, T+1].
    Stream of 1000 ids, T=255 -> starts 0, 256, 512 (W=3; 768+256 > 1000-1)."""
    count = max(0, min(max_windows, (stream.numel() - 1) // (seq_len + 1)))
    starts = torch.arange(count) * (seq_len + 1)
    return stream[starts[:, None] + torch.arange(seq_len + 1)[None, :]].long()


def token_counts(stream: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each id occurs: int64 [V]."""
    return torch.bincount(stream.long(), minlength=vocab_size)
