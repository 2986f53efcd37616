"""Builder for the zoo's EAGLE-3 drafters (the model is diag.drafter.model's, not ours).

Data. Each training sequence is L = P + seq_len + steps ids, P = recipe.prompt_tokens: either a corpus
window (teacher-forced text, where the target's argmax often differs from the next
id, so only the target's hidden state tells the drafter what the target will say),
or a corpus prompt of P ids continued greedily by the target as loaded
(deepseek-tiny computes in bf16): the text replay drafts on. `corpus_fraction`
splits the pool. The prompt-side entries (recipes_prompt_side.PromptDrafterRecipe) train on greedy
continuations of their own prompts only (prompted_sequences: short raw prompts, or corpus text
inside the chat template with thinking on / off). One teacher-forced capture pass then gives the layout's points and
the target's argmax at every index.

Views of one sequence x (length L) for drafter index j in [0, T), T = L - steps:
    aux[j]        = cat(layout points)[j]              [T, 3H]
    tokens[j]     = x[j+1]                             input of step 1
    teacher[j, s-1] = x[j+1+s], s = 1..steps-1         input of step s+1
    label_s[j]    = argmax[j+s]  (as a draft id; -1 when not hot: ignored)
    e.g. steps 3, j = 10: tokens x11; teacher x12, x13; labels argmax 11, 12, 13

Loss: cross entropy of each step's logits against label_s, or (recipe.loss "distribution")
against the target's softmax at index j+s restricted to the hot ids and renormalised
(target_distribution), at the indices whose label is hot: SpecForge's objective (at
recipe.temperature 1; a lower one divides the target's logits first).

Hot vocabulary: the `draft_vocab_size` most frequent ids of the train stream
(ties -> lower id), ascending; d2t/t2d come from Eagle3Drafter.set_vocab.

Layer ids (config.json eagle_config.eagle_aux_hidden_state_layer_ids) are written
in the SpecForge convention, id i = output of decoder layer i = L{i+1}:
L1+L3+L5 -> [0, 2, 4]; embed has no layer and is written -1 (embed+L2+L4 ->
[-1, 1, 3]). SpecForge's HF backend rejects -1, and SGLang's Llama capture (source read
at commit 00239548) would take `hidden_states + residual` before layer 0, where residual
is None: such a layout cannot be served by id there (0.5.22+ captures each layer's input, id + 1,
so -1 is the embedding and [-1, 1, 3] serves embed+L2+L4: diag.engines). `diag_trained_layout` is the
authoritative statement; config.json also says `diag_layer_id_convention: specforge`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from diag.checkpoint.identity import stat_key
from diag.target.capture import capture_pass, decoder_parts
from diag.drafter.mla import MlaShape
from diag.drafter.model import DrafterConfig, Eagle3Drafter
from diag.drafter.checkpoint import save_drafter
from diag.errors import DiagError
from diag.layouts import CapturePoint, Layout, layout as parse_layout
from diag.zoo.build_targets import load_back, load_streams
from diag.zoo.data import sample_windows, tile_windows, token_counts
from diag.zoo.recipes import DrafterRecipe
from diag.zoo.recipes_prompt_side import PromptDrafterRecipe
from diag.zoo.train import deterministic, optimize

CHUNK = 256          # sequences per generate / capture call (decode cost is per step, not per row)
DIST_ROWS = 16       # sequences per softmax of target_distribution: 16 x 259 x 1536 fp32 logits are
                     # 25 MB, under glibc's mmap threshold (allocator.py); one of 256 took 0.61 s, 16s 0.31
LAYER_ID_CONVENTION = "specforge"
CONTENT = "@@content@@"          # chat_wrapping's stand-in for one user turn's text


def hot_vocab(counts: torch.Tensor, size: int) -> torch.Tensor:
    """Ids of the `size` largest counts, ascending. counts [5, 9, 0, 9], size 2 -> [1, 3]."""
    order = torch.sort(counts, descending=True, stable=True).indices[:size]
    return order.sort().values


def specforge_ids(lay: Layout) -> list[int]:
    """L{i} -> i - 1 (embed = L0 -> -1). embed+L2+L4 -> [-1, 1, 3]."""
    return [p.index - 1 for p in lay.points]


# Model types whose greedy pools are generated with a preallocated (static) KV cache: the
# dynamic cache concatenates every layer's keys and values at every step, 72% of the time of
# llama-tiny's pool (192 x 99 new tokens: 10.9 s dynamic, 4.1 s static, the same ids). For
# deepseek-tiny (MoE) the static cache was slower (8.2 s against 9.3 s for 96 x 99), so it keeps
# the dynamic one.
STATIC_CACHE_MODELS = frozenset({"llama"})


# Greedy continuations already generated in this process, by (target identity, prompts, new
# tokens): the embed drafter and its control draw the same pool and held-out prompts from one
# target, so the second build reuses the first's continuations (4-5 s of each llama drafter
# build) instead of generating the same ids again. Greedy decoding draws nothing from the RNG.
_CONTINUATIONS: dict[tuple[str, str, int], torch.Tensor] = {}
_CONTINUATIONS_KEPT = 8


def target_identity(target_dir: Path) -> str | None:
    """A built zoo target's fingerprint (its zoo_meta.json) and its weights file's stat as the
    digest memo keys it (checkpoint.identity.stat_key: path, size, mtime, ctime, inode), which
    change whenever it is rebuilt; None for a directory without them (nothing is then
    remembered)."""
    meta, weights = target_dir / "zoo_meta.json", target_dir / "model.safetensors"
    if not (meta.is_file() and weights.is_file()):
        return None
    return json.dumps([json.loads(meta.read_text()).get("fingerprint"), stat_key(weights)], sort_keys=True)


@torch.no_grad()
def greedy_sequences(target, prompts: torch.Tensor, new_tokens: int, identity: str | None = None) -> torch.Tensor:
    """prompts [P, p] -> [P, p + new_tokens]: each prompt continued greedily (eos ignored).
    With the target's `identity` (target_identity), remembered for this process."""
    key = None if identity is None else \
        (identity, hashlib.sha256(prompts.numpy().tobytes() + str(tuple(prompts.shape)).encode()).hexdigest(),
         new_tokens)
    if key in _CONTINUATIONS:
        return _CONTINUATIONS[key].clone()
    static = {"cache_implementation": "static"} if target.config.model_type in STATIC_CACHE_MODELS else {}
    out = []
    for chunk in prompts.split(CHUNK):
        out.append(target.generate(input_ids=chunk, attention_mask=torch.ones_like(chunk), do_sample=False,
                                   max_new_tokens=new_tokens, min_new_tokens=new_tokens, **static))
    seqs = torch.cat(out)
    if key is not None:
        if len(_CONTINUATIONS) >= _CONTINUATIONS_KEPT:
            _CONTINUATIONS.pop(next(iter(_CONTINUATIONS)))
        _CONTINUATIONS[key] = seqs.clone()
    return seqs


def training_sequences(target, train: torch.Tensor, recipe: DrafterRecipe, gen: torch.Generator,
                       identity: str | None = None) -> torch.Tensor:
    """pool_sequences rows of prompt_tokens + seq_len + steps ids: the first round(P * corpus_fraction)
    are corpus windows (teacher-forced text: the target's argmax often differs from the next
    id, so the drafter must read the target's state), the rest greedy continuations.
    P 192, fraction 0.25 -> rows 0..47 corpus, 48..191 greedy."""
    prompt = recipe.prompt_tokens
    width = prompt + recipe.budget.seq_len + recipe.unroll_steps
    n_corpus = round(recipe.pool_sequences * recipe.corpus_fraction)
    corpus = sample_windows(train, n_corpus, width - 1, gen)                          # [Pc, width]
    prompts = sample_windows(train, recipe.pool_sequences - n_corpus, prompt - 1, gen)
    greedy = greedy_sequences(target, prompts, width - prompt, identity) if len(prompts) else corpus[:0]
    return torch.cat([corpus, greedy])


def features(target, seqs: torch.Tensor, lay: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """seqs [P, L] -> aux float32 [P, L, k*H] (points in layout order), argmax [P, L]."""
    aux, argmax, _ = capture(target, seqs, lay.points)
    return aux, argmax


def target_distribution(target, seqs: torch.Tensor, hot: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """seqs [P, L] -> the target's next-token distribution over the hot vocabulary [P, L, Vd],
    bf16: the softmax of its logits / temperature at the hot ids, renormalised there
    (SpecForge's target_p at temperature 1). Logits [2, 0, 1] at ids 0..2, hot [0, 2] ->
    softmax([2, 1]) = [0.73, 0.27]; at temperature 0.5, softmax([4, 2]) = [0.88, 0.12]."""
    return capture(target, seqs, (), hot, temperature)[2]


@torch.no_grad()
def capture(target, seqs: torch.Tensor, points, hot: torch.Tensor | None = None, temperature: float = 1.0):
    """One capture pass over seqs [P, L], CHUNK rows at a time: the points' states concatenated
    (float32 [P, L, k*H]; None without points), the argmax [P, L] and, with `hot`, the
    distribution of target_distribution (else None)."""
    weight = None if hot is None else decoder_parts(target)[4].weight.detach().float()[hot]     # [Vd, H]
    wanted = tuple(points) + (() if hot is None else (CapturePoint("final"),))
    auxs, argmaxes, dists = [], [], []
    for chunk in seqs.split(CHUNK):
        cap = capture_pass(target, chunk, torch.ones_like(chunk), wanted)
        if points:
            auxs.append(torch.cat([cap.states[p.name].float() for p in points], dim=-1))
        argmaxes.append(cap.argmax)
        if weight is not None:          # DIST_ROWS sequences at a time: the same bits, half the time
            dists += [torch.softmax(f @ weight.T / temperature, dim=-1).to(torch.bfloat16)
                      for f in cap.states["final"].float().split(DIST_ROWS)]
    return (torch.cat(auxs) if auxs else None), torch.cat(argmaxes), (torch.cat(dists) if dists else None)


def views(seqs: torch.Tensor, aux: torch.Tensor, argmax: torch.Tensor, steps: int):
    """The drafter's inputs and labels (module docstring): aux [P, T, k*H], tokens [P, T],
    teacher [P, T, steps-1], labels [P, T, steps] (target ids), T = L - steps."""
    T = seqs.shape[1] - steps
    teacher = torch.stack([seqs[:, 1 + s:T + 1 + s] for s in range(1, steps)], dim=-1) if steps > 1 \
        else seqs.new_zeros(seqs.shape[0], T, 0)
    labels = torch.stack([argmax[:, s:T + s] for s in range(1, steps + 1)], dim=-1)
    return aux[:, :T], seqs[:, 1:T + 1], teacher, labels


def _mla_shape(c) -> MlaShape:
    """The target's own MLA widths (the Kimi MLA drafters copy K2's: q_lora 1536, kv_lora 512, ...)."""
    return MlaShape(c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim)


def new_drafter(target, recipe: DrafterRecipe, hot: torch.Tensor, num_aux: int) -> Eagle3Drafter:
    c = target.config
    heads = c.num_attention_heads
    mla = recipe.attention == "mla"
    cfg = DrafterConfig(hidden_size=c.hidden_size, num_attention_heads=heads, num_key_value_heads=heads,
                        head_dim=None if mla else c.hidden_size // heads, intermediate_size=3 * c.hidden_size,
                        vocab_size=c.vocab_size, draft_vocab_size=recipe.draft_vocab_size,
                        target_hidden_size=c.hidden_size, num_aux=num_aux, rms_norm_eps=1e-6,
                        rope_theta=10000.0, max_position_embeddings=2048, attention=recipe.attention,
                        mla=_mla_shape(c) if mla else None, fc_norm=recipe.fc_norm,
                        norm_output=recipe.norm_output)
    d = Eagle3Drafter(cfg)
    d.set_vocab(hot)
    return d


def frozen_embedding(target) -> torch.nn.Embedding:
    """The target's token table as a float32, frozen copy (the drafter computes in float32)."""
    return torch.nn.Embedding.from_pretrained(target.get_input_embeddings().weight.detach().float(), freeze=True)


def unroll_loss(d: Eagle3Drafter, embed, batch, steps: int, dist: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over steps of cross entropy against the target's argmax (draft ids; -1 ignored),
    or with dist [B, L, Vd] (target_distribution) against the target's distribution at the
    index step s predicts, j + s, over the indices whose argmax is hot (SpecForge's
    position mask)."""
    aux, tokens, teacher, labels = batch
    outs = d.unroll(embed, aux, tokens, steps, teacher_tokens=teacher)      # steps x [B, T, Vd]
    draft_labels = d.to_draft_ids(labels)                                   # [B, T, steps]
    losses = []
    for s, o in enumerate(outs):                                            # step s + 1: index j + s + 1
        if dist is None:
            losses.append(F.cross_entropy(o.flatten(0, 1).float(), draft_labels[..., s].flatten(), ignore_index=-1))
        else:
            p = dist[:, s + 1:s + 1 + o.shape[1]].float()                   # [B, T, Vd]
            ce = -(p * torch.log_softmax(o.float(), dim=-1)).sum(-1)         # [B, T]
            losses.append(ce[draft_labels[..., s] >= 0].mean())
    return torch.stack(losses).mean()


@torch.no_grad()
def chain_acceptance(d: Eagle3Drafter, embed, aux, seqs, argmax, steps: int, start: int) -> dict:
    """Greedy chain drafting (own argmax fed deeper) at every index j >= start;
    a_j = leading steps whose draft equals the target's argmax[j+s].
    Returns acceptance_at_depth[i] = P(a >= i) and accept_length = 1 + mean(a)."""
    a_aux, tokens, _, labels = views(seqs, aux, argmax, steps)
    outs = d.unroll(embed, a_aux, tokens, steps)
    hits = torch.stack([d.to_target_ids(o.argmax(-1)) for o in outs], -1) == labels   # [P, T, steps]
    accepted = hits[:, start:].int().cumprod(-1).sum(-1).float()                      # [P, T-start]
    return {"accept_length": 1 + float(accepted.mean()),
            "acceptance_at_depth": [float((accepted >= i).float().mean()) for i in range(1, steps + 1)]}


@torch.no_grad()
def depth1_teacher_forced(d: Eagle3Drafter, embed, aux, argmax, seqs) -> dict:
    """On held-out corpus text: step-1 draft vs the target's argmax at j+1, and the
    rate of always guessing the target's most frequent prediction (the chance baseline)."""
    a_aux, tokens, _, labels = views(seqs, aux, argmax, 1)
    pred = d.to_target_ids(d.unroll(embed, a_aux, tokens, 1)[0].argmax(-1))
    most = torch.bincount(labels.flatten()).max() / labels.numel()
    return {"accept_depth1": float((pred == labels[..., 0]).float().mean()),
            "baseline_most_frequent": float(most)}


def train_drafter(target, recipe: DrafterRecipe, lay: Layout, hot: torch.Tensor, seqs: torch.Tensor,
                  gen: torch.Generator, desc: str) -> tuple[Eagle3Drafter, torch.nn.Embedding, list[float]]:
    """A new drafter trained on seqs [P, L] under `lay` (inside `deterministic`: its init draws
    from torch's seeded RNG, each step's batch of recipe.budget.batch rows from gen). Returns
    the drafter (eval mode), the frozen embedding it was trained with, and the losses."""
    if recipe.loss not in ("argmax", "distribution"):
        raise DiagError("unknown drafter loss", field="loss", expected="'argmax' or 'distribution'",
                        found=repr(recipe.loss))
    b, steps = recipe.budget, recipe.unroll_steps
    aux, argmax, dist = capture(target, seqs, lay.points, hot if recipe.loss == "distribution" else None,
                                recipe.temperature)                 # one pass: states, argmax, distribution
    pool = views(seqs, aux, argmax, steps)
    embed = frozen_embedding(target)
    d = new_drafter(target, recipe, hot, len(lay))

    def loss(_step: int) -> torch.Tensor:
        pick = torch.randint(0, seqs.shape[0], (b.batch,), generator=gen)
        return unroll_loss(d, embed, [t[pick] for t in pool], steps, None if dist is None else dist[pick])

    d.train()
    losses = optimize(d.parameters(), b, loss, desc=desc)
    d.eval()
    return d, embed, losses


def save_zoo_drafter(d: Eagle3Drafter, out: Path, lay: Layout, target_dir: Path) -> None:
    """The drafter's files, ids in the SpecForge convention, the trained layout stated."""
    save_drafter(d, out, aux_layer_ids=specforge_ids(lay), trained_layout=str(lay),
                 extra_config={"diag_layer_id_convention": LAYER_ID_CONVENTION, "diag_target": target_dir.name})


def loss_summary(losses: list[float]) -> dict:
    return {"train_loss_first": losses[0], "train_loss_last": sum(losses[-10:]) / len(losses[-10:])}


def build_drafter(recipe: DrafterRecipe | PromptDrafterRecipe, out: Path, deps: dict[str, Path], corpus: str) -> dict:
    """deps: every entry this one needs, transitively (target and its corpus). A DrafterRecipe
    trains on the mixed pool (training_sequences) and is checked by `evaluate`; a
    PromptDrafterRecipe (the prompt-side entries) on its prompts (prompted_sequences) and is
    checked on held-out prompts of the same kind."""
    r = recipe if isinstance(recipe, DrafterRecipe) else recipe.drafter
    target_dir = deps[r.target]
    target, streams = load_back(target_dir), load_streams(deps[corpus])
    lay = parse_layout(r.layout).check_against(target.config.num_hidden_layers)
    counts = token_counts(streams["train"], target.config.vocab_size)
    with deterministic(r.budget.seed) as gen:
        hot = hot_vocab(counts, r.draft_vocab_size)
        if isinstance(recipe, DrafterRecipe):
            identity = target_identity(target_dir)
            seqs = training_sequences(target, streams["train"], recipe, gen, identity)  # [P, prompt + seq_len + steps]
            d, embed, losses = train_drafter(target, r, lay, hot, seqs, gen, desc=f"drafter {r.layout}")
            meta = evaluate(d, target, embed, streams["heldout"], lay, recipe, identity)
        else:
            seqs, start = prompted_sequences(target, target_dir, streams["train"], recipe, r.pool_sequences, gen)
            d, embed, losses = train_drafter(target, r, lay, hot, seqs, gen, desc=f"drafter {r.layout} ({out.name})")
            held, _ = prompted_sequences(target, target_dir, streams["heldout"], recipe, r.eval_sequences, gen)
            aux, argmax = features(target, held, lay)
            meta = {"positions": seqs.shape[1],
                    "greedy_chain": chain_acceptance(d, embed, aux, held, argmax, r.unroll_steps, start - 1)}
    save_zoo_drafter(d, out, lay, target_dir)
    summary = {**loss_summary(losses), "layout": str(lay)}
    if isinstance(recipe, PromptDrafterRecipe):
        return {**summary, **meta}
    return {**meta, **summary, "eagle_aux_hidden_state_layer_ids": specforge_ids(lay),
            "hot_vocab_coverage": float(counts[hot].sum() / streams["train"].numel())}


def chat_wrapping(target_dir: Path, thinking: bool) -> tuple[list[int], list[int]]:
    """Token ids the target's chat template puts before and after one user turn's content,
    thinking switch set:
        before = <|bos|><|system|>\\nYou are a tiny model.<|end|>\\n<|user|>\\n
        after  = <|end|>\\n<|assistant|>\\n<think></think>        (thinking off)"""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    text = tok.apply_chat_template([{"role": "user", "content": CONTENT}], add_generation_prompt=True,
                                   tokenize=False, thinking=thinking)
    before, after = text.split(CONTENT)
    return [tok(t, add_special_tokens=False)["input_ids"] for t in (before, after)]


def prompted_sequences(target, target_dir: Path, stream: torch.Tensor, recipe: PromptDrafterRecipe, n: int,
                       gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """n prompts, each continued greedily by the target for seq_len + steps tokens, and the
    prompts' length p. A prompt is drafter.prompt_tokens raw corpus ids (the short-context drafter:
    8 + 16 + 3 = 27 positions, against the mixed pool's 32 + 96 + 3), or with chat_thinking set
    a corpus window of prompt_tokens - 1 ids inside the chat wrapping (p = len(before) +
    prompt_tokens - 1 + len(after)): the drafter learns the text one side of the thinking
    switch makes and never sees the other side's."""
    r = recipe.drafter
    if recipe.chat_thinking is None:
        start = sample_windows(stream, n, r.prompt_tokens - 1, gen)                      # [n, PROMPT]
    else:
        before, after = chat_wrapping(target_dir, recipe.chat_thinking)
        windows = sample_windows(stream, n, r.prompt_tokens - 2, gen)                    # [n, PROMPT - 1]
        start = torch.cat([torch.tensor([before] * n), windows, torch.tensor([after] * n)], dim=1)
    return greedy_sequences(target, start, r.budget.seq_len + r.unroll_steps), start.shape[1]


def evaluate(d, target, embed, heldout: torch.Tensor, lay: Layout, recipe: DrafterRecipe,
             identity: str | None = None) -> dict:
    """Held-out checks: depth 1 on corpus text, then chain acceptance on the target's greedy
    continuations of held-out prompts, under the trained layout and under the layout
    shifted one layer deeper (embed+L2+L4 -> L1+L3+L5), which should score lower."""
    steps = recipe.unroll_steps
    prompt = recipe.prompt_tokens
    width = prompt + recipe.budget.seq_len + steps                          # as in training
    text = tile_windows(heldout, width - 1, recipe.eval_sequences)         # [E, width]
    meta = depth1_teacher_forced(d, embed, *features(target, text, lay), text)
    seqs = greedy_sequences(target, text[:, :prompt], width - prompt, identity)
    start = prompt - 1                      # first index whose next token was generated
    aux, argmax = features(target, seqs, lay)
    meta["greedy_chain"] = chain_acceptance(d, embed, aux, seqs, argmax, steps, start)
    shifted = lay.shifted(1, target.config.num_hidden_layers)
    if shifted is not None:
        aux, argmax = features(target, seqs, shifted)
        meta["greedy_chain_shifted_layout"] = {"layout": str(shifted),
                                               **chain_acceptance(d, embed, aux, seqs, argmax, steps, start)}
    return meta
