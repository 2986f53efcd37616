"""Checking a case without loading weights: every name parses, every file it can see exists,
and every check `diag run` makes before loading (diag.run.inputs.prepare: headers, dtypes,
tokenizer, renderings, prompt lengths, placement, the server's files) passes, so `validate`
says OK only to a case `run` would start on this machine.

Paths behind unset environment variables are reported, not failed: a case for a cluster
(cases/kimi-k2.5-int4.toml) validates on a laptop; so is a zoo checkpoint not built yet (it
is not built for a validate). A hub id (org/name[@revision]) brings only its JSON files
(diag.run.checkpoints, configs_only). This module reads configs and headers only; it never
loads a tensor.
"""

from __future__ import annotations

import re
from pathlib import Path

from diag.run.case import Case, check_case, resolve_path
from diag.errors import DiagError
from diag.layouts import layout
from diag.run.prompts import read_prompt_set
from diag.trees import tree_shape


def _path_line(spec: str, case: Case, field: str) -> str:
    unset = [v for v in re.findall(r"\$\{(\w+)\}", spec) if v not in __import__("os").environ]
    if unset:
        return f"{field}: {spec} (environment variable {', '.join(unset)} unset; resolved at run time)"
    text = resolve_path(spec, case, field)
    if text.startswith("zoo:"):
        from diag.zoo import ZOO
        if text[4:] not in ZOO:
            raise DiagError("unknown zoo checkpoint", file=case.source, field=field,
                            expected=f"one of {sorted(ZOO)}", found=text)
        return f"{field}: {text} (built-in tiny checkpoint)"
    from diag.run.checkpoints import locate
    located = locate(spec, case, field, configs_only=True)      # a hub id: its JSON files only
    if located.resolved is not None:
        return located.note
    text = str(located.path)
    if not (Path(text) / "config.json").is_file():
        raise DiagError("checkpoint directory has no config.json", file=case.source, field=field,
                        expected=f"{text}/config.json", found="missing")
    return f"{field}: {text}"


def validate_case(case: Case) -> list[str]:
    check_case(case)
    lines = [f"case {case.name!r} (version {case.version}) from {case.source}"]
    lines.append(_path_line(case.target.path, case, "target.path"))
    lines.append(_path_line(case.drafter.path, case, "drafter.path"))
    for text in case.evaluate.layouts:
        layout(text, field="evaluate.layouts")
    for text in case.evaluate.trees:
        tree_shape(text, field="evaluate.trees")
    if case.serving.layout:
        layout(case.serving.layout, field="serving.layout")
    _regimes(case)
    pset = read_prompt_set(resolve_path(case.prompts.file, case, "prompts.file"), case.prompts.limit,
                           case.prompts.categories or None)
    lines.append(f"prompts: {len(pset.prompts)} from {pset.path} (hash {pset.sha256})")
    lines.append(f"layouts: {', '.join(case.evaluate.layouts) or '(scan)'}; modes: {', '.join(case.evaluate.modes)}; "
                 f"trees: {', '.join(case.evaluate.trees)}; regimes: {', '.join(case.evaluate.regimes)}")
    why_not = _not_here(case)
    if why_not is not None:
        return lines + [f"checks before loading: not run ({why_not})"] + _diagnoses(case, [p.id for p in pset.prompts])
    from diag.run.inputs import prepare
    inp = prepare(case)
    lines.append(f"checks before loading: passed ({len(inp.prompts)} prompts rendered, {len(inp.candidates)} "
                 f"candidate layout(s), placement {'cpu' if not case.placement.gpus else f'{case.placement.gpus} GPU(s)'})")
    return lines + _diagnoses(inp.case, [p[0] for p in inp.prompts], inp.target_config)


def _not_here(case: Case) -> str | None:
    """Why the checks `run` makes before loading cannot run here, or None: a path behind an
    unset variable, a zoo entry not built yet, or a hub id whose weights are not downloaded."""
    from diag.run.checkpoints import locate
    from diag.zoo import is_built
    for spec, field in ((case.target.path, "target.path"), (case.drafter.path, "drafter.path")):
        if any(v not in __import__("os").environ for v in re.findall(r"\$\{(\w+)\}", spec)):
            return f"{spec} names an unset environment variable"
        if spec.startswith("zoo:"):
            if not is_built(spec[4:]):
                return f"{spec} is not built yet"
            continue
        try:
            locate(spec, case, field)            # a hub id: its complete snapshot, as run needs it
        except DiagError as err:
            return f"{spec}: {err.message}; only its JSON files were read"
    return None


def _diagnoses(case: Case, prompt_ids: list[str], target_config: dict | None = None) -> list[str]:
    """Each registered diagnosis's own input files (the live server's), read as `diag run` reads them."""
    from diag.diagnoses.hooks import validate_lines_all
    return validate_lines_all(case, prompt_ids, target_config)


def _regimes(case: Case) -> None:
    from diag.target.regimes import regime
    for text in (*case.evaluate.regimes, case.evaluate.reference_regime):
        if text.startswith("ckpt:"):
            _path_line(text[5:], case, "evaluate.regimes")
        else:
            regime(text)
