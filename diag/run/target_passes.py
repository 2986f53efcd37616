"""The target's side of a run: one teacher-forced pass per regime over the same sequences,
each from the content-keyed cache when it can be, else from the target loaded once.

The sequences are generated (or taken from the recorded continuations) under the reference
regime; every other regime replays the same sequences. Extra prompt sets (the case's other
renderings, the long-context prompts) are passed at the reference regime only, each with its
own greedy continuations, while that regime's target is loaded. While a regime's model is loaded,
`with_model(regime, model)` lets the caller use it (the step costs are measured on the
reference regime's model here, so a run never loads the target twice). A cached regime
loads no target weight at all; an entry that fails its integrity check is recomputed, with a
note. On a first run the content digests that key the cache are not memoised yet: the
target is then loaded before the key is computed, and the INT4 loader hashes the shards as it
reads them, so 550 GB are read once, not twice (a hit found that way drops the model).
This module knows models and the cache; nothing about drafters or reports.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import torch

from diag.checkpoint.identity import drain_notes, is_memoised
from diag.errors import DiagError
from diag.replay.round_accounting import accounting_for
from diag.run.checkpoints import locate
from diag.run.inputs import Inputs, dtype_of, engine_numerics, numerics_notes, round_accounting
from diag.target import resident
from diag.target.engine_numerics import apply_numerics
from diag.target.gen_batch import generation_batch
from diag.target.load import load_target, target_info
from diag.target.pass_cache import PassKey, load_pass, save_pass, token_digest
from diag.target.passes import TargetPass, build_sequences, capture_microbatches, run_capture

LONG_CONTEXT = "long-context"      # the extra pass of the long-context prompts (long_context.py)


def special_ids(tok, target_path: Path | None = None) -> tuple[set[int], int]:
    """(the ids that end a request, the pad id). A server stops at the tokenizer's eos and at every
    eos_token_id of the target's generation_config.json (vLLM: the sampling params' stop ids from
    the generation config). Example: tokenizer eos 1, generation_config [1, 6] -> {1, 6}: a chat
    model that ends its turn with <|end|> (6) stops there, not at the continuation's limit."""
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    gen = Path(target_path) / "generation_config.json" if target_path is not None else None
    if gen is not None and gen.is_file():
        try:
            written = json.loads(gen.read_text()).get("eos_token_id")
        except (OSError, ValueError):
            written = None
        ids = written if isinstance(written, list) else [written]
        eos |= {i for i in ids if isinstance(i, int) and not isinstance(i, bool)}
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    return eos, pad


def device_map(case, path: Path):
    from diag.target.placement import device_map_for
    pl = case.placement
    return device_map_for(path, pl.gpus, pl.gpu_memory, pl.activation_budget,
                          token_budget=case.evaluate.token_budget, experts=pl.experts)


def _other_checkpoint(tpath: Path, spec: str, dtype, case):
    other = locate(spec, case, "evaluate.regimes").path
    mine, theirs = target_info(tpath), target_info(other)
    for key in ("num_layers", "hidden_size", "vocab_size"):
        if getattr(mine, key) != getattr(theirs, key):
            raise DiagError("a ckpt: regime must be the same model in another format", file=str(other),
                            field=key, expected=f"{getattr(mine, key)} (as {tpath})", found=getattr(theirs, key))
    return load_target(other, dtype=dtype, device_map=device_map(case, other))[0]


def model_for(tpath: Path, dtype, regime: str, case):
    """The target under a regime, placed by the case; "ckpt:PATH" loads another checkpoint
    of the same model."""
    if regime.startswith("ckpt:"):
        return _other_checkpoint(tpath, regime[5:], dtype, case)
    model, _ = load_target(tpath, dtype=dtype, device_map=device_map(case, tpath))
    if regime != "as-loaded":
        from diag.target.quantize import apply_regime
        from diag.target.regimes import regime as parse_regime
        apply_regime(model, parse_regime(regime))
    return model


def _checkpoint(inp: Inputs, regime: str) -> Path:
    return locate(regime[5:], inp.case, "evaluate.regimes").path if regime.startswith("ckpt:") else inp.target_path


def _load_primes_digests(ckpt: Path) -> bool:
    """True on a first run of an INT4 checkpoint: its digests are not memoised, and loading it
    (diag.int4.load) hashes every shard during the one read it needs anyway."""
    return target_info(ckpt).quantization == "pack-quantized" and not is_memoised(ckpt)


def lookahead(inp: Inputs) -> int:
    """Greedy tokens past each request's end that the engine's round accounting scores
    (vllm: the deepest tree's steps; window: 0)."""
    return accounting_for(round_accounting(inp.case)).lookahead(max(s.num_steps for s in inp.shapes))


def pass_key(inp: Inputs, regime: str, tokens_sha: str, dtype) -> PassKey:
    case = inp.case
    ckpt = _checkpoint(inp, regime)
    placement = f"gpus={case.placement.gpus}" if case.placement.gpus else "cpu"
    if case.placement.microbatches > 1:          # other generation batches: other rounding
        placement += f",microbatches={case.placement.microbatches}"
    if case.placement.gpus and case.placement.experts != "layer":   # shards' partial sums: other rounding
        placement += f",experts={case.placement.experts}"
    if engine_numerics(inp) != "transformers" and dtype != torch.float32:   # the served engine's rounding
        placement += f",numerics={engine_numerics(inp)}"
    extra = lookahead(inp)
    new_tokens = f"{case.prompts.max_new_tokens}+{extra}" if extra else case.prompts.max_new_tokens
    return PassKey.make(ckpt, tokens_sha, regime, inp.points, new_tokens, str(dtype), placement)


def extra_prompt_sets(inp: Inputs) -> dict[str, list[tuple[str, str, list[int]]]]:
    """Prompt sets replayed at the reference regime only, besides the serving rendering's:
    every other rendering of the case, and the long-context prompts."""
    out = {name: inp.rendered.ids[name] for name in inp.rendered.others()} if inp.rendered else {}
    if inp.long_prompts:
        out[LONG_CONTEXT] = inp.long_prompts
    return out


def _timed(clock: dict, name: str, fn):
    """fn(), its wall seconds added to clock[name] (target_load_s, target_generate_s,
    target_capture_s)."""
    t0 = time.perf_counter()
    out = fn()
    clock[name] = round(clock.get(name, 0.0) + time.perf_counter() - t0, 3)
    return out


class Local:
    """Where a pass's pieces run: here, the whole prompt set (run/distributed.py's Shards spreads
    the generation and the capture over ranks, the same batches as here, and keeps the cache on
    rank 0)."""

    def lookup(self, key: PassKey, regime: str):
        return load_pass(key)

    def sequences(self, build, prompts, batch: int):
        return build(prompts, batch)

    def capture(self, run, sequences, token_budget: int):
        return run(sequences)

    def save(self, key: PassKey, tp: TargetPass) -> None:
        save_pass(key, tp)


LOCAL = Local()


class _Target:
    """The target under one regime, loaded on first use (a cached pass needs none); its
    load time goes to `clock`."""

    def __init__(self, inp: Inputs, regime: str, dtype, clock: dict):
        self.inp, self.regime, self.dtype, self.model, self.clock = inp, regime, dtype, None, clock

    def get(self):
        """The model, rounding as the served engine's kernels do (inputs.engine_numerics); inside
        target/resident.kept(), the one an earlier run loaded when its Key is unchanged (counted
        as target_kept, no load time)."""
        if self.model is None:
            def load():
                return _timed(self.clock, "target_load_s", lambda: apply_numerics(
                    model_for(self.inp.target_path, self.dtype, self.regime, self.inp.case), engine_numerics(self.inp)))
            held = resident.current()
            if held is None:
                self.model = load()
            else:
                ckpt = _checkpoint(self.inp, self.regime)
                key = resident.Key.make(ckpt, self.dtype, self.regime, device_map(self.inp.case, ckpt),
                                        engine_numerics(self.inp))
                self.model, was_held = held.take(key, load)
                if was_held:
                    self.clock["target_kept"] = self.clock.get("target_kept", 0) + 1   # a count (timings)
        return self.model


def _one_pass(inp: Inputs, target: _Target, prompts, recorded, sequences, *, use_cache: bool, progress: bool,
              meta: dict, label: str, spread: Local = LOCAL):
    """One TargetPass over `prompts` (or the given sequences), from the cache when it can be."""
    t0 = time.perf_counter()
    dtype, case, clock = target.dtype, inp.case, target.clock
    eos, pad = special_ids(inp.tokenizer, inp.target_path)
    key = pass_key(inp, target.regime, token_digest(prompts, recorded, eos, pad), dtype) if use_cache else None
    meta["cache_notes"] += [f"checkpoint digest: {n}" for n in drain_notes()]
    tp, why = spread.lookup(key, target.regime) if use_cache else (None, None)
    if why:
        meta["cache_notes"].append(f"target pass [{label}]: {why}")
    if tp is None:
        model = target.get()
        if sequences is None:
            batch = generation_batch(model, [p for _, _, p in prompts], case.prompts.max_new_tokens,
                                     case.evaluate.token_budget)
            if recorded is None:
                clock.setdefault("target_generate_batch", batch)      # rows, not seconds (timings)
                clock.setdefault("target_generate_longest_prompt", max((len(p) for _, _, p in prompts), default=0))
            sequences = _timed(clock, "target_generate_s", lambda: spread.sequences(lambda part, b: build_sequences(
                model, part, case.prompts.max_new_tokens, pad_id=pad, eos_ids=eos, recorded=recorded,
                batch_size=b, progress=progress, lookahead=lookahead(inp),
                microbatches=case.placement.microbatches), prompts, batch))
        clock.setdefault("target_capture_microbatches",              # a count (timings), as above
                         capture_microbatches(sequences, case.evaluate.token_budget))
        tp = _timed(clock, "target_capture_s", lambda: spread.capture(lambda seqs: run_capture(
            model, seqs, inp.points, regime=target.regime, token_budget=case.evaluate.token_budget,
            progress=progress), sequences, case.evaluate.token_budget))
        if use_cache:
            spread.save(key, tp)
    return tp, {"cached": tp.cached, "cache_key": key.digest if key else None,
                "seconds": round(time.perf_counter() - t0, 3)}


def target_passes(inp: Inputs, *, progress: bool, use_cache: bool,
                  with_model: Callable[[str, object], None] | None = None,
                  needs_model: set[str] = frozenset(), spread: Local = LOCAL
                  ) -> tuple[dict[str, TargetPass], dict, dict[str, TargetPass]]:
    """regime -> TargetPass over the same sequences (the serving rendering's), the report's
    target_pass section (with "cache_notes": why an entry could not be used, and "phases":
    seconds spent loading, generating and capturing, summed over regimes, which the caller
    moves to its timings), and name -> TargetPass of every extra prompt set
    (extra_prompt_sets) at the reference regime, each with its own greedy continuations.
    The target loads at most once per regime; a regime in `needs_model` loads its model for
    `with_model` even when its pass comes from the cache (the sampled decode loop). `spread`:
    where the generation and the capture run (Local: here; run/distributed.Shards: over ranks)."""
    dtype = dtype_of(inp.case.target.dtype, "target.dtype", inp.case)
    passes, extra, sequences = {}, {}, None
    meta = {"regimes": {}, "cache_notes": numerics_notes(inp), "extra_passes": {}, "phases": {}}
    drain_notes()                         # an earlier run's notes in this process are not this run's
    for reg in inp.regimes:
        target = _Target(inp, reg, dtype, meta["phases"])
        if use_cache and _load_primes_digests(_checkpoint(inp, reg)):
            target.get()                  # the load hashes the shards: the key then costs no second read
        tp, info = _one_pass(inp, target, inp.prompts, inp.recorded, sequences, use_cache=use_cache,
                             progress=progress, meta=meta, label=reg, spread=spread)
        if reg in needs_model:
            target.get()                  # the sampled decode loop needs the model even on a cache hit
        sequences = tp.sequences
        passes[reg] = tp
        meta["regimes"][reg] = {**info, "argmax_agreement": tp.agreement_with_sequence()}
        if reg == inp.regimes[0]:
            for name, prompts in extra_prompt_sets(inp).items():
                extra[name], info = _one_pass(inp, target, prompts, None, None, use_cache=use_cache,
                                              progress=progress, meta=meta, label=f"{reg}, {name}", spread=spread)
                meta["extra_passes"][name] = {**info, "sequences": len(extra[name].sequences)}
        if target.model is not None and with_model is not None:
            with_model(reg, target.model)
        del target
    return passes, _summary(meta, passes, inp), extra


def _summary(meta: dict, passes: dict[str, TargetPass], inp: Inputs) -> dict:
    seqs = passes[inp.regimes[0]].sequences
    meta.update({"source": "recorded" if inp.recorded is not None else "greedy",
                 "max_new_tokens": inp.case.prompts.max_new_tokens, "sequences": len(seqs),
                 "tokens": int(sum(len(s.ids) for s in seqs)),
                 "continuation_tokens": int(sum(s.emitted - s.prompt_len for s in seqs)),
                 "points": [p.name for p in inp.points], "reference_regime": inp.regimes[0]})
    return meta
