"""A case, end to end: check, load the drafter, pass the target, replay, summarise, judge.

    inputs.prepare        configs, tokenizer, candidates, shapes, prompts   (no weights)
    load_drafter          the drafter's weights, checked                    (small)
    target_tables         the target's embedding / lm_head, read as used    (target/tables.py)
    target_passes         the target, once, or its cached passes            (large)
      + sampled           the decode loop for sampled decodings, on the loaded target (run/sampled.py)
    evaluate              every variant -> Evaluation records, each replayed variant cached
                          (run/eval_cache.py): a repeat run replays none
    sections, verdicts    the engines compared, the diagnoses' sections (diag/diagnoses/: the
                          speedup, the regimes, the live server, the renderings, ...), then the verdicts

The registered diagnoses (diag/diagnoses/) prepare before any weight is loaded, work while each
target is loaded (e.g. the step costs measured on it; the seconds they spend there join the
timings after the pass's phases) and compute their sections after the evaluations. This module
knows how the pieces connect; it knows nothing about TOML syntax, Markdown or the terminal.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from diag.diagnoses.hooks import compute_all, prepare_all, with_model_all
from diag.diagnoses.protocol import Context, Loaded
from diag.drafter.checkpoint import load_drafter
from diag.drafter.health import HealthCheck, health_checks
from diag.engines.common import ServingError
from diag.replay.evaluation import Axes, Evaluation, best, select
from diag.run.candidates import Candidate
from diag.run.case import Case, check_case
from diag.run.engines_section import EnginesSection, engines_section
from diag.run.eval_cache import EvalCache, cached_output_health
from diag.run.evaluate import evaluate, reference_axes, trained_lead
from diag.run.inputs import Inputs, engine_numerics, prepare, served_dtypes
from diag.run.sampled import SampledEvaluations
from diag.run.target_passes import target_passes
from diag.run.verdicts import Verdict, verdicts
from diag.target import resident
from diag.target.load import TargetInfo
from diag.target.tables import target_tables


@dataclass
class RunResult:
    case: Case
    target: TargetInfo
    drafter: dict
    prompts: dict
    target_pass: dict
    candidates: list[Candidate]
    evaluations: list[Evaluation]
    reference: Axes                      # every axis's reference value; layout ANY
    capture_convention: str = ""         # the layer-id rule the engine applies to this target
    verdicts: list[Verdict] = field(default_factory=list)
    drafter_health: tuple[HealthCheck, ...] = ()   # why a drafter at the floor predicts nothing
    serving_error: ServingError | None = None
    timings: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    engines: EnginesSection | None = None  # the engines compared from this one pass (run/engines_section.py)
    diagnoses: dict = field(default_factory=dict)   # name -> typed section or None (diag/diagnoses/)
    decoding: object = None              # run/decodings.DecodingPlan: served and sampled decodings
    target_output: object = None         # target/output_health.OutputHealth of the reference pass

    def best_layout(self) -> str | None:
        """The eagle3 layout with the highest accept length at the reference axes (of near-tied
        ones under sampling, the one no batch's noise moves: run/evaluate.trained_lead)."""
        top = trained_lead(self.evaluations, self.reference, self.case, self.candidates)
        return top.layout if top else None


def _sync(device: torch.device) -> None:
    """A GPU's queued copies finished (a phase's time is its own, not the next one's)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stopwatch(timings: dict, name: str, start: float) -> float:
    now = time.perf_counter()
    timings[name] = round(now - start, 3)
    return now


def _main_device(case: Case) -> torch.device:
    """Where the drafter runs: the first GPU when the case places the target on GPUs."""
    return torch.device("cuda:0" if case.placement.gpus > 0 else "cpu")


def _continuations(tp) -> torch.Tensor:
    """Every replayed continuation token (target ids), prompts excluded: [sum of T - prompt_len]."""
    return torch.cat([s.ids[s.prompt_len:s.emitted] for s in tp.sequences]) if tp.sequences else torch.zeros(0)


def _drafter_info(dpath: Path, dckpt, drafter) -> dict:
    return {"path": str(dpath), **dckpt.to_json(), "files": list(dckpt.weight_files),
            "num_aux": drafter.cfg.num_aux, "hidden_size": drafter.cfg.hidden_size,
            "draft_vocab_size": drafter.cfg.draft_vocab_size,
            "config": hashlib.sha256((dpath / "config.json").read_bytes()).hexdigest()[:16]}


def _prompts_info(inp: Inputs) -> dict:
    pset = inp.prompt_set
    return {"file": pset.path, "sha256": pset.sha256, "count": len(pset.prompts),
            "categories": sorted({p.category for p in pset.prompts})}


def run_case(case: Case, *, progress: bool = True, use_cache: bool = True, shards=None) -> RunResult | None:
    """`shards` (run/distributed.Shards): one rank of a distributed run; None on the ranks
    other than 0, which run their share of the passes' batches and send it to rank 0."""
    timings: dict = {}
    t0 = part = time.perf_counter()
    inp = prepare(check_case(case))
    inp, prepared = prepare_all(inp)                                # the diagnoses' own, before any weight
    part = _stopwatch(timings, "checks_prepare_s", part)            # checks_s in parts: where a repeat run's go
    case = inp.case
    ddtype, ddev = served_dtypes(case, inp.target_config)[1], _main_device(case)
    (drafter, dckpt), kept = resident.part(lambda: resident.PartKey.drafter(inp.drafter_path, ddtype, ddev),
                                           lambda: load_drafter(inp.drafter_path, dtype=ddtype, device=ddev))
    timings["drafter_kept"] = int(kept)                             # under `diag run --watch`: read once
    drafter.set_numerics(engine_numerics(inp))          # the served engine's rounding (bf16/fp16 only)
    _sync(ddev)
    part = _stopwatch(timings, "checks_drafter_s", part)
    embed, head = target_tables(inp.target_path, inp.target_config)   # rows read as used, head when needed
    if drafter.cfg.lm_head_from_target:            # no draft_vocab_size: the target's lm_head
        drafter.use_target_head(head)
    _stopwatch(timings, "checks_tables_s", part)
    t0 = _stopwatch(timings, "checks_s", t0)
    loaded = Loaded(drafter, embed, head, use_cache, inp)
    sampled = SampledEvaluations(inp, drafter, embed, head, shards=shards, use_cache=use_cache)
    got = (shards.target_passes if shards is not None else target_passes)(
        inp, progress=progress, use_cache=use_cache, needs_model=sampled.regimes,
        with_model=lambda reg, model: (with_model_all(prepared, reg, model, loaded), sampled(reg, model)))
    if got is None:
        return None                                  # a rank other than 0: its share is rank 0's now
    passes, pass_meta, extra = got
    notes = inp.notes + pass_meta.pop("cache_notes") + list(dict.fromkeys(sampled.notes))
    t0 = _stopwatch(timings, "target_s", t0)
    timings.update(pass_meta.pop("phases"))          # target_load_s, _generate_s, _capture_s
    timings.update(loaded.timings)                   # the diagnoses' while a target was loaded (target_costs_s)
    if sampled.decodings:
        timings["sampled_s"] = sampled.seconds
        timings.update({f"sampled_{k}": v for k, v in sampled.counts.items()})   # tree shapes, lanes, rounds decoded
    cache = EvalCache.for_run(inp.target_path, inp.drafter_path, next(drafter.parameters()).dtype,
                              _main_device(case), pass_meta) if use_cache else None
    evals = evaluate(inp, drafter, embed, head, passes, progress=progress, extra=extra,
                     cache=cache) + sampled.evaluations
    if cache is not None:
        timings.update(evaluations_replayed=cache.computed, evaluations_reused=cache.reused)
        notes += cache.notes
    t0 = _stopwatch(timings, "drafter_s", t0)
    health = health_checks(drafter, _continuations(passes[inp.regimes[0]]))
    ref_pass = passes[inp.regimes[0]]
    target_output = cached_output_health(cache, inp.regimes[0], ref_pass, head, inp.target.vocab_size)
    run = RunResult(case, inp.target, _drafter_info(inp.drafter_path, dckpt, drafter), _prompts_info(inp),
                    pass_meta, inp.candidates, evals, reference_axes(inp), inp.capture_convention,
                    serving_error=inp.serving_error, drafter_health=health,
                    timings=timings, notes=notes, decoding=inp.decoding, target_output=target_output)
    greedy = run.reference.but(decoding="greedy")           # the diagnoses read the greedy reference
    top = best(select(evals, greedy))
    run.engines = engines_section(case, inp.drafter_config, inp.target_config, evals, run.reference,
                                  run.best_layout())
    run.diagnoses = compute_all(Context(inp, greedy, top.layout if top else None, evals, passes, extra, drafter,
                                        embed, head, progress, cache, prepared, notes, timings))
    run.verdicts = verdicts(run, inp.target_config)
    _stopwatch(timings, "summary_s", t0)
    return run
