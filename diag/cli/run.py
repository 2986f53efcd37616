"""`diag run [CASE]` and `diag validate CASE`: the command-line edge of a replay.

With no argument, `diag run` runs the built-in demo case (cases/demo.toml), building the
zoo's tiny checkpoints when needed. With --target/--drafter it builds a case from flags.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from diag.cli import prompt_flags
from diag.cli.paths import PATH_DESTS
from diag.errors import DiagError
from diag.engines import DEFAULT_ENGINE, families
from diag.run.case import (Case, DecodingSpec, EvaluateSpec, ModelSpec, PromptSpec, ServingSpec, check_case,
                           read_case, with_engine)

from diag.run.shipped import DEFAULT_PROMPTS, DEMO, shipped
from diag.target.placement import EXPERTS


def register(sub) -> None:
    p = sub.add_parser("run", help="replay prompts and compare the drafter with the target")
    p.add_argument("case", nargs="?", help=f"case file (default: {DEMO} unless --target/--drafter given)")
    p.add_argument("--target", help="target checkpoint directory, zoo:NAME or hub id org/name[@revision]")
    p.add_argument("--drafter", help="EAGLE-3 drafter checkpoint directory, zoo:NAME or hub id org/name[@revision]")
    p.add_argument("--layout", action="append", default=[], help="layout to evaluate, e.g. embed+L3+L31 (repeat)")
    p.add_argument("--tree", action="append", default=[], help="tree shape, e.g. chain-3 or s3-k4-d5 (repeat)")
    p.add_argument("--mode", action="append", default=[], choices=["eagle3", "eagle"], help="serving mode (repeat)")
    p.add_argument("--regime", action="append", default=[], help="quantization regime (repeat)")
    p.add_argument("--prompts", help=f"JSONL prompt set (default {DEFAULT_PROMPTS})")
    p.add_argument("--limit", type=int, help="use only the first N prompts")
    p.add_argument("--max-new-tokens", type=int, help="continuation length")
    p.add_argument("--recorded", help="JSONL recorded continuations instead of greedy generation")
    p.add_argument("--scan", action="store_true", help="also evaluate every neighbouring layout")
    p.add_argument("--algorithm", help="--speculative-algorithm the server runs (EAGLE3, EAGLE, NEXTN)")
    p.add_argument("--serving-layout", help="the layout the server feeds, if known")
    p.add_argument("--launch", help="the server's launch command line, to report what it really runs")
    p.add_argument("--engine", action="append", default=None,
                   help=f"the engine release the server runs, <family>-<version> (families: {', '.join(families())}; "
                        f"e.g. {DEFAULT_ENGINE}); repeat it to compare engines from one target pass, the first the "
                        "served one "
                        "(default: the case's [serving] engine, else the newest known)")
    p.add_argument("--gpus", type=int, help="place the target across N GPUs (0: CPU)")
    p.add_argument("--gpu-memory", help="memory budget per GPU for weights, e.g. 130GiB")
    p.add_argument("--experts", choices=EXPERTS,
                   help="routed experts with their layer (default) or each layer's split over all the GPUs "
                        "(expert parallelism: every GPU reads its share of each layer at once)")
    p.add_argument("--temperature", action="append", type=float, default=[],
                   help="sampled decoding the server runs (repeat for a sweep; the first is served)")
    p.add_argument("--top-p", action="append", type=float, default=[], help="top-p of sampled decoding (repeat)")
    p.add_argument("--top-k", action="append", type=int, default=[], help="top-k of sampled decoding, -1 = all (repeat)")
    p.add_argument("--speculative-accept-threshold-single", type=float, dest="threshold_single",
                   help="the server's flag (default 1.0); below 1 verification is lossy")
    p.add_argument("--speculative-accept-threshold-acc", type=float, dest="threshold_acc",
                   help="the server's flag (default 1.0); below 1 verification is lossy")
    p.add_argument("--seeds", type=int, help="sampled runs per prompt (default 3)")
    p.add_argument("--sampled-scope", choices=["verdicts", "all"],
                   help="which variants run under sampling (default verdicts)")
    p.add_argument("--out", help="report directory (default reports/<case name>)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the target tokenizer's own code (Kimi's tiktoken tokenizer); off by default")
    p.add_argument("--no-cache", action="store_true", help="recompute the target pass")
    p.add_argument("--nproc", type=int, help="spread the prompts over N local processes, each with its own copy "
                   "of the target (under torchrun the world is torchrun's); one report, from rank 0")
    p.add_argument("--rank-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a rank silent this long (no heartbeat) is taken as dead and the run stops (default 300)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--strict", action="store_true", help="exit 1 when a verdict is an error")
    p.add_argument("--watch", action="store_true",
                   help="after the report, run again each time the case file (or its prompts) changes, the "
                        "target kept loaded (Ctrl-C ends)")
    p.add_argument("--keep-targets", type=int, default=1, metavar="N",
                   help="with --watch: models kept loaded between runs, one per regime (default 1)")
    _server_flags(g := p.add_argument_group("the live server (reconcile with what it emitted; case [server])"))
    g.add_argument("--server", metavar="URL", help="probe this live server first (diag probe, into OUT-server/), "
                   "then reconcile with its answers")
    prompt_flags.register(p)
    p.set_defaults(func=run)
    v = sub.add_parser("validate", help="check a case file without loading weights")
    v.add_argument("case")
    v.set_defaults(func=validate)


SERVER_FLAGS = {   # flag -> (ServerSpec field, type, help)
    "--server-log": ("log", str, "the speculative server's scheduler log (Decode batch lines)"),
    "--server-baseline-log": ("baseline_log", str, "the log of the same server without speculation"),
    "--server-responses": ("responses", str, "saved /generate responses (JSON Lines, rid = prompt id)"),
    "--server-info": ("server_info", str, "saved GET /server_info body"),
    # the case key [server] vllm_metrics, which users write: a field name, kept
    "--server-metrics": ("vllm_metrics", str, "saved GET /metrics (spec-decode counters), of an engine "
                         "that exports them"),
    "--server-engine": ("engine", str, f"the engine release that wrote the files, e.g. {DEFAULT_ENGINE}"),
    "--server-baseline-tps": ("baseline_tokens_per_second", float, "plain decoding tok/s"),
    "--server-tps": ("tokens_per_second", float, "speculative tok/s (default: the log's gen throughput)"),
    "--server-accept-length": ("accept_length", float, "accept length of that speculative run"),
    "--server-tree": ("tree", str, "the tree that run used, e.g. s3-k4-d5 (default: from the files)"),
    "--server-concurrency": ("concurrency", int, "concurrent requests the users send"),
}


def _server_flags(g) -> None:
    for flag, (name, typ, text) in SERVER_FLAGS.items():
        g.add_argument(flag, dest=f"server_{name}", type=typ, help=text,
                       metavar="FILE" if f"server_{name}" in PATH_DESTS else typ.__name__.upper())


def _server_overrides(server, a):
    """--server-* flags over the case's [server]; paths from the command line are taken from the
    working directory."""
    changes = {}
    for name, _, _ in SERVER_FLAGS.values():
        v = getattr(a, f"server_{name}", None)
        if v is not None:
            changes[name] = str(Path(v).resolve()) if f"server_{name}" in PATH_DESTS else v
    return replace(server, **changes)


def case_from_flags(a) -> Case:
    if not (a.target and a.drafter):
        raise SystemExit("diag run: --target and --drafter go together (or give a case file)")
    prompts = PromptSpec(file=a.prompts or str(shipped(DEFAULT_PROMPTS).resolve()),
                         max_new_tokens=64 if a.max_new_tokens is None else a.max_new_tokens, limit=a.limit,
                         recorded=a.recorded)
    ev = EvaluateSpec(layouts=tuple(a.layout), scan=a.scan or not a.layout, modes=tuple(a.mode) or ("eagle3",),
                      trees=tuple(a.tree) or ("chain-3",), regimes=tuple(a.regime) or ("as-loaded",))
    serving = ServingSpec(algorithm=a.algorithm or "EAGLE3", layout=a.serving_layout, launch=a.launch)
    return Case(version=1, name=Path(a.drafter.removeprefix("zoo:").split("@")[0]).name or "run", source="<flags>",
                target=ModelSpec(a.target), drafter=ModelSpec(a.drafter), prompts=prompts, evaluate=ev,
                serving=serving)


FLAG_NAMES = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k",
              "threshold_single": "--speculative-accept-threshold-single",
              "threshold_acc": "--speculative-accept-threshold-acc"}


def decoding_overrides(dec: DecodingSpec, a) -> DecodingSpec:
    """--temperature / --top-p / --top-k / thresholds / --seeds over the case's [decoding],
    each value checked with the flag's name before anything loads."""
    from diag.engines.decoding import check
    ts, ta = getattr(a, "threshold_single", None), getattr(a, "threshold_acc", None)
    for t in getattr(a, "temperature", None) or [1.0]:
        for p in getattr(a, "top_p", None) or [1.0]:
            for k in getattr(a, "top_k", None) or [-1]:
                check(t, p, k, 1.0 if ts is None else ts, 1.0 if ta is None else ta, names=FLAG_NAMES)
    seeds = getattr(a, "seeds", None)
    if seeds is not None and seeds < 1:
        raise DiagError("decoding needs at least one seed", field="--seeds", expected=">= 1", found=seeds)
    return replace(dec, temperature=tuple(getattr(a, "temperature", None) or dec.temperature),
                   top_p=tuple(getattr(a, "top_p", None) or dec.top_p),
                   top_k=tuple(getattr(a, "top_k", None) or dec.top_k),
                   threshold_single=dec.threshold_single if ts is None else ts,
                   threshold_acc=dec.threshold_acc if ta is None else ta,
                   seeds=dec.seeds if seeds is None else seeds,
                   scope=getattr(a, "sampled_scope", None) or dec.scope)


def apply_overrides(case: Case, a) -> Case:
    """Command-line flags given alongside a case file (or a flags case) override its values."""
    ev, pr, sv, pl = case.evaluate, case.prompts, case.serving, case.placement
    pl = replace(pl, gpus=a.gpus if a.gpus is not None else pl.gpus, gpu_memory=a.gpu_memory or pl.gpu_memory,
                 experts=getattr(a, "experts", None) or pl.experts)
    ev = replace(ev, layouts=tuple(a.layout) or ev.layouts, trees=tuple(a.tree) or ev.trees,
                 modes=tuple(a.mode) or ev.modes, regimes=tuple(a.regime) or ev.regimes, scan=a.scan or ev.scan)
    pr = replace(pr, limit=a.limit if a.limit is not None else pr.limit,
                 max_new_tokens=pr.max_new_tokens if a.max_new_tokens is None else a.max_new_tokens,
                 recorded=a.recorded or pr.recorded)
    sv = replace(sv, algorithm=a.algorithm or sv.algorithm, layout=a.serving_layout or sv.layout,
                 launch=a.launch or sv.launch)
    target = replace(case.target, trust_remote_code=case.target.trust_remote_code or getattr(a, "trust_remote_code", False))
    return with_engine(prompt_flags.apply(replace(case, target=target, evaluate=ev, prompts=pr, serving=sv,
                                                  placement=pl, server=_server_overrides(case.server, a),
                                                  decoding=decoding_overrides(case.decoding, a)), a),
                       getattr(a, "engine", None))


# case field -> the flag that sets it, so an error in a value given on the command line names the flag
_FLAG_OF = {"prompts.max_new_tokens": "--max-new-tokens", "prompts.limit": "--limit",
            "prompts.recorded": "--recorded", "placement.gpus": "--gpus", "evaluate.trees": "--tree",
            "evaluate.layouts": "--layout", "evaluate.modes": "--mode", "evaluate.regimes": "--regime",
            "serving.layout": "--serving-layout", "serving.algorithm": "--algorithm",
            "placement.gpu_memory": "--gpu-memory", "placement.experts": "--experts", **prompt_flags.FLAG_OF}


def checked(case: Case, a) -> Case:
    """The case's value checks after the overrides; an error names the flag when one set it."""
    try:
        return check_case(case)
    except DiagError as err:
        flag = _FLAG_OF.get(err.field or "")
        given = getattr(a, (flag or "--").lstrip("-").replace("-", "_"), None)
        if flag is None or given is None or given == []:
            raise
        raise DiagError(err.message, file=err.file, field=f"{flag} ({err.field})", expected=err.expected,
                        found=err.found, hint=err.hint) from err


def case_of(a) -> Case:
    """The case the flags ask for: a case file (the demo's when none) or --target/--drafter,
    with the command line's overrides, checked."""
    if a.target or a.drafter:
        case = apply_overrides(case_from_flags(a), a)
    else:
        case = apply_overrides(read_case(a.case or shipped(DEMO)), a)
    case = checked(case, a)
    from diag.target.placement import require_gpus
    require_gpus(case.placement.gpus, file=case.source, gpu_memory=case.placement.gpu_memory,
                 field="--gpus (placement.gpus)" if a.gpus is not None else "placement.gpus",
                 memory_field="--gpu-memory (placement.gpu_memory)" if a.gpu_memory else "placement.gpu_memory")
    return case


def out_of(a, case: Case) -> Path:
    return Path(a.out) if a.out else Path("reports") / case.name


def report(a, run_result) -> int:
    """Write the run's report, print its summary; the exit code (--strict: 1 on an error verdict)."""
    from diag.report.terminal import summary_table
    from diag.report.writer import write_report

    path, rep = write_report(run_result, out_of(a, run_result.case), argv=["diag", *sys.argv[1:]])
    print(summary_table(rep))
    print(f"\nreport: {path / 'report.md'}  (json: {path / 'report.json'})")
    return 1 if a.strict and any(v["severity"] == "error" for v in rep["verdicts"]) else 0


def _checked_out(a, case: Case) -> Case:
    from diag.report.outdir import check_out_dir
    check_out_dir(out_of(a, case))
    return case


def run(a) -> int:
    from diag.run.pipeline import run_case
    from diag.checkpoint.cache_dir import check_cache_dir

    if getattr(a, "watch", False):
        from diag.cli.watch import check_watch
        check_watch(a)
    case = _checked_out(a, case_of(a))  # the report directory checked before any weight is loaded
    _launch(a)                          # a world that cannot be: before the probe, before any load
    if getattr(a, "server", None):
        from diag.cli.probe import probe_for_run
        case = probe_for_run(case, a, out_of(a, case))
    if not a.no_cache:
        check_cache_dir()
    if getattr(a, "watch", False):
        from diag.cli.watch import watch
        return watch(case, lambda: _checked_out(a, case_of(a)), lambda c: report(
            a, run_case(c, progress=not a.quiet, use_cache=not a.no_cache)), keep=a.keep_targets)
    launch = _launch(a)
    if launch is None:
        run_result = run_case(case, progress=not a.quiet, use_cache=not a.no_cache)
    else:
        from diag.run.distributed import run_distributed
        run_result = run_distributed(launch, case, progress=not a.quiet, use_cache=not a.no_cache,
                                     stale_s=a.rank_timeout)
    if run_result is None:
        return 0                        # a rank other than 0: rank 0 writes the one report
    return report(a, run_result)


def _launch(a):
    """The distributed world of this run (run/distributed.py), or None for one process."""
    import os
    from diag.run.distributed import launch_of
    launch = launch_of(getattr(a, "nproc", None), dict(os.environ))
    if launch is not None and getattr(a, "server", None):
        raise DiagError("--server probes the live server from one process; a distributed run reads saved answers",
                        field="--server", expected="no --server with --nproc or torchrun",
                        found=a.server, hint="run `diag probe CASE --server URL` first, then the distributed "
                                             "run with the case's [server] files on every node")
    if launch is not None and (a.rank_timeout is None or a.rank_timeout <= 0):
        raise DiagError("--rank-timeout must be positive", field="--rank-timeout", expected="> 0 seconds",
                        found=a.rank_timeout)
    return launch


def validate(a) -> int:
    from diag.checks.validate import validate_case
    for line in validate_case(read_case(a.case)):
        print(line)
    print(f"{a.case}: OK")
    return 0


def main_parser() -> argparse.ArgumentParser:  # used by tests that drive one command
    parser = argparse.ArgumentParser(prog="diag")
    register(parser.add_subparsers(dest="command", required=True))
    return parser
