"""Random tiny checkpoints in the real formats, for tests that need files but not quality:
bad-input errors, the pipeline's plumbing, the report's structure. (The zoo's trained
checkpoints are for tests about acceptance.)"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from diag.drafter.model import DrafterConfig, Eagle3Drafter
from diag.drafter.checkpoint import save_drafter

VOCAB = 300
HIDDEN = 32
LAYERS = 4


def make_tokenizer(out: Path, vocab: int = VOCAB) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from diag.zoo.tokenizer import padded_to

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|pad|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["def f(x):\n    return x + 1\n", "the quick brown fox"] * 20, trainer)
    tok = padded_to(tok, vocab)          # the whole vocabulary, as a real checkpoint's tokenizer has
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|eos|>")
    fast.save_pretrained(str(out))


def make_target(out: Path, seed: int = 0, vocab: int = VOCAB) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(str(out))
    make_tokenizer(out, vocab)
    return out


def make_drafter(out: Path, *, seed: int = 1, vocab: int = VOCAB, num_aux: int = 3,
                 ids: list[int] | None = (0, 1, 2), trained: str | None = "embed+L2+L3",
                 target_hidden: int = HIDDEN) -> Path:
    torch.manual_seed(seed)
    d = Eagle3Drafter(DrafterConfig(hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=4,
                                    intermediate_size=48, vocab_size=vocab, draft_vocab_size=vocab // 2,
                                    target_hidden_size=target_hidden, num_aux=num_aux))
    d.set_vocab(torch.arange(vocab // 2) * 2)
    save_drafter(d, out, aux_layer_ids=list(ids) if ids is not None else None, trained_layout=trained)
    return out


def make_prompts(out: Path, n: int = 4) -> Path:
    rows = [{"id": f"p{i}", "category": "code", "text": f"def f{i}(x):\n    return x"} for i in range(n)]
    rows.append({"id": "chat", "category": "chat", "messages": [{"role": "user", "content": "hi"}]})
    out.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return out


def write_case(path: Path, target: Path, drafter: Path, prompts: Path, **evaluate) -> Path:
    ev = {"layouts": ["embed+L2+L3", "L1+L2+L3"], "trees": ["chain-2"], **evaluate}
    lines = ['version = 1', 'name = "tiny"', "[target]", f'path = "{target}"', "[drafter]", f'path = "{drafter}"',
             "[prompts]", f'file = "{prompts}"', "max_new_tokens = 12", "[evaluate]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in ev.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


TIKTOKEN_FIXTURE = Path(__file__).parent / "fixtures" / "tiktoken_tokenizer"
# BPE merges after the 256 single bytes, in rank order; each is two earlier tokens joined.
TIKTOKEN_MERGES = (b"  ", b"    ", b"de", b"def", b"re", b"ur", b"urn", b"ret", b"return", b"in", b"th",
                   b"the", b" the", b"er", b"on", b"at")


def make_tiktoken_tokenizer(out: Path) -> Path:
    """Kimi's tokenizer layout at toy size: tiktoken.model (base64 token, rank), remote code
    tokenization_tiny_kimi.py named by tokenizer_config.json's auto_map, chat_template.jinja.
    256 bytes + 16 merges + 7 specials = 279 ids."""
    import base64
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    tokens = [bytes([b]) for b in range(256)] + list(TIKTOKEN_MERGES)
    (out / "tiktoken.model").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens)))
    for f in TIKTOKEN_FIXTURE.iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    return out
