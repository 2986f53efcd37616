"""`diag bench gpu|cpu|render|combine`: the command-line edge of diag.bench."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

WORKDIR_KIND = "diag-bench-workdir"


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure diag's speed and memory on this machine")
    p.add_argument("where", choices=["gpu", "cpu", "render", "combine"],
                   help="which benchmark (or render JSON to markdown; combine: GPU results of one device, "
                        "the sections of several runs, the extrapolation over them)")
    p.add_argument("--out", help="result JSON (default reports/bench/<where>.json); render: markdown file "
                                 "(default reports/bench/summary.md, rewritten from the given JSON files only)")
    p.add_argument("--workdir", help="where the Kimi-shaped checkpoint is written (default: a temp dir)")
    p.add_argument("--max-layers", type=int, default=61, help="gpu: grow the target to at most this many layers")
    p.add_argument("--layers", type=int, help="gpu: layers of the Kimi-shaped checkpoint on disk (default: what the disk holds)")
    p.add_argument("--sections", help="gpu: comma-separated subset of load,e2e,experts,pass,sampled,grown,drafter,naive,accept; "
                   "cpu: of target,drafter,naive,sampled,load,e2e,zoo (e2e: first, cached and one-more-layout runs; "
                   "zoo: the whole zoo built into an empty cache, "
                   "about 5 minutes; not in the default set)")
    p.add_argument("--e2e-prompts", type=int, help="gpu e2e: use the first N prompts (default all 48)")
    p.add_argument("--e2e-new-tokens", type=int, default=512, help="gpu e2e: max_new_tokens")
    p.add_argument("--e2e-evaluate", action="append", default=[], metavar="KEY=JSON",
                   help="gpu e2e: override an [evaluate] field (repeat)")
    p.add_argument("--e2e-decoding", action="append", default=[], metavar="KEY=JSON",
                   help="e2e: a [decoding] field, e.g. temperature=[1.0] top_p=[0.95] seeds=1 (repeat); "
                        "a sampled decoding is drafted by the bench pair's drafter trained on the run's prompts")
    p.add_argument("--e2e-sampled", action="store_true",
                   help="e2e: evaluate T=1.0 top-p 0.95 beside greedy (Kimi's served decoding; "
                        "= --e2e-decoding temperature=[1.0] --e2e-decoding top_p=[0.95])")
    p.add_argument("--tile-budget", type=float, default=120.0, help="gpu: seconds spent trying kernel tiles")
    p.add_argument("--routing", choices=["auto", "torch"], default="auto",
                   help="gpu: a MoE layer's routing: auto (the Triton kernel where the routing section timed it "
                        "faster on this device) or torch (the torch ops everywhere, the other arm of an A/B on the "
                        "same machine; both ways are timed either way)")
    p.add_argument("--sampled-trees", help="gpu sampled: comma-separated tree shapes to run (default all six, "
                                           "chain-1 .. s3-k8-d16): a short device call checks one or two")
    p.add_argument("inputs", nargs="*", help="render, combine: JSON files")
    p.set_defaults(func=run)


def _trees(given: str | None) -> tuple[str, ...] | None:
    """--sampled-trees "chain-1,s3-k4-d5" -> the shapes, each checked before any device work (a
    wrong one is named with the flag)."""
    if not given:
        return None
    from diag.trees import tree_shape
    names = tuple(t.strip() for t in given.split(",") if t.strip())
    for t in names:
        tree_shape(t, field="--sampled-trees")
    return names


def _overrides(items: list[str]) -> dict:
    """["trees=[\"chain-3\"]", "seed=1"] -> {"trees": ("chain-3",), "seed": 1} (lists become
    tuples, as the case's frozen dataclasses hold them)."""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        v = json.loads(value)
        out[key.strip()] = tuple(v) if isinstance(v, list) else v
    return out


def _is_summary(path: Path) -> bool:
    """An earlier `diag bench render` file: its first line is render's title."""
    with open(path, encoding="utf-8") as fh:
        return fh.readline().rstrip("\n") == "# diag bench"


def _is_result(path: Path) -> bool:
    """An earlier bench result: JSON carrying bench_version and a kind (bench/common.py)."""
    data = json.loads(path.read_text())
    return isinstance(data, dict) and "bench_version" in data and "kind" in data


def _check_paths(a) -> None:
    """Before any measurement: never write over a file or into a directory diag did not
    write (--out a user's file, --workdir holding a user's files)."""
    from diag.report.outdir import check_out_dir, check_out_file

    if a.where == "render":
        check_out_file(a.out or "reports/bench/summary.md", _is_summary, what="bench summary")
        return
    if a.where == "combine" and not a.out:
        from diag.errors import DiagError
        raise DiagError("combine writes a new result: name it", field="--out", expected="a JSON path", found=None)
    check_out_file(a.out or f"reports/bench/{a.where}.json", _is_result, what="bench result JSON")
    if a.workdir:
        check_out_dir(a.workdir, WORKDIR_KIND, field="--workdir")


def run(a) -> int:
    _check_paths(a)
    if a.where == "render":
        from diag.bench.render import render
        text = render([Path(x) for x in a.inputs])
        Path(a.out or "reports/bench/summary.md").write_text(text + "\n")
        print(text)
        return 0
    if a.where == "combine":
        from diag.bench.combine import write
        write([Path(x) for x in a.inputs], Path(a.out))
        print(f"results: {a.out}")
        return 0
    out = Path(a.out or f"reports/bench/{a.where}.json")
    with tempfile.TemporaryDirectory(prefix="diag-bench-") as tmp:
        work = Path(a.workdir) if a.workdir else Path(tmp)
        try:
            _measure(a, out, work)
        finally:
            if a.workdir and work.is_dir():
                from diag.report.outdir import write_manifest
                write_manifest(work, WORKDIR_KIND)       # all of it is diag's scratch now
    print(f"results: {out}")
    return 0


def _measure(a, out: Path, work: Path) -> None:
    if a.where == "gpu":
        from diag.bench.gpu import SECTIONS, run as gpu_run
        sections = tuple(a.sections.split(",")) if a.sections else SECTIONS
        gpu_run(out, work, max_layers=a.max_layers, layers=a.layers, sections=sections,
                e2e_prompts=a.e2e_prompts, e2e_new_tokens=a.e2e_new_tokens,
                e2e_evaluate=_overrides(a.e2e_evaluate), e2e_decoding=_decoding(a), tile_budget_s=a.tile_budget,
                routing=a.routing, sampled_trees=_trees(a.sampled_trees))
    else:
        from diag.bench.cpu import SECTIONS as CPU_SECTIONS, run as cpu_run
        cpu_run(out, work, sections=tuple(a.sections.split(",")) if a.sections else CPU_SECTIONS,
                e2e_decoding=_decoding(a))


def _decoding(a) -> dict | None:
    """--e2e-sampled and --e2e-decoding KEY=JSON -> DecodingSpec fields (a sweep key's single
    value becomes a one-value sweep: temperature=1.0 -> (1.0,)), checked before anything runs.
    ["temperature=[1.0]", "seeds=1"] -> {"temperature": (1.0,), "seeds": 1}."""
    from dataclasses import fields

    from diag.bench.e2e import SAMPLED
    from diag.errors import DiagError
    from diag.run.case import DecodingSpec

    known = {f.name for f in fields(DecodingSpec)}
    out = {k: tuple(v) for k, v in SAMPLED.items()} if a.e2e_sampled else {}
    for item in a.e2e_decoding:
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or key not in known:
            raise DiagError("--e2e-decoding takes KEY=JSON with a [decoding] key", field="--e2e-decoding",
                            expected=f"one of {sorted(known)}", found=item)
        try:
            v = json.loads(value)
        except json.JSONDecodeError as err:
            raise DiagError("--e2e-decoding value is not JSON", field="--e2e-decoding", expected="JSON, e.g. [1.0]",
                            found=f"{item} ({err})") from err
        out[key] = tuple(v) if isinstance(v, list) else (v,) if key in ("temperature", "top_p", "top_k") else v
    if out:                    # every value in range before the checkpoint is written
        from dataclasses import replace

        from diag.run.case import _check_decoding
        try:
            _check_decoding(replace(DecodingSpec(), **out), "--e2e-decoding")
        except TypeError as err:             # a value of the wrong type (seeds="x" and the like)
            raise DiagError("--e2e-decoding value of the wrong type", field="--e2e-decoding",
                            expected="the [decoding] key's type", found=f"{out} ({err})") from err
    return out or None
