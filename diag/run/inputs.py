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
from diag.checkpoint.dtypes import check_header_dtypes, declared_dtype
from diag.checkpoint.headers import tensor_infos
from diag.checkpoint.layers import check_embedding, check_layer_count
from diag.drafter.checkpoint import DrafterCheckpoint, inspect_drafter
from diag.engines import EngineRules, Release, engine, rules
from diag.engines.common import DraftTables, ServingError
from diag.errors import DiagError
from diag.checkpoint.readable import require_readable_tree
from diag.layouts import CapturePoint, point, union_points
from diag.run.candidates import Candidate, candidates_for
from diag.run.case import Case, resolve_path
from diag.run.checkpoints import locate
from diag.run.decodings import DecodingPlan, plan as decoding_plan
from diag.run.prompts import PromptSet, read_prompt_set, read_recorded
from diag.run.rendered import RenderedPrompts, render_prompts
from diag.target import resident
from diag.target.placement import require_bf16, require_gpus, require_split_target
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


def checkpoint_path(spec: str, case: Case, field_name: str) -> Path:
    """zoo:NAME, a local directory or a hub id (diag.run.checkpoints) -> its directory."""
    return locate(spec, case, field_name).path


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


# A tokenizer must produce at least this share of the target's vocabulary. Vocabularies are
# padded for kernels and tensor parallelism: Qwen2.5 has 151,665 tokenizer ids for vocab_size
# 152,064 (99.7%), Phi-2 50,295 for 51,200 (98.2%); a tokenizer of another model covers far
# less (600 of 2048 ids = 29%: its ids would be the wrong tokens). 90% leaves padding room.
MIN_TOKENIZER_COVERAGE = 0.90


def check_tokenizer(tok, tinfo: TargetInfo) -> None:
    if len(tok) > tinfo.vocab_size:
        raise DiagError("tokenizer has more tokens than the target's embedding table",
                        file=f"{tinfo.path}/tokenizer.json", field="vocab",
                        expected=f"<= {tinfo.vocab_size} (config vocab_size)", found=len(tok))
    if len(tok) < MIN_TOKENIZER_COVERAGE * tinfo.vocab_size:
        raise DiagError("the target's tokenizer covers too little of its vocabulary (another model's "
                        "tokenizer?)", file=f"{tinfo.path}/tokenizer.json", field="vocab",
                        expected=f">= {MIN_TOKENIZER_COVERAGE:.0%} of vocab_size {tinfo.vocab_size} = "
                                 f"{int(MIN_TOKENIZER_COVERAGE * tinfo.vocab_size)} ids (a padded vocabulary "
                                 "is normal, a missing one is not)",
                        found=f"{len(tok)} ids ({len(tok) / tinfo.vocab_size:.0%})")


def check_not_drafter(tpath: Path, tcfg: dict, case: Case) -> None:
    """A drafter checkpoint given as the target is named as such."""
    from diag.checkpoint.drafter_format import not_a_drafter
    not_a_drafter(tpath, tcfg, field="--target" if case.source.startswith("<") else "target.path")


def check_target_files(tpath: Path, tcfg: dict) -> None:
    """Every shard's header (corrupt or truncated files, byte ranges that do not fit their
    shapes), the decoder layers the weights hold against num_hidden_layers, and a config
    the loader can build (diag.target.load.plain_config)."""
    infos, cfile = tensor_infos(tpath), str(tpath / "config.json")
    check_header_dtypes(infos, tcfg, what="target", config_file=cfile)
    check_embedding({n: i.shape for n, i in infos.items()}, tcfg, file=str(tpath), config_file=cfile)
    check_layer_count(infos, tcfg, file=str(tpath), config_file=cfile)
    plain_config(tcfg, str(tpath / "config.json"))        # an unloadable config fails here, not at load


def trusts_remote_code(case: Case) -> bool:
    """[target] trust_remote_code, --trust-remote-code on diag's command line (the same
    field), or --trust-remote-code in the case's SGLang launch command."""
    if case.target.trust_remote_code:
        return True
    if not case.serving.launch:
        return False
    rel, eng = served_by(case)
    return any(flag == TRUST_FLAG for flag, _ in eng.parse_launch(case.serving.launch, release=rel).other)


def served_by(case: Case) -> tuple[Release, EngineRules]:
    """The release the case names ([serving] engine) and its family's rules."""
    rel = engine(case.serving.engine)
    return rel, rules(rel)


def draft_tables_by_mode(inp: "Inputs") -> dict[str, DraftTables]:
    """The served engine's draft tables for both drafter modes, "eagle3" and "eagle"."""
    rel, eng = served_by(inp.case)
    return {m: eng.draft_tables(inp.drafter_config, m, release=rel) for m in ("eagle3", "eagle")}


def round_accounting(case: Case) -> str:
    """The round accounting the served release counts (replay/round_accounting.py names it)."""
    rel, eng = served_by(case)
    return eng.round_accounting(rel)


def engine_numerics(inp: "Inputs") -> str:
    """Where the target and the drafter round in reduced precision (target/engine_numerics.py
    names it): as the served release's kernels do (EngineRules.numerics: SGLang "transformers",
    vLLM "fp32-kernels", vLLM-CPU's kernels) where diag can follow them: on CPU (the kernels are
    CPU kernels) and for a target whose decoder apply_numerics follows; else "transformers"
    (numerics_notes says why). float32 computes the same under every name. Example: engine
    "vllm-0.32.0", a LlamaForCausalLM target, gpus 0 -> "fp32-kernels"; gpus 1 -> "transformers"."""
    return _numerics(inp)[0]


def numerics_notes(inp: "Inputs") -> list[str]:
    """The report's note when the served engine's rounding is not reproduced (engine_numerics)."""
    return _numerics(inp)[1]


def _numerics(inp: "Inputs") -> tuple[str, list[str]]:
    from diag.target.engine_numerics import FOLLOWED
    rel, eng = served_by(inp.case)
    served = eng.numerics(rel)
    if served == "transformers":
        return served, []
    arch = (inp.target_config.get("architectures") or ["?"])[0]
    why = ("its kernels are CPU kernels and the case runs on GPUs" if inp.case.placement.gpus else
           f"diag follows them for {', '.join(FOLLOWED)} targets, not {arch}" if arch not in FOLLOWED else None)
    if why is None:
        return served, []
    return "transformers", [f"numerics: {inp.case.serving.engine} rounds bf16/fp16 as {served} ({why}): the target "
                            "and drafter round as transformers does, so near-tie tokens may differ from the server's"]


def sampled_verification(inp: "Inputs") -> str:
    """The sampled verification rule the served release runs (replay/verifiers.py names it)."""
    rel, eng = served_by(inp.case)
    return eng.verification(rel).sampled


def _grid(eng: EngineRules, rel: Release, g: dict) -> tuple[list[TreeShape], list[tuple[tuple, TreeShape]]]:
    """Every (S, K, D) of the sweep grid as the release runs it, de-duplicated in first-seen
    order, and the ((S, K, D) asked, shape run) pairs it rewrites. Example (topk 1 forces
    D = S + 1): S [3], K [1, 4], D [4, 8] -> chain-3, s3-k4-d4, s3-k4-d8; rewritten
    [((3, 1, 8), chain-3)]."""
    shapes: dict[TreeShape, None] = {}
    rewritten: list[tuple[tuple, TreeShape]] = []
    for s in g["num_steps"]:
        for k in g["topk"]:
            for d in g["num_draft_tokens"]:
                shape = eng.resolve_tree(s, k, d, None, release=rel).shape
                if shape.num_draft_tokens != d:
                    rewritten.append(((s, k, d), shape))
                shapes.setdefault(shape, None)
    return list(shapes), rewritten


def tree_shapes(case: Case) -> tuple[list[TreeShape], list[str]]:
    """The case's named shapes, then its sweep grid, each as the case's engine runs it
    (EngineRules.resolve_tree): under SGLang s3-k1-d8 runs as chain-3, with a note; a grid point
    the engine cannot run (D - 1 > K + (S-1)K^2) is left out, with a note. (A named shape it
    cannot run is already an error of the case, diag.run.case_checks.)"""
    shapes, notes = [], []
    rel, eng = served_by(case)
    name = eng.display
    for text in case.evaluate.trees:
        asked = tree_shape(text, field="evaluate.trees")
        runs = eng.resolve_tree(asked.num_steps, asked.topk, asked.num_draft_tokens, None, release=rel).shape
        if runs != asked:
            notes.append(f"tree {text}: {name} runs it as {runs.name} (topk = 1 forces num_draft_tokens "
                         f"= num_steps + 1 = {runs.num_draft_tokens}); evaluated as {runs.name}")
        shapes.append(runs)
    if case.evaluate.tree_grid:
        g = case.evaluate.tree_grid
        more, rewritten = _grid(eng, rel, g)
        notes += [f"tree grid: (S={s}, K={k}, D={d}) runs as {shape.name}: {name} forces "
                  f"num_draft_tokens = num_steps + 1 when topk = 1" for (s, k, d), shape in rewritten]
        for shape in more:
            crash = eng.resolve_tree(shape.num_steps, shape.topk, shape.num_draft_tokens, None, release=rel).crash
            if shape.wasted_steps:
                notes.append(f"tree grid: {shape.name} left out: it verifies {shape.num_draft_tokens - 1} "
                             f"token(s) per round, so {shape.wasted_steps} of its {shape.num_steps} draft steps "
                             "are never verified")
            elif crash is None:
                shapes.append(shape)
            else:
                notes.append(f"tree grid: {shape.name} left out: {name} cannot run it ({crash})")
    if not shapes:
        raise DiagError(f"no tree shape {name} can run is left to evaluate", file=case.source,
                        field="evaluate.tree_grid", expected="at least one (S, K, D) with "
                        "num_draft_tokens - 1 <= K + (S-1)K^2", found=case.evaluate.tree_grid)
    return list(dict.fromkeys(shapes)), notes


def launch_refusals(case: Case) -> list[str]:
    """What the engine version's own argument parser refuses in the case's launch line
    (EngineRules.flag_problems), as notes: such a line launches no server, so its algorithm
    is not applied either."""
    rel, eng = served_by(case)
    return [f"launch command: {p.parser} would refuse it: {p.message} ({p.behaviour}; {p.fix})"
            for p in eng.flag_problems(eng.launch_argv(case.serving.launch), release=rel) if p.severity == "error"]


def with_launch(case: Case, target_config: dict) -> tuple[Case, list[TreeShape], list[str]]:
    """What the case's launch command really runs (EngineRules.effective_config): its algorithm
    becomes the serving algorithm, its effective tree joins the shapes, its rewrites and
    crashes become notes."""
    if not case.serving.launch:
        return case, [], []
    rel, eng = served_by(case)
    eff = eng.effective_config(eng.parse_launch(case.serving.launch, release=rel), target_config, release=rel)
    refused = launch_refusals(case)
    notes = [f"launch command: {n}" for n in eff.notes] + refused
    if eff.crash:
        notes.append(f"launch command: {eng.display} would crash: {eff.crash}")
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
    from diag.diagnoses.hooks import needed
    from diag.diagnoses.protocol import NEEDS_LONG_PROMPTS
    lc = case.long_context
    if not lc.length or NEEDS_LONG_PROMPTS not in needed():
        return None, None
    from diag.checkpoint.config import text_config
    from diag.diagnoses.long_context import ladder, source_text
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
    located = [locate(case.target.path, case, "target.path"), locate(case.drafter.path, case, "drafter.path")]
    tpath, dpath = (loc.path for loc in located)
    require_gpus(case.placement.gpus, file=case.source, gpu_memory=case.placement.gpu_memory)
    require_readable_tree(tpath, "target checkpoint", field="target.path")
    require_readable_tree(dpath, "drafter checkpoint", field="drafter.path")
    tcfg = read_config_json(tpath, "target")
    check_not_drafter(tpath, tcfg, case)
    declared = declared_dtype(tcfg)
    require_bf16(case.placement.gpus, case.target.dtype if case.target.dtype != "auto" else
                 ("bfloat16" if declared and declared[1] == "BF16" else "auto"), file=case.source,
                 field="target.dtype" if case.target.dtype != "auto" else f"{tpath}/config.json {declared and declared[0]}")
    tinfo = target_info(tpath)
    if case.placement.experts == "split":
        require_split_target(tcfg, tinfo.quantization, file=f"{tpath}/config.json")
    check_target_files(tpath, tcfg)         # the target's own files first: a fault there is its own
    check_pair_config(tinfo, dpath)
    dckpt = inspect_drafter(dpath)
    dcfg = dckpt.flat
    check_pair(tinfo, dckpt)
    trust = trusts_remote_code(case)
    tok, _ = resident.part(lambda: resident.PartKey.tokenizer(tpath, trust_remote_code=trust),
                           lambda: load_tokenizer(tpath, trust_remote_code=trust))   # kept under `diag run --watch`
    check_tokenizer(tok, tinfo)
    case, served_shapes, notes = with_launch(case, tcfg)
    notes = [loc.note for loc in located if loc.note] + notes
    cands, cand_notes, serving_error = candidates_for(case, tinfo, dcfg, dpath)
    shapes, grid_notes = tree_shapes(case)
    pset, prompts, recorded, rendered = _prompts(case, tok, tpath)
    check_lengths(prompts, recorded, case, tcfg, tinfo)
    long_prompts, long_source = long_context_prompts(case, tok, pset, tinfo, tcfg)
    points = tuple(dict.fromkeys(union_points([c.layout for c in cands]) + (point("final"),)))
    dplan = _decodings(case, tpath)
    return Inputs(case, tpath, dpath, tinfo, tcfg, dcfg, dckpt, tok, cands, serving_error,
                  list(dict.fromkeys(shapes + served_shapes)), pset, prompts, recorded, points,
                  rules(case.serving.engine).capture_convention(tcfg, release=engine(case.serving.engine)),
                  notes + grid_notes + cand_notes + list(dckpt.notes) + list(pset.notes) + list(dplan.notes),
                  rendered, long_prompts, long_source, dplan)


def _decodings(case: Case, tpath: Path) -> DecodingPlan:
    rel, eng = served_by(case)
    launch = eng.parse_launch(case.serving.launch, release=rel) if case.serving.launch else None
    return decoding_plan(case, tpath, launch)
