"""A case, end to end: check, load, replay, summarise. Returns plain data for the report.

Order matters for users: everything that can be checked without weights (paths, configs,
widths, vocabularies, tokenizer, layouts, trees) is checked before any weight is loaded, so
a mistake costs seconds, not a 550 GB load. This module knows how the pieces connect; it
knows nothing about TOML syntax, Markdown or the terminal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from diag.case import Case, resolve_path
from diag.drafter_io import load_drafter, read_config
from diag.errors import DiagError
from diag.layouts import point, union_points
from diag.pass_cache import PassKey, load_pass, save_pass, token_digest
from diag.prompts import read_prompt_set, read_recorded, tokenize
from diag.replay import Variant, replay
from diag.regime_report import regime_section
from diag.results import summarize
from diag.target import TargetInfo, load_embed_and_head, load_target, read_target_config, target_info
from diag.target_pass import build_sequences, run_capture
from diag.trees import TreeShape, grid, tree_shape
from diag.candidates import Candidate, candidates_for
from diag.costs import measure_costs
from diag.speedup_table import speedup_section, user_costs
from diag.verdicts import verdicts


@dataclass
class RunResult:
    case: Case
    target: TargetInfo
    drafter: dict
    prompts: dict
    target_pass: dict
    candidates: list[Candidate]
    evaluations: list[dict]
    verdicts: list[dict]
    timings: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    speedup: dict | None = None
    regimes: dict | None = None


def best_layout(evals: list[dict], case: Case, tree: str) -> str | None:
    """The eagle3 layout with the highest accept length on the reference regime and tree."""
    ref = case.evaluate.reference_regime
    pool = [e for e in evals if e["mode"] == "eagle3" and e["tree"] == tree and e["regime"] == ref
            and e["tokens_regime"] == ref and e["accept_length"] is not None]
    return max(pool, key=lambda e: e["accept_length"])["layout"] if pool else None


def checkpoint_path(spec: str, case: Case, field_name: str) -> Path:
    return Path(zoo_or_path(resolve_path(spec, case, field_name)))


def _dtype(name: str, field_name: str, case: Case):
    table = {"auto": None, "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise DiagError("unknown dtype", file=case.source, field=field_name,
                        expected=sorted(table), found=name)
    return table[name]


def check_pair(tinfo: TargetInfo, dcfg: dict, dpath: Path) -> None:
    """Vocabulary and width checks that need only the two config.json files."""
    where = str(dpath / "config.json")
    if int(dcfg.get("vocab_size", -1)) != tinfo.vocab_size:
        raise DiagError("drafter and target vocabularies differ", file=where, field="vocab_size",
                        expected=f"{tinfo.vocab_size} (target {tinfo.path}/config.json)",
                        found=dcfg.get("vocab_size"))
    t_hidden = int(dcfg.get("target_hidden_size") or dcfg.get("hidden_size", -1))
    if t_hidden != tinfo.hidden_size:
        raise DiagError("drafter was built for another target width", file=where, field="target_hidden_size",
                        expected=f"{tinfo.hidden_size} (target hidden_size)", found=t_hidden)


def check_tokenizer(tok, tinfo: TargetInfo) -> None:
    if len(tok) > tinfo.vocab_size:
        raise DiagError("tokenizer has more tokens than the target's embedding table",
                        file=f"{tinfo.path}/tokenizer.json", field="vocab",
                        expected=f"<= {tinfo.vocab_size} (config vocab_size)", found=len(tok))


def _tokenizer(path: Path):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise DiagError("cannot load the target's tokenizer", file=str(path),
                        expected="tokenizer.json / tokenizer_config.json", found=str(err).splitlines()[0]) from err


def _variants(case: Case, cands: list[Candidate], shapes: list[TreeShape]) -> list[Variant]:
    """Every candidate x shape x regime, features and tokens from the same regime."""
    regimes = _regimes(case)
    return [Variant(c.label, c.mode, shape, reg, reg) for c in cands for shape in shapes for reg in regimes]


def _cross_variants(case: Case, layout_label: str | None, shape: TreeShape) -> list[Variant]:
    """The cross matrix, only for the trained (best) layout on the primary tree: features
    from regime A, verifying tokens from regime B != A."""
    regimes = _regimes(case)
    if not case.evaluate.cross_regimes or layout_label is None or len(regimes) < 2:
        return []
    return [Variant(layout_label, "eagle3", shape, a, b) for a in regimes for b in regimes if a != b]


def _regimes(case: Case) -> list[str]:
    return list(dict.fromkeys([case.evaluate.reference_regime, *case.evaluate.regimes]))


def tree_shapes(case: Case) -> tuple[list[TreeShape], list[str]]:
    """The case's named shapes, then its sweep grid after SGLang's topk=1 rewrite."""
    shapes = [tree_shape(t, field="evaluate.trees") for t in case.evaluate.trees]
    notes = []
    if case.evaluate.tree_grid:
        g = case.evaluate.tree_grid
        more, rewritten = grid(g["num_steps"], g["topk"], g["num_draft_tokens"])
        shapes += more
        notes += [f"tree grid: (S={s}, K={k}, D={d}) runs as {shape.name}: SGLang forces "
                  f"num_draft_tokens = num_steps + 1 when topk = 1" for (s, k, d), shape in rewritten]
    return list(dict.fromkeys(shapes)), notes


def with_launch(case: Case, tpath: Path) -> tuple[Case, list[TreeShape], list[str]]:
    """What the case's SGLang launch command really runs (diag/launch.py): its algorithm
    becomes the serving algorithm, its effective tree joins the shapes, its rewrites and
    crashes become notes."""
    if not case.serving.launch:
        return case, [], []
    from dataclasses import replace
    from diag.launch import effective_config, parse_launch
    eff = effective_config(parse_launch(case.serving.launch), read_target_config(tpath))
    notes = [f"launch command: {n}" for n in eff.notes]
    if eff.crash:
        notes.append(f"launch command: SGLang would crash: {eff.crash}")
    shapes = [eff.tree.shape] if eff.tree is not None and eff.tree.shape is not None else []
    if eff.algorithm:
        case = replace(case, serving=replace(case.serving, algorithm=eff.algorithm))
    return case, shapes, notes


def _stopwatch(timings: dict, name: str, start: float) -> float:
    now = time.perf_counter()
    timings[name] = round(now - start, 3)
    return now


def run_case(case: Case, *, progress: bool = True, use_cache: bool = True) -> RunResult:
    timings: dict = {}
    t0 = time.perf_counter()
    tpath = checkpoint_path(case.target.path, case, "target.path")
    dpath = checkpoint_path(case.drafter.path, case, "drafter.path")
    tinfo = target_info(tpath)
    dcfg = read_config(dpath)
    check_pair(tinfo, dcfg, dpath)
    tok = _tokenizer(tpath)
    check_tokenizer(tok, tinfo)
    case, served_shapes, notes = with_launch(case, tpath)
    cands, cand_notes = candidates_for(case, tinfo, dcfg, dpath)
    shapes, grid_notes = tree_shapes(case)
    shapes = list(dict.fromkeys(shapes + served_shapes))
    notes += grid_notes + cand_notes
    pset = read_prompt_set(resolve_path(case.prompts.file, case, "prompts.file"), case.prompts.limit,
                           case.prompts.categories or None)
    prompts = [(p.id, p.category, tokenize(p, tok)) for p in pset.prompts]
    recorded = None
    if case.prompts.recorded:
        recorded = read_recorded(resolve_path(case.prompts.recorded, case, "prompts.recorded"), tok,
                                 [p.id for p in pset.prompts])
    points = union_points([c.layout for c in cands]) + (point("final"),)
    points = tuple(dict.fromkeys(points))
    t0 = _stopwatch(timings, "checks_s", t0)

    passes, pass_meta = _target_passes(case, tpath, tinfo, tok, prompts, recorded, points, pset.sha256,
                                       progress, use_cache, timings)
    notes += pass_meta.pop("cache_notes")
    t0 = time.perf_counter()
    drafter, dckpt = load_drafter(dpath, dtype=_dtype(case.drafter.dtype, "drafter.dtype", case) or torch.float32)
    drafter.to(_main_device(case))
    embed, head = load_embed_and_head(tpath)
    ev = case.evaluate
    layouts = {c.label: c.layout for c in cands}
    results = replay(drafter, embed, head, passes, _variants(case, cands, shapes), layouts,
                     token_budget=ev.token_budget, progress=progress)
    evals = [summarize(r, buckets=ev.position_buckets, seed=ev.seed, n_boot=ev.bootstrap) for r in results]
    cross = _cross_variants(case, best_layout(evals, case, shapes[0].name), shapes[0])
    if cross:
        results = replay(drafter, embed, head, passes, cross, layouts, token_budget=ev.token_budget,
                         progress=progress)
        evals += [summarize(r, buckets=ev.position_buckets, seed=ev.seed, n_boot=ev.bootstrap) for r in results]
    t0 = _stopwatch(timings, "drafter_s", t0)
    speed = _speedup(case, tpath, drafter, embed, shapes, evals, timings)
    t0 = time.perf_counter()
    regs = regime_section(passes, pass_meta["reference_regime"], evals, best_layout(evals, case, shapes[0].name),
                          shapes[0].name, seed=ev.seed, n_boot=ev.bootstrap)
    dinfo = {"path": str(dpath), "format": dckpt.format, "files": list(dckpt.weight_files),
             "num_aux": drafter.cfg.num_aux, "hidden_size": drafter.cfg.hidden_size,
             "draft_vocab_size": drafter.cfg.draft_vocab_size, "config": _config_digest(dpath)}
    run = RunResult(case, tinfo, dinfo, {"file": pset.path, "sha256": pset.sha256, "count": len(pset.prompts),
                                         "categories": sorted({p.category for p in pset.prompts})},
                    pass_meta, cands, evals, [], timings, notes=notes, speedup=speed, regimes=regs)
    run.verdicts = verdicts(run)
    _stopwatch(timings, "summary_s", t0)
    return run


def _speedup(case, tpath, drafter, embed, shapes, evals, timings) -> dict | None:
    """Price every evaluated shape: the user's costs when given, else measured here."""
    t0 = time.perf_counter()
    costs = user_costs(case.speedup)
    source = "user (case [speedup])"
    if costs is None:
        if not case.speedup.measure:
            return None
        model = _model_for(tpath, _dtype(case.target.dtype, "target.dtype", case), "as-loaded", case)
        costs = measure_costs(model, drafter, embed, [s.num_draft_tokens for s in shapes],
                              context=case.speedup.context)
        source = f"measured by diag on the loaded models (batch 1, context {case.speedup.context})"
        del model
    _stopwatch(timings, "speedup_s", t0)
    return speedup_section([e for e in evals if e["accept_length"] is not None], costs, source)


def _config_digest(path: Path) -> str:
    import hashlib
    return hashlib.sha256((path / "config.json").read_bytes()).hexdigest()[:16]


def _target_passes(case, tpath, tinfo, tok, prompts, recorded, points, prompt_sha, progress, use_cache, timings):
    """One target pass per regime over the same sequences (generated under the reference
    regime, or recorded). Cached on disk by content (pass_cache.py): a cached regime loads
    no target weights at all; an entry that fails its integrity check is recomputed, with a
    note."""
    ev = case.evaluate
    regimes = list(dict.fromkeys([ev.reference_regime, *ev.regimes]))
    dtype = _dtype(case.target.dtype, "target.dtype", case)
    eos, pad = _special_ids(tok)
    tokens_sha = token_digest(prompts, recorded, eos, pad)
    placement = f"gpus={case.placement.gpus}" if case.placement.gpus else "cpu"
    passes, meta, sequences = {}, {"regimes": {}, "cache_notes": []}, None
    for reg in regimes:
        t0 = time.perf_counter()
        ckpt = Path(zoo_or_path(reg[5:])) if reg.startswith("ckpt:") else tpath
        key = PassKey.make(ckpt, tokens_sha, reg, points, case.prompts.max_new_tokens, str(dtype), placement) \
            if use_cache else None
        tp, why = load_pass(key) if use_cache else (None, None)
        if why:
            meta["cache_notes"].append(f"target pass [{reg}]: {why}")
        if tp is None:
            model = _model_for(tpath, dtype, reg, case)
            if sequences is None:
                sequences = _sequences(model, tok, prompts, recorded, case, progress)
            tp = run_capture(model, sequences, points, regime=reg, token_budget=ev.token_budget,
                             progress=progress)
            del model
            if use_cache:
                save_pass(key, tp)
        sequences = tp.sequences
        passes[reg] = tp
        meta["regimes"][reg] = {"cached": tp.cached, "cache_key": key.digest if key else None,
                                "argmax_agreement": tp.agreement_with_sequence(),
                                "seconds": round(time.perf_counter() - t0, 3)}
    seqs = passes[regimes[0]].sequences
    meta.update({"source": "recorded" if recorded is not None else "greedy",
                 "max_new_tokens": case.prompts.max_new_tokens, "sequences": len(seqs),
                 "tokens": int(sum(len(s.ids) for s in seqs)),
                 "continuation_tokens": int(sum(len(s.ids) - s.prompt_len for s in seqs)),
                 "points": [p.name for p in points], "reference_regime": regimes[0]})
    timings["target_s"] = round(sum(m["seconds"] for m in meta["regimes"].values()), 3)
    return passes, meta


def _other_checkpoint(tpath: Path, spec: str, dtype, case):
    other = Path(zoo_or_path(spec))
    mine, theirs = target_info(tpath), target_info(other)
    for key in ("num_layers", "hidden_size", "vocab_size"):
        if getattr(mine, key) != getattr(theirs, key):
            raise DiagError("a ckpt: regime must be the same model in another format", file=str(other),
                            field=key, expected=f"{getattr(mine, key)} (as {tpath})", found=getattr(theirs, key))
    return load_target(other, dtype=dtype, device_map=_device_map(case, other))[0]


def zoo_or_path(spec: str) -> str:
    """`zoo:NAME` -> the built-in checkpoint's folder (built on first use); else spec."""
    if spec.startswith("zoo:"):
        from diag.zoo import zoo_path
        return str(zoo_path(spec[4:]))
    return spec


def _special_ids(tok) -> tuple[set[int], int]:
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    return eos, pad


def _sequences(model, tok, prompts, recorded, case, progress):
    eos, pad = _special_ids(tok)
    return build_sequences(model, prompts, case.prompts.max_new_tokens, pad_id=pad, eos_ids=eos,
                           recorded=recorded, progress=progress)


def _main_device(case: Case) -> torch.device:
    """Where the drafter runs: the first GPU when the case places the target on GPUs."""
    return torch.device("cuda:0" if case.placement.gpus > 0 else "cpu")


def _device_map(case: Case, path: Path):
    from diag.placement import device_map_for
    pl = case.placement
    return device_map_for(path, pl.gpus, pl.gpu_memory, pl.activation_budget,
                          token_budget=case.evaluate.token_budget)


def _model_for(tpath, dtype, regime, case):
    """The target under a regime, placed by the case; "ckpt:PATH" loads another checkpoint
    of the same model."""
    if regime.startswith("ckpt:"):
        return _other_checkpoint(tpath, regime[5:], dtype, case)
    model, _ = load_target(tpath, dtype=dtype, device_map=_device_map(case, tpath))
    if regime != "as-loaded":
        from diag.regime_apply import apply_regime
        from diag.regimes import regime as parse_regime
        apply_regime(model, parse_regime(regime))
    return model
