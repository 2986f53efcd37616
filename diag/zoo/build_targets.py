"""Builders for the corpus entry and the target checkpoints.

Corpus entry files:
  tokenizer.json, tokenizer_config.json   the BPE tokenizer (tokenizer.py)
  tokens.safetensors                      "train" int32 [N], "heldout" int32 [M] (data.py)
  heldout.jsonl                           {"path", "text"} per held-out file (prompt material)
  corpus.json                             source, file lists, sha256, sizes

A target is trained in float32, saved in its recipe's dtype, then loaded back
with AutoModelForCausalLM (a missing or unexpected key is an error, not a
warning); perplexity and the greedy continuation check run on the loaded copy,
so they describe the files on disk.

DeepSeek's router is balanced the way DeepSeek-V3 does without an auxiliary
loss: after each step, e_score_correction_bias[e] += gamma * sign(mean load - load[e]).

Each builder returns the metadata that build.py writes into zoo_meta.json.
"""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from diag.errors import DiagError
from diag.zoo import tokenizer as tk
from diag.zoo.corpus import Document, collect
from diag.zoo.data import encode_stream
from diag.zoo.quality import greedy_continuations, python_prompts, summarize
from diag.zoo.recipes import CorpusRecipe, DeepseekShape, TargetRecipe
from diag.zoo.targets import new_model, save_target
from diag.zoo.train import deterministic, perplexity, train_lm

BALANCE_GAMMA = 0.01


def build_corpus(recipe: CorpusRecipe, out: Path) -> dict:
    corpus = collect(recipe)
    if not corpus.heldout or not corpus.train:
        raise DiagError("the corpus recipe leaves no held-out or no train file", field="byte_budget",
                        expected="both splits non-empty (raise byte_budget or lower max_file_bytes)",
                        found=f"{len(corpus.train)} train, {len(corpus.heldout)} held-out files")
    tok = tk.train_tokenizer((d.text for d in corpus.train), recipe)
    tk.save_tokenizer(tok, out, recipe)
    train = encode_stream(tok, corpus.train, recipe.chat_every)
    heldout = encode_stream(tok, corpus.heldout, 0)
    save_file({"train": train, "heldout": heldout}, str(out / "tokens.safetensors"))
    with open(out / "heldout.jsonl", "w") as fh:
        for d in corpus.heldout:
            fh.write(json.dumps({"path": d.path, "text": d.text}) + "\n")
    info = {"stdlib": corpus.stdlib, "python": platform.python_version(), "sha256": corpus.sha256,
            "bytes": corpus.num_bytes, "train_files": [d.path for d in corpus.train],
            "heldout_files": [d.path for d in corpus.heldout],
            "train_tokens": train.numel(), "heldout_tokens": heldout.numel()}
    (out / "corpus.json").write_text(json.dumps(info, indent=2) + "\n")
    return {k: info[k] for k in ("python", "sha256", "bytes", "train_tokens", "heldout_tokens")}


def unigram_perplexity(streams: dict[str, torch.Tensor], vocab_size: int) -> float:
    """Held-out perplexity of add-one unigram frequencies from the train stream: the bar
    a trained target must clear by a wide margin (about 540 on the stdlib corpus)."""
    counts = torch.bincount(streams["train"].long(), minlength=vocab_size).double() + 1
    logp = (counts / counts.sum()).log()
    return math.exp(-float(logp[streams["heldout"].long()].mean()))


def load_streams(corpus_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(corpus_dir / "tokens.safetensors"))


def load_heldout_docs(corpus_dir: Path) -> tuple[Document, ...]:
    with open(corpus_dir / "heldout.jsonl") as fh:
        return tuple(Document(r["path"], r["text"]) for r in map(json.loads, fh))


class ExpertBalancer:
    """Counts routed tokens per expert (router forward hooks) and nudges the
    correction bias toward equal load after every optimizer step."""

    def __init__(self, model: torch.nn.Module, gamma: float = BALANCE_GAMMA):
        self.routers = [m for m in model.modules() if hasattr(m, "e_score_correction_bias")]
        self.loads = [torch.zeros(r.e_score_correction_bias.numel()) for r in self.routers]
        self.gamma = gamma
        for i, r in enumerate(self.routers):
            r.register_forward_hook(lambda _m, _in, out, i=i: self._count(i, out))

    def _count(self, i: int, router_out: tuple) -> None:
        """The router returns (logits, weights, indices) in transformers 5; take the integer one."""
        idx = next(t for t in router_out if not t.is_floating_point())
        self.loads[i] += torch.bincount(idx.flatten(), minlength=self.loads[i].numel()).float()

    def step(self, _step: int) -> None:
        with torch.no_grad():
            for r, load in zip(self.routers, self.loads):
                r.e_score_correction_bias += self.gamma * torch.sign(load.mean() - load)
                load.zero_()

    def share(self) -> list[list[float]]:
        """Per MoE layer, each expert's share of routed tokens in one held-out pass."""
        return [(load / load.sum().clamp(min=1)).tolist() for load in self.loads]


def load_back(path: Path) -> torch.nn.Module:
    """from_pretrained, strictly: the files must hold exactly the model's weights."""
    model, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise DiagError("zoo checkpoint does not load back cleanly", file=str(path / "model.safetensors"),
                        expected="no missing, unexpected or mismatched keys", found=str(bad)[:400])
    return model.eval()


def attention(model, name: str) -> None:
    """Switch a transformers model's attention implementation ("sdpa" | "eager") in place."""
    if name not in ("sdpa", "eager"):
        raise DiagError("unknown training attention", field="train_attention", expected="'sdpa' or 'eager'",
                        found=repr(name))
    model.set_attn_implementation(name)


def build_target(recipe: TargetRecipe, out: Path, deps: dict[str, Path]) -> dict:
    corpus_dir = deps[recipe.corpus]
    streams, tok = load_streams(corpus_dir), tk.load_tokenizer(corpus_dir)
    ids = tk.special_ids(tok)
    b = recipe.budget
    with deterministic(b.seed) as gen:
        model = new_model(recipe, tok.get_vocab_size(), ids)
        balancer = ExpertBalancer(model) if isinstance(recipe.shape, DeepseekShape) else None
        attention(model, recipe.train_attention)
        losses = train_lm(model, streams["train"], b, gen, desc=f"train {type(recipe.shape).__name__}",
                          after_step=balancer.step if balancer else None)
        attention(model, "sdpa")                       # as every reader loads it
        ppl_trained = perplexity(model, streams["heldout"])
        save_target(model, out, recipe.save_dtype, [ids[tk.EOS], ids[tk.END]])
        tk.copy_tokenizer(corpus_dir, out)
        loaded = load_back(out)
        ppl_saved = perplexity(loaded, streams["heldout"])
        conts = greedy_continuations(loaded, tok, python_prompts(load_heldout_docs(corpus_dir)))
    meta = {"heldout_perplexity": ppl_saved, "heldout_perplexity_float32": ppl_trained,
            "unigram_perplexity": unigram_perplexity(streams, tok.get_vocab_size()),
            "train_loss_first": losses[0], "train_loss_last": sum(losses[-10:]) / len(losses[-10:]),
            "tokens_seen": b.steps * b.batch * b.seq_len, "continuations": summarize(conts),
            "samples": [c.to_dict() for c in conts[:4]]}
    if balancer is not None:
        meta["expert_share_last_pass"] = balancer.share()
    return meta
