"""Lint checks of what the drafter is: its format, architecture and options (from config.json),
its weights against that architecture (from the safetensors headers, when downloaded), whether
the selected engine has a class for it, and what a config-only directory leaves unchecked.

Each check takes the Pair (pair.py) and returns Findings; none reads a weight value.
"""

from __future__ import annotations

from diag.checkpoint.drafter_format import canonical_names, detect, trainer_marks
from diag.checkpoint.headers import TensorInfo as HeaderInfo
from diag.checks.lint.pair import Finding, Pair
from diag.engines import engine, rules

NOT_CHECKED = ("fc.weight's width against the layout", "d2t / t2d presence, dtypes and shapes",
               "lm_head rows against draft_vocab_size", "embed_tokens", "every weight name and shape "
               "against the drafter's architecture")


def check_format(p: Pair) -> list[Finding]:
    """What the drafter is, as info; a DiagError from detection becomes an error (_run_check)."""
    fmt = detect(p.raw_drafter, p.tensors.keys() if p.tensors else None, file=p.drafter_file)
    o = fmt.options
    flags = [k for k in ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual", "qk_norm")
             if getattr(o, k)]
    rel = engine(p.engine)
    head = ("its own lm_head" if o.lm_head == "drafter" else
            f"no head: {rel.label} cannot build it without a draft_vocab_size key (see CONFIG)"
            if rules(rel).drafter_support(p.raw_drafter, release=rel).head_crash else
            "the target's lm_head over the full vocabulary (draft_vocab_size null or absent)")
    return [Finding("info", "DRAFTER_FORMAT", f"{fmt.architecture}: {fmt.format} format, {fmt.attention} "
                    f"attention, {fmt.variant}{' (' + ', '.join(flags) + ')' if flags else ''}, scores with "
                    f"{head}; trainer {fmt.trainer}", "n/a", "n/a", p.drafter_file, "architectures")]


def check_engine_class(p: Pair) -> list[Finding]:
    fmt = detect(p.raw_drafter, None, file=p.drafter_file)
    rel = engine(p.engine)
    support = rules(rel).drafter_support(p.raw_drafter, release=rel)
    if support.builds is None:
        return [Finding("info", "DRAFTER_CLASS_NOT_CHECKED", f"whether {rel.label} builds {fmt.architecture} is "
                        f"not checked: diag has not read {rel.display}'s model registry", "n/a",
                        "check the server's startup log for the draft model's class", p.drafter_file,
                        "architectures")]
    if support.builds:
        return []
    return [Finding("error", "UNSERVABLE_DRAFTER", f"{rel.label} has no model class for {fmt.architecture}",
                    f"the server refuses the draft model at startup (its EAGLE-3 classes are "
                    f"{' and '.join(support.classes)})", support.class_fix,
                    p.drafter_file, "architectures")]


def check_weights(p: Pair) -> list[Finding]:
    """Every tensor name, shape and dtype against the architecture, from the headers."""
    if not p.tensors:
        return []
    from pathlib import Path

    from diag.checkpoint.drafter_format import flat_config
    from diag.drafter.checkpoint import check_tensors
    from diag.drafter.config import drafter_config

    fmt = detect(p.raw_drafter, p.tensors.keys(), file=p.drafter_file)
    names = canonical_names(p.tensors, fmt.attention, file=p.drafter_file)
    found = {names[k]: HeaderInfo(k, Path(t.file), t.dtype, tuple(t.shape)) for k, t in p.tensors.items()}
    fc = found.get("fc.weight")
    cfg = drafter_config(flat_config(p.raw_drafter), fmt, fc.shape if fc else None, file=p.drafter_file)
    check_tensors(found, cfg, next(iter(p.tensors.values())).file)
    return []


def check_torchspec_ids(p: Pair) -> list[Finding]:
    if trainer_marks(p.raw_drafter) != "torchspec":
        return []
    return [Finding("info", "TORCHSPEC_IDS", "TorchSpec config: its layer ids are the serving engine's "
                    "own, so diag takes the layout the engine serves as the trained one",
                    "TorchSpec trains on states an engine captured; its export for engines that read ids as "
                    "layer inputs (tools/convert_to_hf.py, kimi_k2 targets) shifts every id by +1",
                    f"if this config was exported that way, give {rules(p.engine).display} the ids TorchSpec "
                    "trained with; `diag run` scans the neighbours to tell",
                    p.drafter_file, "eagle_config.eagle_aux_hidden_state_layer_ids")]


def config_only(p: Pair) -> list[Finding]:
    if p.tensors:
        return []
    return [Finding("info", "NO_WEIGHTS", "no *.safetensors in the drafter directory: checked config.json "
                    "only; not checked: " + "; ".join(NOT_CHECKED), "n/a",
                    "run lint again once the drafter's weights are downloaded (the target's weights are "
                    "never read)", p.drafter_file)]
