"""The bench pair's trained drafter: a Kimi-shaped drafter that accepts like a trained one on
the bench's own prompts, so the decode loop's trees and deep acceptance are exercised.

How it is made. The target (random weights) continues each bench prompt greedily for
new_tokens + unroll_steps ids; the drafter (kimi_shaped.drafter_config, seeded init) is trained
on those sequences exactly as the zoo trains its drafters (zoo.build_drafters.unroll_loss: the
target's argmax at the next unroll_steps indices, teacher-forced inputs deeper), its features
drawn in turn from each of the bench's layouts, its hot vocabulary the ids the target predicts
most there. A random-weight target's next token is a pseudo-random function of the whole
context (SMALL widths, 4 layers: its greedy continuations are not degenerate, 45-48 distinct
ids in 48), so nothing generalises: held-out prompts accept ~1.0 (a drafter trained the same
way on 256 other prompts: 1.003 chain-3). The pair therefore accepts on the prompts it was
trained on, which are the prompts the bench decodes, and `made` says so.

Accept lengths are measured with the decode loop itself (chain-3, every layout, every prompt):
greedy, and at T=1.0 top-p 0.95. A random target's T=1 distribution is close to uniform (SMALL
widths, 4 layers: logits std 1.0, top probability 0.006 on average over 4096 ids), so nothing is
accepted there whatever the drafter: 16 tokens in 15 rounds, 1.067, the random drafter's figure.
CPU bench config (32 prompts x 16 new ids, 3 layouts, 200 steps): greedy chain-3 4.0 on every
layout (random drafter 1.067), build ~2 min on 2 idle cores, 8 min on a loaded machine; cached.

Cached under $DIAG_CACHE_DIR/bench-pairs/<key>: the key digests the target's config and the
first MiB of every shard (the weights a seed drew), the prompts, new_tokens and the recipe.
This module knows training and the decode loop; nothing about the bench's sections.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from diag.layouts import layout as parse_layout

PAIR_VERSION = 1
DIGEST_BYTES = 1 << 20
META = "bench_pair.json"
TRAINING_WORK_BYTES = 8 * 2 ** 30     # training_bytes' allowance beyond the parameters' state


@dataclass(frozen=True)
class PairRecipe:
    steps: int = 200          # AdamW steps (zoo.train.optimize: warmup, cosine decay)
    batch: int = 16           # sequences per step
    lr: float = 3e-3
    unroll_steps: int = 3     # draft steps trained jointly
    seed: int = 0


def pair_key(target: Path, prompts: list[list[int]], new_tokens: int, layouts: list[str],
             drafter_widths: dict, recipe: PairRecipe) -> str:
    h = hashlib.sha256(json.dumps([PAIR_VERSION, prompts, new_tokens, layouts, drafter_widths, asdict(recipe)],
                                  sort_keys=True).encode())
    h.update((target / "config.json").read_bytes())
    for f in sorted(target.glob("*.safetensors")):
        with open(f, "rb") as fh:
            h.update(f"{f.name}:{f.stat().st_size}".encode() + fh.read(DIGEST_BYTES))
    return h.hexdigest()[:24]


def pair_path(target: Path, prompts: list[list[int]], new_tokens: int, layouts: list[str], drafter_widths: dict,
              recipe: PairRecipe = PairRecipe(), cache: Path | None = None) -> Path:
    """Where the pair's drafter is cached (it is built there when <path>/bench_pair.json is missing)."""
    from diag.checkpoint.identity import cache_root

    root = Path(cache) if cache is not None else cache_root() / "bench-pairs"
    return root / pair_key(target, prompts, new_tokens, layouts, drafter_widths, recipe)


def training_bytes(drafter_widths: dict) -> int:
    """Device memory the pair's training needs beside its target: every trainable parameter in
    float32 with its gradient and AdamW's two moments (16 B), its bf16 copy under autocast (2 B),
    and TRAINING_WORK_BYTES for the activations and the capture's logits. Kimi's widths: 1.19 B
    parameters -> 21.4 GB + 8 GiB = 30.0 GB (an H100 holding the 6-layer bench target, 55 GB, has
    ~25 GB left: the section's OOM of the twentieth and twenty-first stops)."""
    from diag.drafter.model import Eagle3Drafter
    from diag.zoo.kimi_shaped import drafter_config

    with torch.device("meta"):
        d = Eagle3Drafter(drafter_config(drafter_widths))
    params = sum(p.numel() for p in d.parameters() if p.requires_grad)
    return params * 18 + TRAINING_WORK_BYTES


def trained_pair_drafter(target: Path, model, prompts: list[list[int]], new_tokens: int, layouts: list[str],
                         drafter_widths: dict, *, recipe: PairRecipe = PairRecipe(),
                         cache: Path | None = None) -> tuple[Path, dict]:
    """The drafter's directory (cached) and its bench_pair.json: how it was made, what it accepts.
    model: the target as loaded (float32 on the CPU here); layouts: the bench's, layouts[0] the
    one written as trained_layout; drafter_widths: kimi_shaped.drafter_config's overrides."""
    out = pair_path(target, prompts, new_tokens, layouts, drafter_widths, recipe, cache)
    root = out.parent
    if (out / META).is_file():
        return out, _summarised(json.loads((out / META).read_text()))
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        meta = _build(tmp, model, prompts, new_tokens, layouts, drafter_widths, recipe)
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
        if not out.exists():
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out, _summarised(json.loads((out / META).read_text()))


def _summarised(meta: dict) -> dict:
    """meta plus the worst layout's greedy and T=1.0 accept lengths, flat (one line in summary.md)."""
    sampled = next(k for k in meta if k.startswith("t1.0"))
    return {**meta, "greedy_accept_length_min": min(meta["greedy"].values()),
            "t1_accept_length_min": min(meta[sampled].values())}


def _build(out: Path, model, prompts, new_tokens, layouts, drafter_widths, recipe: PairRecipe) -> dict:
    from diag.drafter.checkpoint import load_drafter, save_drafter
    from diag.drafter.model import Eagle3Drafter
    from diag.zoo.build_drafters import capture, frozen_embedding, greedy_sequences, hot_vocab, unroll_loss, views
    from diag.zoo.kimi_shaped import drafter_config
    from diag.zoo.recipes import TrainBudget
    from diag.zoo.train import deterministic, optimize

    steps = recipe.unroll_steps
    lays = [parse_layout(x) for x in layouts]
    cfg = drafter_config(drafter_widths)
    dev = model.get_input_embeddings().weight.device
    ids = torch.tensor(prompts)                                                   # [P, p]
    with deterministic(recipe.seed) as gen:
        seqs = greedy_sequences(model, ids.to(dev), new_tokens + steps).cpu()     # [P, p + new + steps]
        pools = []
        for lay in lays:
            aux, argmax, _ = capture(model, seqs, lay.points)
            argmax = argmax.cpu()
            pools.append([t.to(dev) for t in views(seqs, aux, argmax, steps)])
        generated = argmax[:, ids.shape[1] - 1:]
        hot = hot_vocab(torch.bincount(generated.flatten(), minlength=cfg.vocab_size), cfg.draft_vocab_size)
        d = Eagle3Drafter(cfg)
        d.set_vocab(hot)
        d = d.to(dev)
        embed = frozen_embedding(model)
        budget = TrainBudget(steps=recipe.steps, batch=recipe.batch, seq_len=seqs.shape[1], lr=recipe.lr,
                             seed=recipe.seed)

        def loss(step: int) -> torch.Tensor:
            pick = torch.randint(0, seqs.shape[0], (recipe.batch,), generator=gen).to(dev)
            with _cuda_bf16(dev):
                return unroll_loss(d, embed, [t[pick] for t in pools[step % len(pools)]], steps)
        d.train()
        losses = optimize(d.parameters(), budget, loss, desc="bench pair drafter", foreach=False)
        d.eval()
    distinct = [len(set(r)) for r in seqs[:, ids.shape[1]:].tolist()]
    save_drafter(d.cpu(), out, aux_layer_ids=None, trained_layout=layouts[0])
    del d, embed, pools
    drafter, _ = load_drafter(out, dtype=model.get_output_embeddings().weight.dtype)
    drafter = drafter.to(dev)
    return {"made": f"trained on the target's greedy continuations of the bench's {len(prompts)} prompts "
                    f"({new_tokens}+{steps} new ids each), {recipe.steps} steps, layouts {layouts}; "
                    "accepts on these prompts only (a random target generalises nothing)",
            "recipe": asdict(recipe), "prompts": len(prompts), "new_tokens": new_tokens,
            "train_loss_first": losses[0], "train_loss_last": sum(losses[-10:]) / len(losses[-10:]),
            "continuation_distinct_ids_min": min(distinct), "continuation_ids": seqs.shape[1] - ids.shape[1],
            **accept_lengths(model, drafter, prompts, new_tokens, layouts)}


def _cuda_bf16(dev: torch.device):
    """On CUDA the forward runs under bf16 autocast (a Kimi-width drafter's float32 step costs ~1 s
    there; weights, gradients and the optimiser stay float32); elsewhere as zoo.train computes."""
    from contextlib import nullcontext

    return torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else nullcontext()


@torch.no_grad()
def accept_lengths(model, drafter, prompts, new_tokens: int, layouts: list[str], tree: str = "chain-3") -> dict:
    """Chain-3 accept length (emitted tokens / rounds) of the decode loop over every prompt, per
    layout, greedy and at T=1.0 top-p 0.95 (seed 0): {"greedy": {layout: x}, "t1.0-p0.95-k-1": {...}}."""
    from diag.bench.sampled import bench_loop
    from diag.engines.decoding import GREEDY, sampled
    from diag.trees import tree_shape

    shape = tree_shape(tree)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    res = {"tree": tree}
    for dec in (GREEDY, sampled(1.0, 0.95)):
        loop, lanes, rows = bench_loop(model, drafter, embed, head, layouts, shape, len(prompts), decoding=dec)
        out = loop.run(prompts, rows, new_tokens)
        res[dec.name] = {}
        for li, name in enumerate(layouts):
            mine = [o for o in out if o.lane is lanes[li]]
            emitted = sum(len(o.ids) - len(prompts[o.prompt]) for o in mine)
            res[dec.name][name] = emitted / max(1, sum(len(o.accepted) for o in mine))
    return res
