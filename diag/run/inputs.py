"""Everything a run needs that costs no target weight: paths, configs, widths, vocabularies,
the tokenizer, the serving plan, candidate layouts, tree shapes, prompts and capture points.

Order matters for users: all of it is checked before any target weight is loaded, so a
mistake costs seconds, not a 550 GB load. This module reads configs, headers and prompt
files; it knows nothing about models or reports.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from diag.checkpoint.config import read_config_json, text_config
from diag.checkpoint.headers import tensor_infos
from diag.checkpoint.layers import check_layer_count
from diag.drafter.checkpoint import DrafterCheckpoint, inspect_drafter
from diag.engine.serving import ServingError, capture_convention
from diag.engine.tree_rules import grid, resolve_sglang_shape
from diag.errors import DiagError
from diag.layouts import CapturePoint, point, union_points
from diag.run.candidates import Candidate, candidates_for
from diag.run.case import Case, resolve_path
from diag.run.decodings import DecodingPlan, plan as decoding_plan
from diag.run.prompts import PromptSet, read_prompt_set, read_recorded
from diag.run.rendered import RenderedPrompts, render_prompts
from diag.target.load import TargetInfo, plain_config, target_info
from diag.target.tokenizer import TRUST_FLAG, load_tokenizer
from diag.trees import TreeShape, tree_shape

DTYPES = {"auto": None, "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class Inputs:
    """A case resolved against its checkpoints and prompts, before any weight is read."""

    case: Case                          # with the launch command's algorithm applied
    target_path: Path
    drafter_path: Path
    target: TargetInfo
    target_config: dict
    drafter_config: dict                # flat: speculators' layer config lifted to the top
    drafter: DrafterCheckpoint          # format, options, DrafterConfig, tensor names (headers only)
    tokenizer: object
    candidates: list[Candidate]
    serving_error: ServingError | None
    shapes: list[TreeShape]             # the primary tree first
    prompt_set: PromptSet
    prompts: list[tuple[str, str, list[int]]]     # (id, category, token ids), serving rendering
    recorded: dict[str, list[int]] | None
    points: tuple[CapturePoint, ...]
    capture_convention: str             # the layer-id rule the engine applies to this target
    notes: list[str]
    rendered: RenderedPrompts | None = None     # the prompts under every rendering of the case
    long_prompts: list[tuple[str, str, list[int]]] | None = None   # long_context.py's ladder
    long_source: str | None = None                                 # the text it was cut from
    decoding: DecodingPlan | None = None    # what the server decodes with; sampled decodings to run

    @property
    def regimes(self) -> list[str]:
        """The reference regime first, then the others, each once."""
        ev = self.case.evaluate
        return list(dict.fromkeys([ev.reference_regime, *ev.regimes]))


def zoo_or_path(spec: str) -> str:
    """`zoo:NAME` -> the built-in checkpoint's folder (built on first use); else spec."""
    if spec.startswith("zoo:"):
        from diag.zoo import zoo_path
        return str(zoo_path(spec[4:]))
    return spec


def checkpoint_path(spec: str, case: Case, field_name: str) -> Path:
    return Path(zoo_or_path(resolve_path(spec, case, field_name)))


def dtype_of(name: str, field_name: str, case: Case):
    if name not in DTYPES:
        raise DiagError("unknown dtype", file=case.source, field=field_name,
                        expected=sorted(DTYPES), found=name)
    return DTYPES[name]


def served_dtypes(case: Case, target_config: dict):
    """(target dtype, drafter dtype) as the engine runs them unless the case says otherwise:
    "auto" is the target checkpoint's dtype (config.json `dtype`, older `torch_dtype`; None
    when it names none: the loader's default), and the drafter runs in the target's dtype, as
    vLLM (SpeculativeConfig: the draft model config takes the target's dtype) and SGLang (the
    draft worker shares server_args.dtype) run it. Example: a bf16 target and an fp32 drafter,
    both "auto" -> (bfloat16, bfloat16); drafter.dtype = "float32" -> (bfloat16, float32)."""
    target = dtype_of(case.target.dtype, "target.dtype", case)
    written = target_config.get("dtype") or target_config.get("torch_dtype")
    served = target or (DTYPES.get(written) if isinstance(written, str) else None)
    drafter = dtype_of(case.drafter.dtype, "drafter.dtype", case) or served or torch.float32
    return target, drafter


def check_pair_config(tinfo: TargetInfo, dpath: Path) -> None:
    """The pair's vocabulary and width from the drafter's config.json alone, before its headers
    are read against that config (a wrong vocab_size is the user's mistake to name, not the
    t2d shape it implies). Keys the config lacks are left to inspect_drafter."""
    from diag.checkpoint.drafter_format import flat_config
    where = str(dpath / "config.json")
    try:
        flat = flat_config(read_config_json(dpath, "drafter"), file=where)
    except DiagError:
        return                                   # inspect_drafter names what is wrong
    vocab, width = flat.get("vocab_size"), flat.get("target_hidden_size") or flat.get("hidden_size")
    if isinstance(vocab, int) and vocab != tinfo.vocab_size:
        raise DiagError("drafter and target vocabularies differ", file=where, field="vocab_size",
                        expected=f"{tinfo.vocab_size} (target {tinfo.path}/config.json)", found=vocab)
    if isinstance(width, int) and width != tinfo.hidden_size:
        raise DiagError("drafter was built for another target width", file=where, field="target_hidden_size",
                        expected=f"{tinfo.hidden_size} (target hidden_size)", found=width)


def check_pair(tinfo: TargetInfo, dckpt: DrafterCheckpoint) -> None:
    """Vocabulary and width checks that need only the two configs and the drafter's headers."""
    where, cfg = str(dckpt.path / "config.json"), dckpt.cfg
    if cfg.vocab_size != tinfo.vocab_size:
        raise DiagError("drafter and target vocabularies differ", file=where, field="vocab_size",
                        expected=f"{tinfo.vocab_size} (target {tinfo.path}/config.json)",
                        found=cfg.vocab_size)
    if cfg.target_hidden_size != tinfo.hidden_size:
        raise DiagError("drafter was built for another target width", file=where, field="target_hidden_size",
                        expected=f"{tinfo.hidden_size} (target hidden_size)", found=cfg.target_hidden_size)


def check_tokenizer(tok, tinfo: TargetInfo) -> None:
    if len(tok) > tinfo.vocab_size:
        raise DiagError("tokenizer has more tokens than the target's embedding table",
                        file=f"{tinfo.path}/tokenizer.json", field="vocab",
                        expected=f"<= {tinfo.vocab_size} (config vocab_size)", found=len(tok))


def check_target_files(tpath: Path, tcfg: dict) -> None:
    """Every shard's header (corrupt or truncated files, byte ranges that do not fit their
    shapes), the decoder layers the weights hold against num_hidden_layers, and a config
    the loader can build (diag.target.load.plain_config)."""
    check_layer_count(tensor_infos(tpath), tcfg, file=str(tpath), config_file=str(tpath / "config.json"))
    plain_config(tcfg, str(tpath / "config.json"))        # an unloadable config fails here, not at load


def trusts_remote_code(case: Case) -> bool:
    """[target] trust_remote_code, --trust-remote-code on diag's command line (the same
    field), or --trust-remote-code in the case's SGLang launch command."""
    if case.target.trust_remote_code:
        return True
    if not case.serving.launch:
        return False
    from diag.engine.launch import parse_launch
    return any(flag == TRUST_FLAG for flag, _ in parse_launch(case.serving.launch, case.serving.engine).other)


def tree_shapes(case: Case) -> tuple[list[TreeShape], list[str]]:
    """The case's named shapes, then its sweep grid, each as SGLang runs it
    (diag.engine.tree_rules): s3-k1-d8 runs as chain-3, with a note; a grid point SGLang
    cannot run (D - 1 > K + (S-1)K^2) is left out, with a note. (A named shape SGLang cannot
    run is already an error of the case, diag.run.case_checks.)"""
    shapes, notes = [], []
    for text in case.evaluate.trees:
        asked = tree_shape(text, field="evaluate.trees")
        runs = resolve_sglang_shape(asked.num_steps, asked.topk, asked.num_draft_tokens).shape
        if runs != asked:
            notes.append(f"tree {text}: SGLang runs it as {runs.name} (topk = 1 forces num_draft_tokens "
                         f"= num_steps + 1 = {runs.num_draft_tokens}); evaluated as {runs.name}")
        shapes.append(runs)
    if case.evaluate.tree_grid:
        g = case.evaluate.tree_grid
        more, rewritten = grid(g["num_steps"], g["topk"], g["num_draft_tokens"])
        notes += [f"tree grid: (S={s}, K={k}, D={d}) runs as {shape.name}: SGLang forces "
                  f"num_draft_tokens = num_steps + 1 when topk = 1" for (s, k, d), shape in rewritten]
        for shape in more:
            crash = resolve_sglang_shape(shape.num_steps, shape.topk, shape.num_draft_tokens).crash
            if crash is None:
                shapes.append(shape)
            else:
                notes.append(f"tree grid: {shape.name} left out: SGLang cannot run it ({crash})")
    if not shapes:
        raise DiagError("no tree shape SGLang can run is left to evaluate", file=case.source,
                        field="evaluate.tree_grid", expected="at least one (S, K, D) with "
                        "num_draft_tokens - 1 <= K + (S-1)K^2", found=case.evaluate.tree_grid)
    return list(dict.fromkeys(shapes)), notes


def launch_refusals(case: Case) -> list[str]:
    """What the engine version's own argument parser refuses in the case's launch line
    (diag.engine.flag_parser), as notes: such a line launches no server, so its algorithm
    is not applied either."""
    from diag.engine.flag_parser import flag_problems, table_for
    from diag.engine.launch import server_argv
    from diag.engine.versions import engine
    table = table_for(engine(case.serving.engine).version)
    if table is None:
        return []
    return [f"launch command: SGLang {table.version} would refuse it: {p.message} ({p.behaviour}; {p.fix})"
            for p in flag_problems(server_argv(case.serving.launch), table) if p.severity == "error"]


def with_launch(case: Case, target_config: dict) -> tuple[Case, list[TreeShape], list[str]]:
    """What the case's SGLang launch command really runs (diag.engine.launch): its algorithm
    becomes the serving algorithm, its effective tree joins the shapes, its rewrites and
    crashes become notes."""
    if not case.serving.launch:
        return case, [], []
    from diag.engine.launch import effective_config, parse_launch
    eff = effective_config(parse_launch(case.serving.launch, case.serving.engine), target_config,
                           engine_name=case.serving.engine)
    refused = launch_refusals(case)
    notes = [f"launch command: {n}" for n in eff.notes] + refused
    if eff.crash:
        notes.append(f"launch command: SGLang would crash: {eff.crash}")
    shapes = [eff.tree.shape] if eff.tree is not None and eff.tree.shape is not None else []
    if eff.algorithm and not any("--speculative-algorithm" in n for n in refused):
        case = replace(case, serving=replace(case.serving, algorithm=eff.algorithm))
    return case, shapes, notes


def _prompts(case: Case, tok, tpath: Path):
    pset = read_prompt_set(resolve_path(case.prompts.file, case, "prompts.file"), case.prompts.limit,
                           case.prompts.categories or None)
    rendered = render_prompts(case, tok, pset, str(tpath / "tokenizer_config.json"))
    prompts = rendered.ids[rendered.serving]
    recorded = None
    if case.prompts.recorded:
        recorded = read_recorded(resolve_path(case.prompts.recorded, case, "prompts.recorded"), tok,
                                 [p.id for p in pset.prompts])
    return pset, prompts, recorded, rendered


def long_context_prompts(case: Case, tok, pset: PromptSet, tinfo: TargetInfo, tcfg: dict):
    """The long-context ladder (long_context.py), checked against the target's positions."""
    lc = case.long_context
    if not lc.length:
        return None, None
    from diag.checkpoint.config import text_config
    from diag.run.long_context import ladder, source_text
    limit = text_config(tcfg).get("max_position_embeddings")
    if isinstance(limit, int) and lc.length > limit:
        raise DiagError("long-context length exceeds the target's positions", file=case.source,
                        field="long_context.length",
                        expected=f"<= {limit} (max_position_embeddings of {tinfo.path}/config.json)", found=lc.length)
    text, where = source_text(case, pset)
    return ladder(tok, text, where, length=lc.length, max_new_tokens=case.prompts.max_new_tokens,
                  rungs=lc.rungs, per_rung=lc.per_rung), where


def check_lengths(prompts, recorded, case: Case, tcfg: dict, tinfo: TargetInfo) -> None:
    """Every sequence fits the target: prompt + continuation <= max_position_embeddings (past it
    transformers only warns and the numbers move), recorded ids inside the vocabulary.
    Example: a 300-token prompt with max_new_tokens 64 and max_position_embeddings 256 ->
    DiagError naming the prompt: 364 positions > 256."""
    limit = text_config(tcfg).get("max_position_embeddings")
    src = case.prompts.recorded or case.prompts.file
    for pid, _, ids in prompts:
        cont = recorded[pid][:case.prompts.max_new_tokens] if recorded is not None else None
        if cont is not None and (bad := [t for t in cont if t >= tinfo.vocab_size]):
            raise DiagError("recorded continuation holds token ids outside the target's vocabulary",
                            file=src, field=f"{pid}.token_ids", expected=f"ids < {tinfo.vocab_size} "
                            "(config vocab_size)", found=bad[:5])
        total = len(ids) + (len(cont) if cont is not None else case.prompts.max_new_tokens)
        if isinstance(limit, int) and total > limit:
            raise DiagError("a prompt and its continuation do not fit the target's context", file=src,
                            field=pid, expected=f"prompt + continuation <= max_position_embeddings = "
                            f"{limit} ({tinfo.path}/config.json)",
                            found=f"{len(ids)} prompt tokens + {total - len(ids)} = {total} positions",
                            hint="shorten the prompt, lower max_new_tokens, or drop it from the set")


def prepare(case: Case) -> Inputs:
    """Resolve and check everything that needs no target weight (see the module docstring)."""
    tpath = checkpoint_path(case.target.path, case, "target.path")
    dpath = checkpoint_path(case.drafter.path, case, "drafter.path")
    tinfo = target_info(tpath)
    check_pair_config(tinfo, dpath)
    dckpt = inspect_drafter(dpath)
    dcfg = dckpt.flat
    check_pair(tinfo, dckpt)
    tok = load_tokenizer(tpath, trust_remote_code=trusts_remote_code(case))
    check_tokenizer(tok, tinfo)
    tcfg = read_config_json(tpath, "target")
    check_target_files(tpath, tcfg)
    case, served_shapes, notes = with_launch(case, tcfg)
    cands, cand_notes, serving_error = candidates_for(case, tinfo, dcfg, dpath)
    shapes, grid_notes = tree_shapes(case)
    pset, prompts, recorded, rendered = _prompts(case, tok, tpath)
    check_lengths(prompts, recorded, case, tcfg, tinfo)
    long_prompts, long_source = long_context_prompts(case, tok, pset, tinfo, tcfg)
    points = tuple(dict.fromkeys(union_points([c.layout for c in cands]) + (point("final"),)))
    dplan = _decodings(case, tpath)
    return Inputs(case, tpath, dpath, tinfo, tcfg, dcfg, dckpt, tok, cands, serving_error,
                  list(dict.fromkeys(shapes + served_shapes)), pset, prompts, recorded, points,
                  capture_convention(tcfg, engine_name=case.serving.engine),
                  notes + grid_notes + cand_notes + list(dckpt.notes) + list(pset.notes) + list(dplan.notes),
                  rendered, long_prompts, long_source, dplan)


def _decodings(case: Case, tpath: Path) -> DecodingPlan:
    from diag.engine.launch import parse_launch
    launch = parse_launch(case.serving.launch, case.serving.engine) if case.serving.launch else None
    return decoding_plan(case, tpath, launch)
