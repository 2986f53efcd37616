"""Replay: the drafter proposes at every position of every continuation; the target verifies.

For each variant (layout, serving mode, tree shape, regime of the features, regime of the
verifying tokens) and each sequence, a round is rooted at every index j of the continuation
with a full window: j from prompt_len - 1 to T - 2 - S_max, where S_max is the deepest tree
of the run, so every variant is scored on the same rounds. Worked example: prompt_len 5,
T 12, S_max 3 -> roots j = 4..7 (root token t_{j+1} = t_5..t_8; depth 3 guesses t_8..t_11).
That is the "window" accounting; an engine that verifies until the request ends ("vllm",
round_accounting.py) scores roots up to T - 3 against the target's lookahead past T.

The verifying tokens are the target's argmax along the sequence (= the greedy continuation
when the target generated it). Chains of every depth share one draft; trees that share
(num_steps, topk) share one beam. Whose embedding and lm_head each serving mode drafts with,
and how many of its logits count, is the engine's rule (EngineRules.draft_tables), applied
in `draft_head`. This module knows tensors and dataclasses; it knows nothing about TOML,
files or reports.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from diag.drafter.model import Eagle3Drafter
from diag.drafter.drafting import DraftHead, DraftInputs, draft_beam, draft_chain, prefix
from diag.engines import engine, rules
from diag.engines.common import DraftTables
from diag.errors import DiagError
from diag.layouts import Layout
from diag.target.passes import TargetPass, budget_batches, pad_right
from diag.target.tables import RowTable
from diag.drafter.tree_build import finalize
from diag.trees import TreeShape
from diag.replay.evaluation import LEGACY_AXES, Axes
from diag.replay.round_accounting import ACCOUNTINGS, RoundAccounting
from diag.replay.verify import accepted_chain, accepted_tree, target_next_windows

WINDOW = ACCOUNTINGS["window"]


@dataclass(frozen=True)
class Variant:
    layout: str
    mode: str                 # "eagle3" | "eagle"
    tree: TreeShape
    regime: str = "as-loaded"          # regime of the drafter's input features
    tokens_regime: str = "as-loaded"   # regime whose argmax verifies
    rendering: str = LEGACY_AXES["rendering"]   # how the prompts became token ids
    decoding: str = LEGACY_AXES["decoding"]     # diag.engines.decoding name; replay itself is greedy

    @property
    def axes(self) -> Axes:
        return Axes(self.layout, self.mode, self.tree.name, self.regime, self.tokens_regime,
                    rendering=self.rendering, decoding=self.decoding)

    @property
    def key(self) -> str:
        return self.axes.key


@dataclass
class VariantResult:
    variant: Variant
    accepted: list[torch.Tensor]       # per sequence: [R_i] accepted draft tokens per round
    roots: list[torch.Tensor]          # per sequence: [R_i] root index j of each round
    prompt_ids: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)


def eval_roots(prompt_len: int, length: int, max_steps: int) -> range:
    """Root indices with a full window of max_steps guesses (see the module docstring)."""
    return range(prompt_len - 1, length - 1 - max_steps)


def seq_roots(seq, max_steps: int, accounting: RoundAccounting = WINDOW) -> range:
    """The roots the engine's accounting scores in one Sequence, never past what its ids can
    verify (a recorded continuation has no lookahead: its last rounds fall back to full windows).
    Example, vllm: prompt 5, end 11, ids 14 (lookahead 3), S 3 -> 4..8; window -> 4..6."""
    r = accounting.roots(seq.prompt_len, seq.emitted, max_steps)
    return range(r.start, max(r.start, min(r.stop, len(seq.ids) - 1 - max_steps)))


def layout_features(tp: TargetPass, lay: Layout, mode: str, i: int) -> torch.Tensor:
    """[T, W]: cat of the layout's points (EAGLE mode: the final-normed last state)."""
    if mode == "eagle":
        return tp.states["final"][i]
    return torch.cat([tp.states[p.name][i] for p in lay.points], dim=-1)


def padded_features(tp: TargetPass, lay: Layout, mode: str, idx: list[int], dev, dtype):
    """pad_right of layout_features for sequences idx, built where the drafter runs: each
    point's [T_i, H] states copied into its columns of one zeroed [B, T_max, W] tensor on
    `dev` in `dtype` (the same values as cat, pad, then convert; no [B, T_max, W] copy on the
    CPU first). Returns (aux, valid [B, T_max] bool on the CPU, as pad_right's)."""
    names = ["final"] if mode == "eagle" else [p.name for p in lay.points]
    lengths = [tp.states[names[0]][i].shape[0] for i in idx]
    widths = [tp.states[n][idx[0]].shape[-1] for n in names]
    aux = torch.zeros(len(idx), max(lengths), sum(widths), device=dev, dtype=dtype)
    valid = torch.zeros(len(idx), max(lengths), dtype=torch.bool)
    for b, (i, n) in enumerate(zip(idx, lengths)):
        col = 0
        for name, w in zip(names, widths):
            aux[b, :n, col:col + w].copy_(tp.states[name][i])
            col += w
        valid[b, :n] = True
    return aux, valid


def _chains(drafter, dh, x, pre, shapes, windows, rows):
    draft = draft_chain(drafter, dh, x, max(s.num_steps for s in shapes), pre)  # [B, Q, S]
    picked = draft[rows[0], rows[1]]                                            # [R, S]
    return {s: accepted_chain(picked[:, :s.num_steps], windows[:, :s.num_steps]) for s in shapes}


def _trees(drafter, dh, x, pre, shapes, windows, rows):
    S, K = shapes[0].num_steps, shapes[0].topk
    history = draft_beam(drafter, dh, x, S, K, pre)
    flat = rows[0] * x.index.shape[1] + rows[1]                                 # [R]
    picked = [_select(b, flat) for b in history]
    out = {}
    for s in shapes:
        tree = finalize(picked, s.num_draft_tokens)
        out[s] = accepted_tree(tree, windows[:, :S])
    return out


def _select(beam, flat):
    from dataclasses import replace
    return replace(beam, **{f: getattr(beam, f)[flat] for f in
                            ("tokens", "scores", "source_row", "node", "cand_tokens", "cand_scores",
                             "cand_parent")})


def default_tables(drafter: Eagle3Drafter, mode: str) -> DraftTables:
    """The default engine's tables (EngineRules.draft_tables) for a drafter known only by its
    loaded config (draft_vocab_size present; a config without it should pass its own tables,
    read off its config.json by the engine the case serves)."""
    c = drafter.cfg
    keys = {"hidden_size": c.hidden_size, "target_hidden_size": c.target_hidden_size,
            "draft_vocab_size": c.draft_vocab_size, "vocab_size": c.vocab_size}
    return rules().draft_tables(keys, mode, release=engine())


def draft_head(drafter: Eagle3Drafter, embed: nn.Module, target_head: nn.Module, t: DraftTables,
               dev, dtype) -> DraftHead:
    """The embedding and head a serving mode drafts with. Example (EAGLE, draft_vocab_size
    32000 of 163840): the target's embedding, the target's lm_head with logits [..., :32000]."""
    if t.embed == "drafter":
        if drafter.embed_tokens is None:
            raise DiagError("the server keeps the drafter's own embedding table, which the "
                            "checkpoint lacks", field="embed_tokens.weight",
                            expected="embed_tokens.weight in the drafter checkpoint", found="missing",
                            hint=t.why)
        emb = drafter.embed_tokens
    else:
        emb = _on(embed, dev, dtype)
    if t.lm_head == "drafter":
        return DraftHead(emb, None)
    head = _on(target_head, dev, dtype)
    if t.vocab_limit is None:
        return DraftHead(emb, head)
    limit = t.vocab_limit
    return DraftHead(emb, lambda x: head(x)[..., :limit])


@torch.no_grad()
def replay(drafter: Eagle3Drafter, embed: nn.Module, target_head: nn.Module,
           passes: dict[str, TargetPass], variants: list[Variant], layouts: dict[str, Layout], *,
           token_budget: int = 16384, progress: bool = True,
           tables: dict[str, DraftTables] | None = None,
           accounting: RoundAccounting = WINDOW, max_steps: int | None = None) -> list[VariantResult]:
    """Run every variant. passes: regime -> TargetPass over the same sequences; tables: the
    engine's DraftTables per mode ("eagle3", "eagle"), default from the drafter's config;
    accounting: which rounds of each request the engine counts (round_accounting.py);
    max_steps: the deepest tree of the whole run, which sets the rounds (default: of `variants`;
    a caller replaying only some of a run's variants passes the run's)."""
    max_steps = max_steps or max(v.tree.num_steps for v in variants)
    groups = defaultdict(list)          # (regime, layout, mode) -> variants; one draft per group
    for v in variants:
        groups[(v.regime, v.layout, v.mode)].append(v)
    n = len(next(iter(passes.values())).sequences)
    results = {v: VariantResult(v, [None] * n, [None] * n) for v in variants}
    dtype = next(drafter.parameters()).dtype
    dev = next(drafter.parameters()).device
    embed = embedding_near(embed, dev)
    bar = tqdm(total=len(groups), desc="drafter", disable=not progress, leave=False)
    for (regime, lay_name, mode), group in groups.items():
        t = (tables or {}).get(mode) or default_tables(drafter, mode)
        dh = draft_head(drafter, embed, target_head, t, dev, dtype)
        _replay_group(drafter, dh, passes, regime, layouts.get(lay_name), mode, group, results,
                      max_steps, token_budget, dev, dtype, accounting)
        bar.update()
    bar.close()
    seqs = next(iter(passes.values())).sequences
    for res in results.values():
        res.prompt_ids = [s.prompt_id for s in seqs]
        res.categories = [s.category for s in seqs]
    return [results[v] for v in variants]


EMBED_SHARE = 0.25      # the largest share of the drafter's free GPU memory a table copy may take


def embedding_near(embed: nn.Module, dev) -> nn.Module:
    """The target's embedding table, copied to the drafter's GPU when it is elsewhere and
    takes at most EMBED_SHARE of that GPU's free memory (Kimi: 2.3 GB of bf16). A lookup is
    a gather, exact on any device, so this changes where the work runs, never a result: a
    cached run's table comes from the shards on the CPU, and every draft step of every tree
    would otherwise gather [B, Q, K, H] rows there and copy them over (2.2 GB a step for
    37 rows x 512 roots x top-8 at H 7168). The lm_head is never moved (a matmul's rounding
    differs between devices)."""
    if isinstance(embed, RowTable):          # holds only the rows this run looked up (Kimi: ~0.5 GB, not 2.3)
        return embed.near(dev)
    w = getattr(embed, "weight", None)
    if w is None or dev.type != "cuda" or w.device == dev:
        return embed
    if w.numel() * w.element_size() > EMBED_SHARE * torch.cuda.mem_get_info(dev)[0]:
        return embed
    return nn.Embedding.from_pretrained(w.detach().to(dev), freeze=True)


def _on(module: nn.Module, dev, dtype):
    """Call a target module (embedding or lm_head, wherever placement put it) from the
    drafter's device and dtype."""
    if isinstance(module, RowTable):         # rows read on first lookup, no whole weight
        return lambda x: module(x).to(dev, dtype)
    home = module.weight.device
    return lambda x: module(x.to(home) if not x.is_floating_point() else x.to(home, module.weight.dtype)).to(dev, dtype)


def _replay_group(drafter, dh, passes, regime, lay, mode, group, results, max_steps, budget, dev, dtype,
                  accounting):
    tp = passes[regime]
    seqs = tp.sequences
    _check_width(drafter, layout_features(tp, lay, mode, 0), lay, mode)
    for idx in budget_batches([len(s.ids) for s in seqs], budget):
        aux, valid = padded_features(tp, lay, mode, idx, dev, dtype)
        toks, _ = pad_right([torch.cat([seqs[i].ids[1:], seqs[i].ids[-1:]]) for i in idx])
        index, rows, roots, owners = _rounds(seqs, idx, aux.shape[1], max_steps, accounting)
        if rows[0].numel() == 0:
            for v in group:
                _store(results[v], torch.zeros(0, dtype=torch.long), roots, owners, idx)
            continue
        x = DraftInputs(aux, toks.to(dev), valid.to(dev), index.to(dev))
        rows = (rows[0].to(dev), rows[1].to(dev))
        by_tokens = defaultdict(list)
        for v in group:
            by_tokens[v.tokens_regime].append(v)
        for tok_regime, vs in by_tokens.items():
            windows = _windows(passes[tok_regime], idx, seqs, max_steps, accounting).to(dev)
            acc = _accept(drafter, dh, x, vs, windows, rows)
            for v in vs:
                _store(results[v], acc[v.tree].cpu(), roots, owners, idx)


def _accept(drafter, dh, x, variants, windows, rows):
    """Accepted drafts per round of every variant's tree; one step 1 (prefix) for them all."""
    out = {}
    pre = prefix(drafter, dh, x)
    shapes = sorted({v.tree for v in variants}, key=lambda s: (s.num_steps, s.topk, s.num_draft_tokens))
    chains = [s for s in shapes if s.topk == 1]
    if chains:
        out.update(_chains(drafter, dh, x, pre, chains, windows, rows))
    beams = defaultdict(list)
    for s in shapes:
        if s.topk > 1:
            beams[(s.num_steps, s.topk)].append(s)
    for group in beams.values():
        out.update(_trees(drafter, dh, x, pre, group, windows, rows))
    return out


def _rounds(seqs, idx, T: int, max_steps: int, accounting: RoundAccounting = WINDOW):
    """Where each sequence of the batch drafts, and which (row, column) of the drafts is
    each round. index [B, Q]: row b drafts at its roots (eval_roots), Q = the most roots of
    any row; a shorter row repeats its last index (drafted, never read). rows: ([R], [R])
    batch row and column of each round; roots [R] its index j; owners [R] its sequence.
    Example: prompts 5 and 3, lengths 10 and 7, S 2 -> roots 4..6 and 2..3 ->
    index [[4, 5, 6], [2, 3, 3]], rows ([0, 0, 0, 1, 1], [0, 1, 2, 0, 1])."""
    spans = [seq_roots(seqs[i], max_steps, accounting) for i in idx]
    Q = max(1, max(len(r) for r in spans))
    index = torch.zeros(len(idx), Q, dtype=torch.long)
    b_rows, q_rows, roots, owners = [], [], [], []
    for b, (i, r) in enumerate(zip(idx, spans)):
        last = r[-1] if len(r) else r.start                                   # < T
        index[b] = torch.arange(r.start, r.start + Q).clamp(0, last)
        b_rows += [b] * len(r)
        q_rows += list(range(len(r)))
        roots += list(r)
        owners += [i] * len(r)
    as_long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return index, (as_long(b_rows), as_long(q_rows)), as_long(roots), as_long(owners)


def _windows(tp: TargetPass, idx, seqs, max_steps, accounting: RoundAccounting = WINDOW):
    """[R, S]: the verifying tokens t_{j+2..j+1+S} of each round (in _rounds' order), from
    that regime's argmax."""
    return torch.cat([target_next_windows(tp.argmax[i], max_steps)[
        list(seq_roots(seqs[i], max_steps, accounting))] for i in idx])


def _store(res: VariantResult, acc, roots, owners, idx):
    for i in idx:
        sel = owners == i
        res.accepted[i] = acc[sel]
        res.roots[i] = roots[sel]


def _check_width(drafter: Eagle3Drafter, feats: torch.Tensor, lay, mode):
    c = drafter.cfg
    w = feats.shape[-1]
    if w not in (c.fc_in, c.hidden_size):
        what = "the final-normed last hidden state (--speculative-algorithm EAGLE)" if mode == "eagle" \
            else f"layout {lay}"
        raise DiagError("the drafter's fc cannot take these features", field="fc.weight",
                        expected=f"input width {c.fc_in} ({c.num_aux} x {c.target_hidden_size}) or "
                                 f"{c.hidden_size} (fc bypassed)",
                        found=f"width {w} from {what}")
