"""Case files: TOML parsed with tomllib into frozen dataclasses, validated with clear errors.

A case names what to load (target, drafter), what to replay (prompts), and what to compare
(layouts, serving modes, tree shapes, regimes). Reading checks keys and types; `check_case`
checks values, once, after the command line's overrides. Paths may be `zoo:NAME` (a built-in tiny
checkpoint), `${ENV_VAR}`-expanded, and are resolved relative to the case file. Parsing
never loads weights: `diag validate CASE` is this module plus layout / tree / regime parsing.

Example (cases/demo.toml):
    version = 1
    name = "demo"
    [target]
    path = "zoo:llama-tiny"
    [drafter]
    path = "zoo:llama-tiny-eagle3-embed-vllm-ids"
    [prompts]
    file = "prompts/mixed-48.jsonl"
    max_new_tokens = 64
    [evaluate]
    layouts = ["embed+L2+L4", "L1+L3+L5"]
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from diag.engines import DEFAULT_ENGINE, engine
from diag.errors import DiagError
from diag.checkpoint.readable import require_readable

CASE_VERSION = 1


@dataclass(frozen=True)
class ModelSpec:
    path: str
    dtype: str = "auto"
    trust_remote_code: bool = False   # [target] only: run the tokenizer's own code (Kimi's tiktoken)


@dataclass(frozen=True)
class PromptSpec:
    file: str
    max_new_tokens: int = 64
    limit: int | None = None
    categories: tuple[str, ...] = ()
    recorded: str | None = None


@dataclass(frozen=True)
class EvaluateSpec:
    layouts: tuple[str, ...] = ()
    scan: bool = False
    modes: tuple[str, ...] = ("eagle3",)
    trees: tuple[str, ...] = ("chain-3",)
    tree_grid: dict | None = None     # {num_steps = [..], topk = [..], num_draft_tokens = [..]}
    regimes: tuple[str, ...] = ("as-loaded",)
    reference_regime: str = "as-loaded"
    cross_regimes: bool = False
    seed: int = 0
    token_budget: int = 16384
    position_buckets: tuple[int, ...] = (0, 64, 128, 256, 512, 1024, 4096)
    bootstrap: int = 2000


@dataclass(frozen=True)
class ServingSpec:
    engine: str = DEFAULT_ENGINE     # "sglang-0.5.X" (or "0.5.X"); the registry, diag.engines, knows which
    engines: tuple[str, ...] = ()    # several engines compared from one target pass; engine is the first
    algorithm: str = "EAGLE3"
    layout: str | None = None
    launch: str | None = None


@dataclass(frozen=True)
class SpeedupSpec:
    """Step costs for the speedup model: measured on the loaded models (measure = true), or
    the user's own, e.g. from their server: t_decode_ms, t_draft_ms, t_verify_ms = {"4" = 21.5}."""
    measure: bool = True
    context: int = 128
    t_decode_ms: float | None = None
    t_draft_ms: float | None = None
    t_verify_ms: dict | None = None


@dataclass(frozen=True)
class ServerSpec:
    """What the live server emitted, to reconcile diag's candidates with (diag/diagnoses/live_serving/reconcile.py):
    its files (log, /generate responses, /server_info, vLLM /metrics), the release that wrote
    them (default: [serving] engine), and the rates the user measured at the same concurrency:
    baseline_tokens_per_second (no speculation) and tokens_per_second (speculative; default: the
    log's mean gen throughput) at accept_length (default: the log's) on tree (default: the log's
    server_args)."""
    engine: str | None = None
    log: str | None = None
    baseline_log: str | None = None
    responses: str | None = None
    server_info: str | None = None
    vllm_metrics: str | None = None
    baseline_tokens_per_second: float | None = None
    tokens_per_second: float | None = None
    accept_length: float | None = None
    tree: str | None = None
    concurrency: int | None = None
    max_running_requests: int | None = None
    sampled: dict | None = None      # {"0.01" = "metrics-t0.01.txt"}: runs at T > 0, the engine-sanity check


@dataclass(frozen=True)
class DecodingSpec:
    """What the server's requests decode with (DESIGN.md §11; resolved in run/decodings.py).
    temperature / top_p / top_k: one value or a list (a sweep: every combination; the first
    is what the server runs); omitted ones come from the target's generation_config.json, then
    SGLang's defaults. Thresholds: --speculative-accept-threshold-single / -acc (default: the
    launch command's, else 1.0). seeds: sampled runs per prompt. scope: "verdicts" (every
    layout on the first tree, the best layout on every tree) or "all". served: "auto", "greedy"
    or a decoding name."""
    temperature: tuple[float, ...] = ()
    top_p: tuple[float, ...] = ()
    top_k: tuple[int, ...] = ()
    threshold_single: float | None = None
    threshold_acc: float | None = None
    seeds: int = 3
    scope: str = "verdicts"
    served: str = "auto"


@dataclass(frozen=True)
class PlacementSpec:
    gpus: int = 0
    gpu_memory: str | None = None
    activation_budget: str | None = None
    microbatches: int = 1          # parts of each greedy-generation batch, through the GPUs at once
    experts: str = "layer"         # "layer": routed experts with their layer; "split": each layer's over all GPUs


@dataclass(frozen=True)
class RenderingSpec:
    """How prompts become token ids (diag/run/rendering.py names them): the rendering the
    server applies (the run's reference), the one the drafter was trained with, others to
    compare; template files by name (e.g. train = "templates/train.jinja")."""
    serving: str = "auto"
    trained: str | None = None
    renderings: tuple[str, ...] = ()
    templates: dict | None = None
    system_prompt: str | None = None


@dataclass(frozen=True)
class LongContextSpec:
    """Acceptance against position (diag/diagnoses/long_context.py, which checks it): prompts of
    graded lengths up to `length` tokens, built from the prompt set's texts or from a text `file`."""
    length: int = 0                   # 0: off
    file: str | None = None
    rungs: int = 8
    per_rung: int = 2


@dataclass(frozen=True)
class Case:
    version: int
    name: str
    source: str                 # the file it came from ("<flags>" for command-line cases)
    target: ModelSpec
    drafter: ModelSpec
    prompts: PromptSpec
    evaluate: EvaluateSpec = field(default_factory=EvaluateSpec)
    serving: ServingSpec = field(default_factory=ServingSpec)
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    speedup: SpeedupSpec = field(default_factory=SpeedupSpec)
    server: ServerSpec = field(default_factory=ServerSpec)
    rendering: RenderingSpec = field(default_factory=RenderingSpec)
    long_context: LongContextSpec = field(default_factory=LongContextSpec)
    decoding: DecodingSpec = field(default_factory=DecodingSpec)
    description: str = ""


_SECTIONS = {"target": ModelSpec, "drafter": ModelSpec, "prompts": PromptSpec,
             "evaluate": EvaluateSpec, "serving": ServingSpec, "placement": PlacementSpec,
             "speedup": SpeedupSpec, "server": ServerSpec, "rendering": RenderingSpec,
             "long_context": LongContextSpec, "decoding": DecodingSpec}
_SWEEPS = {"decoding": ("temperature", "top_p", "top_k")}   # keys that take one value or a list
_TOP = {"version", "name", "description", *_SECTIONS}


def _typed(value, annotation: str, where: str, key: str):
    """Check one TOML value against a dataclass field annotation (string form)."""
    ok = {"str": isinstance(value, str), "int": isinstance(value, int) and not isinstance(value, bool),
          "bool": isinstance(value, bool), "dict": isinstance(value, dict),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool)}
    base = annotation.replace(" | None", "")
    if base.startswith("tuple["):
        inner = base[6:].split(",")[0].strip()
        if not isinstance(value, list) or not all(_typed_ok(v, inner) for v in value):
            raise DiagError("case value has the wrong type", file=where, field=key,
                            expected=f"a list of {inner}", found=repr(value))
        return tuple(value)
    if not ok.get(base, True):
        raise DiagError("case value has the wrong type", file=where, field=key, expected=base, found=repr(value))
    return value


def _typed_ok(v, inner: str) -> bool:
    return {"str": isinstance(v, str), "int": isinstance(v, int) and not isinstance(v, bool),
            "float": isinstance(v, (int, float)) and not isinstance(v, bool)}.get(inner, True)


def _section(cls, data: dict, where: str, name: str):
    if not isinstance(data, dict):
        raise DiagError("case section must be a table", file=where, field=name,
                        expected=f"[{name}]", found=repr(data))
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise DiagError("unknown key in case file", file=where, field=f"{name}.{unknown[0]}",
                        expected=f"one of {sorted(known)}", found=unknown[0])
    kwargs = {k: _typed(v, str(known[k].type), where, f"{name}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as err:
        missing = re.findall(r"'(\w+)'", str(err))
        raise DiagError("case section lacks a required key", file=where,
                        field=f"{name}.{missing[0] if missing else '?'}", expected="present",
                        found="missing") from err


def with_fields(case: Case, sections: dict, where: str) -> Case:
    """The case with some sections' keys replaced, each value typed as in a case file:
    {"evaluate": {"trees": ["chain-3"]}, "decoding": {"temperature": 1.0}} (a sweep key takes one
    value or a list). An unknown section or key, or a value of the wrong type, is an error naming
    it, `where` saying who asked; the values themselves are check_case's."""
    out = {}
    for name, values in sections.items():
        if name not in _SECTIONS:
            raise DiagError("unknown case section", file=where, field=name,
                            expected=f"one of {sorted(_SECTIONS)}", found=name)
        if not isinstance(values, dict):
            raise DiagError("case section must be a table", file=where, field=name,
                            expected="a dict of its keys", found=repr(values))
        known = {f.name: f for f in fields(_SECTIONS[name])}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise DiagError("unknown key in case file", file=where, field=f"{name}.{unknown[0]}",
                            expected=f"one of {sorted(known)}", found=unknown[0])
        sweep = _SWEEPS.get(name, ())
        typed = {k: _typed([v] if k in sweep and not isinstance(v, list) else v, str(known[k].type), where,
                           f"{name}.{k}") for k, v in values.items()}
        out[name] = replace(getattr(case, name), **typed)
    return replace(case, **out)


def parse_case(data: dict, source: str) -> Case:
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise DiagError("unknown key in case file", file=source, field=unknown[0],
                        expected=f"one of {sorted(_TOP)}", found=unknown[0])
    version = data.get("version")
    if version != CASE_VERSION:
        raise DiagError("unsupported case version", file=source, field="version",
                        expected=CASE_VERSION, found=repr(version))
    for required in ("name", "target", "drafter", "prompts"):
        if required not in data:
            raise DiagError("case file lacks a required key", file=source, field=required,
                            expected="present", found="missing")
    serving = data.get("serving")
    if isinstance(serving, dict) and isinstance(serving.get("engine"), list):     # engine = [a, b]: engines
        data = {**data, "serving": {**{k: v for k, v in serving.items() if k != "engine"},
                                    "engines": [*serving["engine"], *serving.get("engines", [])]}}
    for name, keys in _SWEEPS.items():
        if isinstance(data.get(name), dict):
            data = {**data, name: {k: [v] if k in keys and not isinstance(v, list) else v
                                   for k, v in data[name].items()}}
    sections = {k: _section(cls, data[k], source, k) for k, cls in _SECTIONS.items() if k in data}
    case = Case(version=version, name=str(data["name"]), source=source,
                description=str(data.get("description", "")), **sections)
    if case.serving.engines:                         # [serving] engine, when also given, is served first
        named = "engine" in data.get("serving", {})
        return with_engine(case, [*([case.serving.engine] if named else []), *case.serving.engines])
    return with_engine(case, case.serving.engine)     # values: check_case, after the overrides


def _canonical(case: Case, name: str, field_name: str) -> str:
    try:
        return engine(name).name
    except DiagError as err:
        raise DiagError(err.message, file=case.source, field=field_name, expected=err.expected,
                        found=err.found, hint=err.hint) from err


def with_engine(case: Case, name: str | list[str] | tuple[str, ...] | None) -> Case:
    """The case with its serving engine named canonically ("0.5.10" -> "sglang-0.5.10"); an
    unknown version is a DiagError listing the known ones, raised before anything loads.
    Several names (`--engine sglang-0.5.23 --engine vllm-0.32.0`, `[serving] engines`) compare
    those engines from one target pass: the first is the served one, `engines` lists them all;
    one name leaves `engines` empty, so a single-engine case is unchanged."""
    if name is None or (not isinstance(name, str) and not name):
        return case
    if isinstance(name, str):
        return replace(case, serving=replace(case.serving, engine=_canonical(case, name, "serving.engine"), engines=()))
    names = tuple(dict.fromkeys(_canonical(case, n, "serving.engines") for n in name))
    return replace(case, serving=replace(case.serving, engine=names[0], engines=names if len(names) > 1 else ()))


def _in_file(fn, text: str, field_name: str, src: str):
    """Run a parser; a DiagError it raises gains the case file's name."""
    try:
        return fn(text, field=field_name)
    except DiagError as err:
        raise DiagError(err.message, file=src, field=err.field, expected=err.expected,
                        found=err.found) from err


def check_case(case: Case) -> Case:
    """Every value check of a case, run once after all overrides: a case file, then the command
    line (`diag run case.toml --layout embed+L3+L31` completes a case without layouts), then
    whatever else overrides it. The one home of case value rules; returns the case unchanged."""
    _check_values(case)
    return case


def _check_values(case: Case) -> None:
    from diag.layouts import layout
    from diag.run.case_checks import check_case_values
    from diag.trees import tree_shape
    ev, src = case.evaluate, case.source
    for text in ev.layouts:
        _in_file(layout, text, "evaluate.layouts", src)
    for text in ev.trees:
        _in_file(tree_shape, text, "evaluate.trees", src)
    if ev.tree_grid is not None:
        keys = {"num_steps", "topk", "num_draft_tokens"}
        bad = set(ev.tree_grid) ^ keys
        if bad or not all(isinstance(v, list) and v and all(isinstance(x, int) and x >= 1 for x in v)
                          for v in ev.tree_grid.values()):
            raise DiagError("malformed tree grid", file=src, field="evaluate.tree_grid",
                            expected="{num_steps = [..], topk = [..], num_draft_tokens = [..]} of positive ints",
                            found=ev.tree_grid)
    if case.serving.layout:
        _in_file(layout, case.serving.layout, "serving.layout", src)
    if not ev.layouts and not ev.scan:
        raise DiagError("the case names no layout to evaluate", file=src, field="evaluate.layouts",
                        expected="at least one layout, or scan = true", found="[]")
    for mode in ev.modes:
        if mode not in ("eagle3", "eagle"):
            raise DiagError("unknown serving mode", file=src, field="evaluate.modes",
                            expected="eagle3 or eagle", found=mode)
    if case.drafter.trust_remote_code:
        raise DiagError("trust_remote_code belongs to the target (its tokenizer)", file=src,
                        field="drafter.trust_remote_code", expected="[target] trust_remote_code = true",
                        found=True)
    if case.prompts.max_new_tokens < 2:
        raise DiagError("max_new_tokens too small to verify anything", file=src,
                        field="prompts.max_new_tokens", expected=">= 2", found=case.prompts.max_new_tokens)
    sp = case.speedup
    given = [sp.t_decode_ms, sp.t_draft_ms, sp.t_verify_ms]
    if any(g is not None for g in given) and not all(g is not None for g in given):
        raise DiagError("user step costs need all three", file=src, field="speedup",
                        expected="t_decode_ms, t_draft_ms and t_verify_ms together",
                        found={k: v for k, v in zip(("t_decode_ms", "t_draft_ms", "t_verify_ms"), given)})
    check_rendering(case)
    from diag.diagnoses import DIAGNOSES        # each diagnosis checks its own section
    for d in DIAGNOSES:
        d.check_case(case)
    _check_decoding(case.decoding, src)
    if ev.token_budget < 64:
        raise DiagError("token budget too small", file=src, field="evaluate.token_budget",
                        expected=">= 64", found=ev.token_budget)
    check_case_values(case)          # ranges, trees SGLang refuses, regime names
    if all(g is not None for g in given):
        from diag.run.case_checks import check_user_costs
        check_user_costs(sp, src)    # across values: after each value's own range check


def check_rendering(case: Case) -> None:
    from diag.run.rendering import check_template_name, parse
    spec, src = case.rendering, case.source
    templates = spec.templates or {}
    for name, path in templates.items():
        _in_file(lambda t, field: check_template_name(t, field=field), name, f"rendering.templates.{name}", src)
        if not isinstance(path, str):
            raise DiagError("a template must be a file path", file=src, field=f"rendering.templates.{name}",
                            expected="a path string", found=repr(path))
    for key, text in [("serving", spec.serving), ("trained", spec.trained)] + \
            [("renderings", r) for r in spec.renderings]:
        if text is not None:
            _in_file(lambda t, field: parse(t, tuple(templates), field=field), text, f"rendering.{key}", src)


def _check_decoding(dec: DecodingSpec, src: str) -> None:
    """Every sweep value and threshold in range (diag.engines.decoding), before anything loads."""
    from diag.engines.decoding import check, parse_decoding
    names = {k: f"decoding.{k}" for k in ("temperature", "top_p", "top_k", "threshold_single", "threshold_acc")}
    for t in dec.temperature or (1.0,):
        for p in dec.top_p or (1.0,):
            for k in dec.top_k or (-1,):
                check(t, p, k, 1.0 if dec.threshold_single is None else dec.threshold_single,
                      1.0 if dec.threshold_acc is None else dec.threshold_acc, names=names, file=src)
    if dec.seeds < 1:
        raise DiagError("decoding needs at least one seed", file=src, field="decoding.seeds", expected=">= 1",
                        found=dec.seeds)
    if dec.scope not in ("verdicts", "all"):
        raise DiagError("unknown decoding scope", file=src, field="decoding.scope", expected="verdicts or all",
                        found=dec.scope)
    if dec.served != "auto":
        _in_file(parse_decoding, dec.served, "decoding.served", src)


def read_case(path: str | Path) -> Case:
    """A case file parsed (keys, types, version); its values are checked by check_case once
    every override is applied."""
    path = Path(path)
    if not path.is_file():
        raise DiagError("case file not found", file=str(path), expected="a TOML case file", found="no such file")
    require_readable(path, "case file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise DiagError("case file is not valid TOML", file=str(path), expected="TOML", found=str(err)) from err
    return parse_case(data, str(path))


_ENV = re.compile(r"\$\{(\w+)\}")


def expand_env(spec: str, case: Case, field_name: str) -> str:
    """`${VAR}` expanded; an unset one is an error naming the case's key."""
    def expand(m):
        if m.group(1) not in os.environ:
            raise DiagError("case path uses an unset environment variable", file=case.source,
                            field=field_name, expected=f"${{{m.group(1)}}} set", found="unset")
        return os.environ[m.group(1)]
    return _ENV.sub(expand, spec)


def resolve_path(spec: str, case: Case, field_name: str) -> str:
    """`zoo:NAME` stays symbolic (the zoo resolves it); `${VAR}` and a leading `~` expand;
    relative paths are taken from the case file's folder. (A hub id is told from a path by
    run/checkpoints.py.)"""
    text = expand_env(spec, case, field_name)
    text = os.path.expanduser(text) if text.startswith("~") else text
    if text.startswith("zoo:") or Path(text).is_absolute() or case.source.startswith("<"):
        return text
    return str((Path(case.source).parent / text).resolve())
