"""Sampled decodings of a run: the decode loop on the reference regime's target while the
pass has it loaded (target_passes' `with_model`), so a run never loads the target twice.

Which variants (the case's decoding.scope):
  "verdicts"  every candidate (eagle3 layouts and EAGLE mode) on the primary tree, then the
              best of them (by the exact expectation; of near-tied ones, the one no batch's noise
              moves: run/evaluate.trained_lead) on every other tree: what the layout, EAGLE-mode
              and tree verdicts read at the served decoding;
  "all"       every candidate on every tree.
Each variant runs once per seed over every prompt. Lanes share each verify forward (rows = lanes
x prompts, in batches of at most `token_budget` verified tokens); the prompts' prefill is shared by
every lane. On CUDA the lanes of every tree shape still to decode run in one loop (`mix_trees_wanted`:
a verify reads the target's weights once whatever its rows, so 6 trees cost one loop's rounds,
not six; the trees are padded to the widest, see DecodeLoop); on the CPU, where a verify's cost
is its tokens, each tree runs its own loop. Either way each row decodes the same. Nothing is loaded and nothing runs when the run
has no sampled decoding. Each loop is answered from the sampled cache when it ran before with the
same content (run/sampled_cache.py); when every loop is, the target is not loaded for them.
This module connects the loop with a case; it knows nothing about files or reports.
"""

from __future__ import annotations

import json
import time

import torch

from diag.checkpoint.identity import checkpoint_identity, is_memoised
from diag.errors import env_switch
from diag.replay.decode_loop import DecodeLoop
from diag.replay.decode_rows import Lane
from diag.replay.evaluation import Evaluation
from diag.replay.replay import Variant
from diag.replay.round_accounting import accounting_for
from diag.replay.sampled_summary import summarize_sampled
from diag.run import sampled_cache
from diag.run.eval_cache import _device_name
from diag.run.evaluate import serving_rendering, trained_lead
from diag.run.inputs import Inputs, draft_tables_by_mode, dtype_of, round_accounting, sampled_verification
from diag.run.target_passes import _checkpoint, pass_key, special_ids
from diag.target.pass_cache import token_digest
from diag.trees import TreeShape


def _batches(rows: list[tuple[int, int]], lens: list[int], shape: TreeShape, max_new: int,
             budget: int) -> list[list[tuple[int, int]]]:
    """Rows in batches whose cached tokens (rows x (longest prompt + max_new + 2D)) stay within
    the case's token budget, the tokens a teacher-forced pass batch holds (a KV cache of all
    layers costs more per token than one layer's activations: keep the budget honest on GPUs).
    Rows go shortest prompt first, every lane of a prompt together, and a batch takes rows while
    the next still fits: short prompts share large batches (fewer rounds), a prompt is prefilled
    once for all its lanes, and no batch attends over a long prompt's padding.
    Example: budget 16384, D 4, 64 new: 300 rows of 40-token prompts fit 16384 // 112 = 146 per
    batch; 30 rows of 300-token prompts after them fit 16384 // 372 = 44 -> 3 batches."""
    order = sorted(rows, key=lambda r: (lens[r[1]], r[1], r[0]))
    out: list[list[tuple[int, int]]] = []
    for r in order:
        need = lens[r[1]] + max_new + 2 * shape.num_draft_tokens
        n = len(out[-1]) + 1 if out else 0
        if out and n * need <= budget and n * shape.num_draft_tokens <= budget:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def loaded_tables(model, embed, head) -> tuple:
    """The embedding and lm_head the decode loop drafts with: the loaded target's own (the
    checkpoint's tensors: no regime quantizes them), resident on its devices, instead of the run's
    lazy tables (target/tables.py), whose RowTable gathers new rows on the host at every lookup (a
    CUDA graph of the draft cannot be captured over it: decode_draft.DraftSide._draft_group) and whose
    LazyHead would read Kimi's 2.35 GB head a second time; either lazy table stays where the model
    holds its own on the meta device (an offloading placement)."""
    def resident(own, lazy):
        w = getattr(own, "weight", None)
        return own if isinstance(w, torch.Tensor) and w.device.type != "meta" else lazy
    return resident(model.get_input_embeddings(), embed), resident(model.get_output_embeddings(), head)


def mix_trees_wanted(dev) -> bool:
    """Every tree in one loop: DIAG_MIX_TREES "1" or "0" where set, else on CUDA only (module
    docstring: on the CPU the padding would cost work and save nothing)."""
    value = env_switch("DIAG_MIX_TREES")
    return torch.device(dev).type == "cuda" if value is None else value


class SampledEvaluations:
    """Callable as target_passes' with_model hook; `evaluations` afterwards."""

    def __init__(self, inp: Inputs, drafter, embed, head, shards=None, use_cache: bool = False):
        self.inp, self.drafter, self.embed, self.head = inp, drafter, embed, head
        self.shards = shards                 # run/distributed.Shards: this rank decodes its share of the batches
        self.use_cache = use_cache and shards is None
        self.notes: list[str] = []           # why a cache entry was not believed
        self._base: list[list[str]] | None = None
        plan = inp.decoding
        self.decodings = list(plan.sampled) if plan is not None else []
        self.regime = inp.regimes[0]
        self.evaluations: list[Evaluation] = []
        self.seconds = 0.0
        self.counts: dict[str, int] = {}     # tree shapes decoded / cached, lanes, rows, rounds (verify forwards)
        self.ran = False

    @property
    def regimes(self) -> set[str]:
        """Regimes whose model must be loaded even when their pass is cached: none when every
        loop is answered from the cache (asked only when the target's digest is memoised, so
        the key costs no read of its weights)."""
        if not self.decodings:
            return set()
        if self.use_cache and is_memoised(_checkpoint(self.inp, self.regime)) and self._resolve(None):
            return set()
        return {self.regime}

    def __call__(self, regime: str, model) -> None:
        if regime == self.regime and self.decodings and not self.ran:
            self._resolve(model)

    def _resolve(self, model) -> bool:
        """Every decoding's evaluations; model None: from the cache only (False on a miss)."""
        t0 = time.perf_counter()
        self.counts = {}                     # a cache-only try that missed is counted again with the model
        try:
            evals = [e for dec in self.decodings for e in self._one(model, dec)]
        except _Miss:
            return False
        self.evaluations, self.ran = evals, True
        self.seconds = round(time.perf_counter() - t0, 3)
        return True

    def _key(self, dec, shape, lanes: list[Lane]) -> list[list[str]]:
        inp = self.inp
        if self._base is None:
            eos, pad = special_ids(inp.tokenizer, inp.target_path)
            dtype = dtype_of(inp.case.target.dtype, "target.dtype", inp.case)
            p = next(self.drafter.parameters())
            self._base = [["target_pass", pass_key(inp, self.regime, token_digest(inp.prompts, inp.recorded, eos, pad),
                                                   dtype).digest],
                          ["drafter", checkpoint_identity(inp.drafter_path)], ["drafter_dtype", str(p.dtype)],
                          ["device", _device_name(p.device)], ["eos", json.dumps(sorted(eos))]]
        return sampled_cache.loop_key(self._base, dec, shape, lanes, {c.label: c.layout for c in inp.candidates},
                                      draft_tables_by_mode(inp), sampled_verification(inp),
                                      inp.case.evaluate.token_budget)

    def _variants(self, dec, shapes, candidates) -> list[Variant]:
        rendering = serving_rendering(self.inp)
        return [Variant(c.label, c.mode, s, self.regime, self.regime, rendering=rendering, decoding=dec.name)
                for c in candidates for s in shapes]

    def _one(self, model, dec) -> list[Evaluation]:
        inp = self.inp
        shapes, cands = inp.shapes, inp.candidates
        if inp.decoding.scope == "all":
            return self._run(model, dec, self._variants(dec, shapes, cands))
        first = self._run(model, dec, self._variants(dec, shapes[:1], cands))
        top = trained_lead([e for e in first if e.mode == "eagle3"], None, inp.case, inp.candidates)
        if top is None or len(shapes) == 1:
            return first
        lead = [c for c in cands if c.label == top.layout]
        return first + self._run(model, dec, self._variants(dec, shapes[1:], lead))

    def _run(self, model, dec, variants: list[Variant]) -> list[Evaluation]:
        inp, ev = self.inp, self.inp.case.evaluate
        prompts = [p for _, _, p in inp.prompts]
        lens = [len(p) for p in prompts]
        eos, _ = special_ids(inp.tokenizer, inp.target_path)
        layouts = {c.label: c.layout for c in inp.candidates}
        window = max(s.num_steps for s in inp.shapes)
        accounting = accounting_for(round_accounting(inp.case))      # the rounds the engine counts
        out = []
        trees = [(shape, [Lane(v, s) for v in variants if v.tree == shape for s in inp.decoding.seeds])
                 for shape in dict.fromkeys(v.tree for v in variants)]
        decoded = self._decode(model, dec, trees, prompts, lens, eos, layouts)
        for shape, _ in trees:
            for v in (v for v in variants if v.tree == shape):
                mine = [o for o in decoded[shape] if o.lane.variant == v]
                out.append(summarize_sampled(v, mine, [pid for pid, _, _ in inp.prompts], lens, window_steps=window,
                                             buckets=ev.position_buckets, seed=ev.seed, n_boot=ev.bootstrap,
                                             accounting=accounting))
        return out

    def _decode(self, model, dec, trees, prompts, lens, eos, layouts) -> dict:
        """Every row of every tree's lanes (lanes x prompts), {shape: rows}: from the cache or
        decoded (and then cached, tree by tree); model None and an entry missing: _Miss."""
        got, todo = {}, []
        for shape, lanes in trees:
            key = self._key(dec, shape, lanes) if self.use_cache else None
            hit = None
            if key is not None:
                hit, why = sampled_cache.load(key, lanes)
                if why:
                    self.notes.append(f"sampled decode {dec.name} {shape.name}: {why}")
            if hit is not None:
                self._count(trees_cached=1)
                got[shape] = hit
            else:
                todo.append((shape, lanes, key))
        if todo and model is None:
            raise _Miss
        mix = mix_trees_wanted(next(self.drafter.parameters()).device)
        for part in ([todo] if mix and todo else [[t] for t in todo]):
            lanes = [ln for _, ls, _ in part for ln in ls]
            decoded = self._loop(model, dec, lanes, prompts, lens, eos, layouts)
            for shape, ls, key in part:
                mine = set(ls)                   # by value: another rank's rows arrive as copies
                got[shape] = [o for o in decoded if o.lane in mine]
                if key is not None:
                    sampled_cache.save(key, ls, got[shape])
        return got

    def _loop(self, model, dec, lanes, prompts, lens, eos, layouts) -> list:
        """One loop over `lanes` (whatever their trees): every row, in batches."""
        inp, ev = self.inp, self.inp.case.evaluate
        shapes = list(dict.fromkeys(ln.variant.tree for ln in lanes))
        names = "+".join(s.name for s in shapes)
        embed, head = loaded_tables(model, self.embed, self.head)
        loop = DecodeLoop(model, self.drafter, embed, head, lanes, layouts, None, dec, eos_ids=eos,
                          tables=draft_tables_by_mode(inp), verification=sampled_verification(inp))
        rows = [(li, p) for li in range(len(lanes)) for p in range(len(prompts))]
        widest = max(shapes, key=lambda s: s.num_draft_tokens)
        batches = _batches(rows, lens, widest, inp.case.prompts.max_new_tokens, ev.token_budget)
        if self.shards is not None:          # this rank's share of the same batches, bit for bit
            batches = self.shards.own_batches(batches)
        decoded = []
        for batch in batches:
            decoded += loop.run(prompts, batch, inp.case.prompts.max_new_tokens)
        self._count(decode_loops=1, trees_decoded=len(shapes), lanes=len(lanes), rows=loop.counts["rows"],
                    rounds=loop.counts["rounds"], verified_tokens=loop.counts["verified_tokens"])
        self.counts["mla_latent_layers"] = max(self.counts.get("mla_latent_layers", 0),     # a count, not a sum
                                               loop.counts["mla_latent_layers"])
        for what, failure in loop.graph_failures.items():
            self.notes.append(f"sampled decode {dec.name} {names}: the {what}'s CUDA graphs were turned off "
                              f"({failure}); it ran eagerly: the same numbers, slower")
        if self.shards is not None:
            decoded = self.shards.all_rows([r for b in batches for r in b], decoded)
        return decoded

    def _count(self, **n: int) -> None:
        for k, v in n.items():
            self.counts[k] = self.counts.get(k, 0) + int(v)


class _Miss(Exception):
    """A loop the cache cannot answer while no model is loaded."""
