"""`diag lint`: static checks of a drafter/target pair and an SGLang launch line.

Reads only config.json files and safetensors *headers* (names, shapes,
dtypes); never a weight value. Each Finding says what is wrong, what SGLang
0.5.23 will do about it (usually: nothing, silently) and how to fix it.
The rules come from diag.serving (what SGLang feeds the drafter),
diag.conventions (layer ids) and diag.launch / diag.trees (flag rewrites).

This module knows files and findings; it knows nothing about running models.
When the optional `sglang` package is importable, `sglang_cross_check` asks
sglang's own ServerArgs for the effective settings and reports disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diag import conventions, serving
from diag.config_json import read_config_json
from diag.errors import DiagError
from diag.launch import EffectiveConfig, LaunchFlags, effective_config, parse_launch, server_argv


@dataclass(frozen=True)
class Finding:
    severity: str          # "error" | "warning" | "info"
    code: str
    message: str
    sglang_behaviour: str
    fix: str
    file: str | None = None
    field: str | None = None


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str             # safetensors dtype name: "I64", "BOOL", "BF16", ...
    file: str


@dataclass(frozen=True)
class _Pair:
    """Everything the checks read."""

    drafter: dict
    target: dict
    tensors: dict[str, TensorInfo]
    drafter_file: str
    target_file: str
    flags: LaunchFlags | None
    eff: EffectiveConfig | None


def read_config(directory: Path) -> dict:
    """directory/config.json as a dict, or a DiagError naming the file."""
    return read_config_json(directory)


def read_tensor_headers(directory: Path) -> dict[str, TensorInfo]:
    """Name -> shape/dtype for every tensor in directory/*.safetensors, from the headers
    alone (diag.int4.shards checks them: a corrupt or truncated shard is an error)."""
    from diag.int4.shards import tensor_infos

    return {name: TensorInfo(tuple(i.shape), i.dtype, str(i.file))
            for name, i in tensor_infos(Path(directory)).items()}


def _find(tensors: dict[str, TensorInfo], suffix: str) -> tuple[str, TensorInfo] | None:
    """'fc.weight' matches 'fc.weight' or 'model.fc.weight' (first, sorted)."""
    for name in sorted(tensors):
        if name == suffix or name.endswith("." + suffix):
            return name, tensors[name]
    return None


def _is_eagle3_drafter(p: _Pair) -> bool:
    archs = p.drafter.get("architectures") or []
    return (any("Eagle3" in a for a in archs) or "eagle_config" in p.drafter
            or _find(p.tensors, "fc.weight") is not None)


def _algorithm(p: _Pair) -> str:
    return (p.eff.algorithm if p.eff is not None and p.eff.algorithm else None) or "EAGLE3"


def _under_eagle3(p: _Pair) -> str:
    """Layout checks describe EAGLE3 serving; say so when the launch uses another algorithm."""
    return "" if _algorithm(p) == "EAGLE3" else " once launched with EAGLE3"


# --- checks --------------------------------------------------------------------

def check_algorithm(p: _Pair) -> list[Finding]:
    if p.flags is None:
        return [Finding("info", "NO_LAUNCH", "no launch command given: algorithm, tree flags and "
                        "max_running_requests not checked; assuming EAGLE3",
                        "n/a", "pass --launch \"python -m sglang.launch_server ...\"")]
    if _algorithm(p) != "EAGLE" or not _is_eagle3_drafter(p):
        return []
    plan = serving.serving_plan(p.drafter, p.target, algorithm="EAGLE")
    h_t = serving.hidden_size(p.target)
    k = len(serving.serving_plan(p.drafter, p.target).layout)
    what = plan.crash or ("the drafter gets the final-normed last hidden state "
                          f"({h_t} wide instead of {k}x{h_t} = {k * h_t}); fc is skipped, the "
                          "target's lm_head replaces the drafter's, d2t is ignored; no warning "
                          "is logged and accept length falls to about 1.00")
    return [Finding("error", "EAGLE_ALGORITHM",
                    f"--speculative-algorithm {p.flags.algorithm} with an EAGLE-3 drafter",
                    what, "launch with --speculative-algorithm EAGLE3", None,
                    "--speculative-algorithm")]


def check_fc_width(p: _Pair) -> list[Finding]:
    hit = _find(p.tensors, "fc.weight")
    if hit is None:
        return []
    name, info = hit
    plan = serving.serving_plan(p.drafter, p.target)
    h_t, h = serving.hidden_size(p.target), serving.hidden_size(p.drafter)
    k = len(plan.layout)
    rows, cols = info.shape[0], info.shape[-1]
    out = []
    if cols != k * h_t:
        out.append(Finding(
            "error", "FC_WIDTH", f"fc input width {cols} != {k} capture points x target hidden "
            f"{h_t} = {k * h_t} ({plan.layout}){_under_eagle3(p)}", f"SGLang concatenates {k} states "
            f"({plan.rule}); loading or the first draft forward fails on the fc shape",
            f"give eagle_config.eagle_aux_hidden_state_layer_ids with {cols // h_t if h_t else '?'} "
            "ids matching training, or retrain fc", info.file, name))
    if rows != h:
        out.append(Finding("error", "FC_ROWS", f"fc output {rows} != drafter hidden_size {h}",
                           "SGLang builds fc with hidden_size outputs; weight loading fails",
                           "fix hidden_size in the drafter config.json", info.file, name))
    return out


def check_top_level_ids(p: _Pair) -> list[Finding]:
    top = serving.top_level_ids(p.drafter, file=p.drafter_file)
    if top is None or serving.nested_ids(p.drafter) is not None:
        return []
    plan = serving.serving_plan(p.drafter, p.target)
    meant = conventions.resolve(top, plan.convention, serving.num_layers(p.target)).layout
    sev = "error" if meant != plan.layout else "warning"
    return [Finding(sev, "TOP_LEVEL_IDS", f"eagle_aux_hidden_state_layer_ids={top} is at the top "
                    "level of the drafter config", f"SGLang reads only eagle_config."
                    f"eagle_aux_hidden_state_layer_ids and falls back to its defaults: serves "
                    f"{plan.layout} (the top-level ids would give {meant})",
                    f'move them: "eagle_config": {{"eagle_aux_hidden_state_layer_ids": {top}}}',
                    p.drafter_file, serving.TOP_IDS_FIELD)]


def _reading(ids: list[int], convention: str, n: int):
    """The layout `convention` reads, or None when it cannot read these ids."""
    try:
        return conventions.resolve(ids, convention, n).layout
    except DiagError:
        return None


def check_deepseek_first_id(p: _Pair) -> list[Finding]:
    ids = serving.nested_ids(p.drafter)
    if ids is None or serving.target_family(p.target) != "deepseek":
        return []
    n = serving.num_layers(p.target)
    served = conventions.resolve(ids, "sglang-deepseek", n).layout
    trained = _reading(ids, "specforge", n) or served
    shifted = ids[0] == 1
    sev = "info" if served == trained else "warning"
    rule = ("the first id is 1, so every id is shifted by +1" if shifted else
            "the first id is not 1, so ids are used as layer inputs without the +1 shift")
    return [Finding(sev, "DEEPSEEK_FIRST_ID", f"DeepSeek-family target: SGLang 0.5.23 reads "
                    f"{ids} as {served}; SpecForge-style output-of-layer ids mean {trained}",
                    f"deepseek_v2.py set_eagle3_layers_to_capture: {rule}",
                    "check which layout the drafter was trained on (diag scan) and write ids "
                    "that SGLang reads as that layout", p.drafter_file, serving.IDS_FIELD)]


def check_layout(p: _Pair) -> list[Finding]:
    n = serving.num_layers(p.target)
    declared = serving.declared_layouts(p.drafter, n, file=p.drafter_file)
    if not declared:
        return []
    plan, trained = serving.serving_plan(p.drafter, p.target), declared[0]
    if plan.layout == trained.layout:
        return []
    ids = conventions.to_ids(trained.layout, plan.convention, n)
    fix = (f"set eagle_config.eagle_aux_hidden_state_layer_ids to {ids}" if ids is not None else
           f"SGLang ({plan.convention}) cannot capture {trained.layout}: retrain on a layout it "
           "can serve")
    return [Finding("error", "LAYOUT_MISMATCH", f"drafter trained on {trained.layout} "
                    f"({trained.source}), SGLang serves {plan.layout}{_under_eagle3(p)}",
                    plan.rule, fix,
                    p.drafter_file, trained.source)]


def _vocab_findings(p: _Pair, draft_vocab: int, vocab: int) -> list[Finding]:
    out = []
    expect = {"lm_head.weight": (0, draft_vocab, "draft_vocab_size"),
              "d2t": (0, draft_vocab, "draft_vocab_size"), "t2d": (0, vocab, "vocab_size")}
    for key, (dim, want, label) in expect.items():
        hit = _find(p.tensors, key)
        if hit is not None and hit[1].shape[dim] != want:
            out.append(Finding("error", "VOCAB_SHAPE", f"{key} has {hit[1].shape[dim]} rows, "
                               f"{label} is {want}", "weight loading fails or draft ids map to "
                               "the wrong target tokens", f"make {key} and {label} agree",
                               hit[1].file, hit[0]))
    if draft_vocab < vocab and _find(p.tensors, "d2t") is None:
        out.append(Finding("error", "D2T_MISSING", f"draft_vocab_size {draft_vocab} < vocab_size "
                           f"{vocab} but the checkpoint has no d2t", "SGLang has no hot-token map: "
                           "draft ids are taken as target ids and almost never accepted",
                           "save the d2t tensor from training", p.drafter_file, "d2t"))
    return out


def check_vocab(p: _Pair) -> list[Finding]:
    text = serving.text_config(p.target)
    vocab, target_vocab = p.drafter.get("vocab_size"), text.get("vocab_size")
    draft_vocab = p.drafter.get("draft_vocab_size") or vocab
    out = []
    if isinstance(vocab, int) and isinstance(target_vocab, int) and vocab != target_vocab:
        out.append(Finding("error", "TARGET_VOCAB", f"drafter vocab_size {vocab} != target "
                           f"vocab_size {target_vocab}", "the target's embedding table is "
                           "shared with the drafter; token ids beyond either table fail",
                           "set the drafter's vocab_size to the target's", p.drafter_file,
                           "vocab_size"))
    for key, dtype in (("d2t", "I64"), ("t2d", "BOOL")):
        hit = _find(p.tensors, key)
        if hit is not None and hit[1].dtype != dtype:
            out.append(Finding("warning", "VOCAB_DTYPE", f"{key} is {hit[1].dtype}, expected "
                               f"{dtype}", "SGLang uses d2t as integer offsets",
                               f"save {key} as {dtype}", hit[1].file, hit[0]))
    if isinstance(vocab, int) and isinstance(draft_vocab, int):
        out += _vocab_findings(p, draft_vocab, vocab)
    return out


def check_hidden(p: _Pair) -> list[Finding]:
    h_t, h = serving.hidden_size(p.target), serving.hidden_size(p.drafter)
    declared = p.drafter.get("target_hidden_size")
    if declared is not None and declared != h_t:
        return [Finding("error", "TARGET_HIDDEN_SIZE", f"target_hidden_size {declared} != "
                        f"target hidden_size {h_t}", "fc is built for the wrong width; loading "
                        "or the first draft forward fails", f"set target_hidden_size to {h_t}",
                        p.drafter_file, "target_hidden_size")]
    if h == h_t:
        return []
    if declared is None:
        return [Finding("error", "HIDDEN_SIZE", f"drafter hidden {h} != target hidden {h_t} and "
                        "no target_hidden_size", "SGLang assumes target width = drafter width: fc "
                        "is built for the wrong input and the target's embeddings replace the "
                        "drafter's", f"add \"target_hidden_size\": {h_t}", p.drafter_file,
                        "hidden_size")]
    if _find(p.tensors, "embed_tokens.weight") is None:
        return [Finding("error", "EMBED_MISSING", f"drafter hidden {h} != target hidden {h_t} "
                        "but the checkpoint has no embed_tokens", "SGLang keeps the drafter's own "
                        "embedding when widths differ; it stays uninitialised",
                        "save embed_tokens.weight with the drafter", p.drafter_file,
                        "embed_tokens.weight")]
    return []


def _rope(cfg: dict) -> tuple[object, object, object]:
    """(theta, scaling without theta, max positions); transformers 5 keeps
    theta inside rope_parameters."""
    c = serving.text_config(cfg)
    params = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    theta = c.get("rope_theta", params.pop("rope_theta", None))
    params.pop("rope_theta", None)
    kind = params.get("rope_type", params.get("type", "default"))
    return theta, (kind, tuple(sorted((k, str(v)) for k, v in params.items()
                                      if k not in ("rope_type", "type")))), \
        c.get("max_position_embeddings")


def check_rope(p: _Pair) -> list[Finding]:
    (dt, ds, dm), (tt, ts, tm) = _rope(p.drafter), _rope(p.target)
    own = "SGLang applies the drafter's own RoPE settings to draft positions"
    out = []
    if dt is not None and tt is not None and float(dt) != float(tt):
        out.append(Finding("warning", "ROPE_THETA", f"drafter rope_theta {dt} != target {tt}",
                           own, "confirm the drafter was trained with this theta",
                           p.drafter_file, "rope_theta"))
    if ds != ts:
        out.append(Finding("warning", "ROPE_SCALING", f"drafter RoPE scaling {ds[0]} != target "
                           f"{ts[0]} ({ds[1]} vs {ts[1]})", own, "copy the scaling the drafter "
                           "was trained with", p.drafter_file, "rope_scaling"))
    if isinstance(dm, int) and isinstance(tm, int) and dm < tm:
        out.append(Finding("warning", "MAX_POSITIONS", f"drafter max_position_embeddings {dm} < "
                           f"target {tm}", "requests longer than the drafter's range run its "
                           "RoPE outside what it was configured for", "raise the drafter's "
                           "max_position_embeddings (and scaling) to the serving context",
                           p.drafter_file, "max_position_embeddings"))
    return out


def check_tree(p: _Pair) -> list[Finding]:
    if p.eff is None or p.eff.tree is None:
        return []
    tree, flag = p.eff.tree, "--speculative-num-draft-tokens"
    if tree.crash is not None:
        return [Finding("error", "TREE_CRASH", f"tree flags {tree.requested} (S, K, D) fail",
                        tree.crash, "pass all three flags with D - 1 <= K + (S-1)K^2, or none",
                        None, flag)]
    sev = "warning" if tree.requested != (None, None, None) else "info"
    shape = tree.shape
    fix = (f"to verify more than {shape.num_draft_tokens - 1} draft token(s) per round use "
           f"topk > 1 (a tree) or more steps; otherwise pass num_draft_tokens = "
           f"{shape.num_steps + 1} so the flags say what runs" if sev == "warning" else
           "pass all three tree flags to pin the shape")
    return [Finding(sev, "TREE_REWRITE" if sev == "warning" else "TREE_AUTO", note,
                    f"SGLang runs {shape.name} (S={shape.num_steps}, K={shape.topk}, "
                    f"D={shape.num_draft_tokens})", fix, None, flag) for note in tree.notes]


def check_max_running(p: _Pair) -> list[Finding]:
    if p.eff is None or p.eff.tree is None or p.flags.max_running_requests is not None:
        return []
    return [Finding("warning", "MAX_RUNNING_REQUESTS", "--max-running-requests not given in "
                    "speculative mode", " ".join(n for n in p.eff.notes if "max-running" in n
                                                 or "DP workers" in n),
                    "pass --max-running-requests sized for your load", None,
                    "--max-running-requests")]


CHECKS = (check_algorithm, check_fc_width, check_top_level_ids, check_deepseek_first_id,
          check_layout, check_vocab, check_hidden, check_rope, check_tree, check_max_running)


def compare_with_sglang(eff: EffectiveConfig, resolved: dict) -> list[Finding]:
    """Findings for every setting where sglang's own ServerArgs differs from diag's."""
    shape = eff.tree.shape if eff.tree is not None else None
    ours = {"speculative_algorithm": eff.algorithm,
            "speculative_num_steps": shape and shape.num_steps,
            "speculative_eagle_topk": shape and shape.topk,
            "speculative_num_draft_tokens": shape and shape.num_draft_tokens,
            "max_running_requests": eff.max_running_requests}
    return [Finding("warning", "SGLANG_DISAGREES", f"{key}: diag says {ours[key]!r}, sglang's "
                    f"ServerArgs says {resolved[key]!r}", "sglang's own value is what runs",
                    "report this to diag; trust sglang's value", None, key)
            for key in ours if key in resolved and resolved[key] != ours[key]]


def sglang_cross_check(eff: EffectiveConfig, argv: list[str]) -> list[Finding]:
    """Resolve the launch with sglang's ServerArgs when sglang is importable."""
    try:
        from sglang.srt.server_args import prepare_server_args
    except ImportError:
        return [Finding("info", "SGLANG_UNAVAILABLE", "sglang is not installed: diag's own "
                        "mirror of SGLang 0.5.23's rules was used, not cross-checked",
                        "n/a", "pip install 'diag[sglang]' to cross-check")]
    try:
        args = prepare_server_args(argv)
    except Exception as exc:  # sglang raises many kinds; each is reported, none hidden
        return [Finding("info", "SGLANG_CROSS_CHECK_FAILED", f"sglang's ServerArgs could not "
                        f"resolve the launch: {type(exc).__name__}: {exc}", "n/a",
                        "run lint where the model paths exist")]
    keys = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens", "max_running_requests")
    return compare_with_sglang(eff, {k: getattr(args, k, None) for k in keys})


def _run_check(check, pair: _Pair) -> list[Finding]:
    """A DiagError inside a check (ids SGLang cannot capture, a config field
    of the wrong type) is itself an error finding."""
    try:
        return check(pair)
    except DiagError as err:
        return [Finding("error", "CONFIG", err.message, "SGLang fails on or misreads this field",
                        err.hint or f"expected: {err.expected}", err.file or pair.drafter_file,
                        err.field)]


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: dict[tuple[str, str], Finding] = {}
    for f in findings:
        seen.setdefault((f.code, f.message), f)
    return list(seen.values())


def lint(drafter_dir: str | Path, target_dir: str | Path, launch: str | None) -> list[Finding]:
    """Every finding for this drafter, target and (optional) launch line."""
    drafter, target = read_config(Path(drafter_dir)), read_config(Path(target_dir))
    flags = parse_launch(launch) if launch else None
    eff = effective_config(flags, target) if flags is not None else None
    pair = _Pair(drafter, target, read_tensor_headers(Path(drafter_dir)),
                 str(Path(drafter_dir) / "config.json"), str(Path(target_dir) / "config.json"),
                 flags, eff)
    out = _dedupe([f for check in CHECKS for f in _run_check(check, pair)])
    if not pair.tensors:
        out.append(Finding("warning", "NO_WEIGHTS", "no *.safetensors in the drafter directory",
                           "n/a", "save the drafter as safetensors", str(drafter_dir)))
    if eff is not None:
        out += sglang_cross_check(eff, server_argv(launch))
    return out
