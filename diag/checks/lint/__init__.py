"""`diag lint`: static checks of a drafter/target pair and a server's launch line.

Reads only config.json files and safetensors *headers* (names, shapes, dtypes); never a
weight value. Each Finding says what is wrong, what the selected engine release will do
about it (usually: nothing, silently) and how to fix it. The rules come from diag.engines;
the checks live beside this module by subject: drafter.py (format, architecture, weights,
what a config-only directory leaves unchecked), layout.py (ids, fc, algorithm), vocab.py
(vocabularies, widths), tables.py (embedding / lm_head swaps, use_aux_hidden_state), rope.py
(positions), launch.py (tree flags, request cap), flags.py (every word against the release's own
argparse), then the engine's own cross-check (EngineRules.cross_check: SGLang's asks an
installed sglang). Every finding names the engine version whose rules it applies (`--engine`).

This package knows files and findings; it knows nothing about running models.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from diag.checkpoint.config import read_config_json
from diag.checks.lint.flags import check_flags
from diag.checkpoint.drafter_format import flat_config, not_a_drafter
from diag.checks.lint.drafter import (check_engine_class, check_format, check_torchspec_ids, check_weights,
                                      config_only)
from diag.checks.lint.launch import check_max_running, check_tree
from diag.checks.lint.layout import (check_algorithm, check_deepseek_first_id, check_fc_width,
                                     check_layout, check_serving, check_top_level_ids)
from diag.checks.lint.pair import Finding, Pair, read_tensor_headers
from diag.checks.lint.rope import check_rope
from diag.checks.lint.tables import check_tables
from diag.checks.lint.vocab import check_hidden, check_vocab
from diag.engines import DEFAULT_ENGINE, engine as engine_of, rules
from diag.engines.common import refused
from diag.errors import DiagError

__all__ = ["Finding", "lint", "read_tensor_headers", "CHECKS"]

CHECKS = (check_format, check_engine_class, check_weights, config_only, check_serving, check_algorithm,
          check_fc_width, check_top_level_ids, check_deepseek_first_id, check_torchspec_ids, check_layout,
          check_vocab, check_hidden, check_rope, check_tree, check_max_running, check_tables, check_flags)


def _run_check(check, pair: Pair) -> list[Finding]:
    """A DiagError inside a check (ids SGLang cannot capture, a config field
    of the wrong type) is itself an error finding."""
    try:
        return check(pair)
    except DiagError as err:
        return [Finding("error", "CONFIG", err.message, f"{rules(pair.engine).display} fails on or misreads this field",
                        err.hint or f"expected: {err.expected}", err.file or pair.drafter_file,
                        err.field)]


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: dict[tuple[str, str], Finding] = {}
    for f in findings:
        seen.setdefault((f.code, f.message), f)
    return list(seen.values())


def _launch_flags(launch: str | None, engine: str):
    """The launch line's flags, or ([], an error finding) when SGLang could not parse it
    (the flag check still reports every word)."""
    if not launch:
        return None, []
    try:
        return rules(engine).parse_launch(launch, release=engine_of(engine)), []
    except DiagError as err:
        return None, [Finding("error", "LAUNCH_UNPARSABLE", f"{err.message}: {err.found}",
                              f"{rules(engine).display}'s argparse exits at launch", f"expected: {err.expected}", None,
                              err.field)]


def _headers_or_none(directory: Path):
    """Tensor headers, or {} for a config-only directory (users lint before downloading)."""
    return read_tensor_headers(directory) if list(directory.glob("*.safetensors")) else {}


def lint(drafter_dir: str | Path, target_dir: str | Path, launch: str | None, *,
         engine: str = DEFAULT_ENGINE) -> list[Finding]:
    """Every finding for this drafter, target and (optional) launch line, each naming the
    engine version whose rules it applies."""
    rel = engine_of(engine)
    engine, eng = rel.name, rules(rel)
    raw = read_config_json(Path(drafter_dir), "drafter")
    target = read_config_json(Path(target_dir), "target")
    not_a_drafter(target_dir, target, field="--target")
    try:
        drafter = flat_config(raw)
    except DiagError:                      # check_format reports it
        drafter = raw
    argv = tuple(eng.launch_argv(launch)) if launch else None
    flags, unreadable = _launch_flags(launch, engine)
    eff = eng.effective_config(flags, target, release=rel) if flags is not None else None
    graphs = not (flags is not None and flags.disable_cuda_graph)
    pair = Pair(drafter, target, _headers_or_none(Path(drafter_dir)),
                str(Path(drafter_dir) / "config.json"), str(Path(target_dir) / "config.json"),
                flags, eff, engine,
                refused(eng.serving_plan(drafter, target, release=rel, cuda_graph=graphs)),
                refused(eng.serving_plan(drafter, target, release=rel, algorithm="EAGLE")), argv=argv,
                raw_drafter=raw)
    out = _dedupe(unreadable + [f for check in CHECKS for f in _run_check(check, pair)])
    if eff is not None:
        out += [Finding(x.severity, x.code, x.message, x.behaviour, x.fix, None, x.flag or None)
                for x in eng.cross_check(eff, eng.launch_argv(launch))]
    return [f if f.engine else replace(f, engine=engine) for f in out]
