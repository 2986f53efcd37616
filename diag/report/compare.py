"""What changed between two reports: acceptance per matched variant, verdicts, provenance.

Variants match by their key ("layout|mode|tree|regime"). For each matched variant the
comparison carries accept length in A and in B with their 95% intervals, and B - A. When
both reports replayed the same prompts (same ids, same order), the difference gets a paired
bootstrap interval over prompts (stats.paired_bootstrap_diff); otherwise it is unpaired and
has none. report.json keeps, per prompt, only (rounds, accepted_sum); the pooled statistic
1 + Σa / rounds depends on nothing else, so a prompt with rounds 3 and accepted_sum 4 is
resampled as the rounds [4, 0, 0] without changing any number.

Per prompt category (report.json keeps each prompt's category since 2.2), the same: both arms
pooled over the category's prompts, B - A, paired when both replayed the same prompts of that
category. This module reads two report dicts and renders the comparison; it knows nothing about
models, and it recomputes no per-round metric.
"""

from __future__ import annotations

import json
from pathlib import Path

from diag.errors import DiagError
from diag.replay.categories import grouped
from diag.replay.evaluation import axes_of, reference_axes
from diag.stats import paired_bootstrap_diff

SCHEMA_MAJORS = ("1", "2")      # 2.0 added axes / reference / serving; every field read here is in both

# (name, path into the report): what a ticket reader checks first when two numbers differ.
PROVENANCE = (
    ("diag version", ("provenance", "diag_version")),
    ("git", ("provenance", "git")),
    ("python", ("provenance", "machine", "python")),
    ("torch", ("provenance", "machine", "torch")),
    ("transformers", ("provenance", "machine", "transformers")),
    ("CUDA", ("provenance", "machine", "cuda")),
    ("GPUs", ("provenance", "machine", "gpus")),
    ("case hash", ("case", "hash")),
    ("target path", ("target", "path")),
    ("target config hash", ("target", "config_hash")),
    ("target quantization", ("target", "quantization")),
    ("drafter path", ("drafter", "path")),
    ("drafter format", ("drafter", "format")),
    ("drafter config hash", ("drafter", "config")),
    ("prompt set", ("prompts", "file")),
    ("prompt set hash", ("prompts", "sha256")),
    ("prompts", ("prompts", "count")),
    ("continuations", ("target_pass", "source")),
    ("max_new_tokens", ("target_pass", "max_new_tokens")),
    ("continuation tokens", ("target_pass", "continuation_tokens")),
    ("reference regime", ("target_pass", "reference_regime")),
)


def load_report(path: str | Path) -> tuple[dict, Path]:
    """A report directory or its report.json -> (report dict, path of report.json)."""
    p = Path(path)
    file = p / "report.json" if p.is_dir() else p
    if not file.is_file():
        raise DiagError("no report found", file=str(p), expected="a report directory or its report.json",
                        found="no such file")
    try:
        rep = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise DiagError("report.json is not valid JSON", file=str(file), expected="JSON",
                        found=str(err)) from err
    if not isinstance(rep, dict) or rep.get("kind") != "diag-report":
        raise DiagError("not a diag report", file=str(file), field="kind", expected="diag-report",
                        found=rep.get("kind") if isinstance(rep, dict) else type(rep).__name__)
    version = str(rep.get("schema_version", ""))
    if version.split(".")[0] not in SCHEMA_MAJORS:
        raise DiagError("unsupported report schema version", file=str(file), field="schema_version",
                        expected=" or ".join(f"{m}.x" for m in SCHEMA_MAJORS), found=version or "missing")
    return rep, file


def _get(rep: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(rep, dict) or key not in rep:
            return None
        rep = rep[key]
    return rep


def provenance_diff(a: dict, b: dict) -> list[dict]:
    """[{"field", "a", "b"}] for every provenance entry that differs."""
    return [{"field": name, "a": _get(a, path), "b": _get(b, path)}
            for name, path in PROVENANCE if _get(a, path) != _get(b, path)]


def _as_rounds(per_prompt: list[dict]) -> list[list[int]]:
    """(rounds, accepted_sum) per prompt -> round lists with the same Σa and count.
    rounds 3, accepted_sum 4 -> [4, 0, 0]; rounds 0 -> []."""
    return [[p["accepted_sum"]] + [0] * (p["rounds"] - 1) if p["rounds"] else [] for p in per_prompt]


def _paired(ea: dict, eb: dict) -> bool:
    ids_a = [p["id"] for p in ea["per_prompt"]]
    return bool(ids_a) and ids_a == [p["id"] for p in eb["per_prompt"]]


def _arm(e: dict) -> dict:
    return {"accept_length": e["accept_length"], "ci95": e["accept_length_ci95"],
            "rounds": e["trajectory"]["rounds"]}


def _pooled(per_prompt: list[dict]) -> tuple[float | None, int]:
    rounds = sum(p["rounds"] for p in per_prompt)
    return (1.0 + sum(p["accepted_sum"] for p in per_prompt) / rounds if rounds else None), rounds


def _diff(pa: list[dict], pb: list[dict], out: dict, *, seed: int, n_boot: int) -> dict:
    """Fill B - A and, when both arms replayed the same prompts, its paired interval."""
    out.update({"difference": None, "difference_ci95": None, "significant": False,
                "paired": bool(pa) and [p["id"] for p in pa] == [p["id"] for p in pb]})
    a, b = _pooled(pa)[0], _pooled(pb)[0]
    if a is None or b is None:
        return out
    out["difference"] = b - a
    if out["paired"]:
        _, lo, hi = paired_bootstrap_diff(_as_rounds(pb), _as_rounds(pa), seed=seed, n=n_boot)
        out["difference_ci95"] = [lo, hi]
        out["significant"] = lo > 0 or hi < 0
    return out


def category_diffs(ea: dict, eb: dict, *, seed: int, n_boot: int) -> list[dict]:
    """Per category in both arms: A and B pooled over its prompts, B - A [paired CI]."""
    ga, gb = grouped(ea["per_prompt"]), grouped(eb["per_prompt"])
    out = []
    for cat in sorted(set(ga) & set(gb)):
        row = {"category": cat, "a": {"accept_length": _pooled(ga[cat])[0], "prompts": len(ga[cat])},
               "b": {"accept_length": _pooled(gb[cat])[0], "prompts": len(gb[cat])}}
        out.append(_diff(ga[cat], gb[cat], row, seed=seed, n_boot=n_boot))
    return out


def variant_diff(ea: dict, eb: dict, *, seed: int, n_boot: int) -> dict:
    """One matched variant: both arms, B - A, and the paired interval when there is one;
    the same per prompt category."""
    out = {k: ea[k] for k in ("key", "layout", "mode", "tree", "regime", "tokens_regime")}
    out.update({"rendering": ea.get("rendering", "auto"), "a": _arm(ea), "b": _arm(eb)})
    out = _diff(ea["per_prompt"], eb["per_prompt"], out, seed=seed, n_boot=n_boot)
    if ea["accept_length"] is not None and eb["accept_length"] is not None:
        out["difference"] = eb["accept_length"] - ea["accept_length"]
    out["by_category"] = category_diffs(ea, eb, seed=seed, n_boot=n_boot)
    return out


def _verdict_table(rep: dict) -> dict[str, dict]:
    """kind -> verdict; a kind seen twice is numbered: eagle-algorithm, eagle-algorithm#2."""
    out: dict[str, dict] = {}
    for v in rep["verdicts"]:
        name, i = v["kind"], 2
        while name in out:
            name, i = f"{v['kind']}#{i}", i + 1
        out[name] = v
    return out


def verdict_changes(a: dict, b: dict) -> list[dict]:
    """Per verdict kind in either report: change = same | appeared | disappeared | severity | text."""
    va, vb = _verdict_table(a), _verdict_table(b)
    out = []
    for kind in list(va) + [k for k in vb if k not in va]:
        x, y = va.get(kind), vb.get(kind)
        change = ("appeared" if x is None else "disappeared" if y is None else
                  "severity" if x["severity"] != y["severity"] else "text" if x["text"] != y["text"] else "same")
        out.append({"kind": kind, "change": change,
                    "a": None if x is None else {"severity": x["severity"], "text": x["text"]},
                    "b": None if y is None else {"severity": y["severity"], "text": y["text"]}})
    return out


def compare(a: dict, b: dict, *, a_path: str = "A", b_path: str = "B", seed: int = 0,
            n_boot: int = 2000) -> dict:
    """The whole comparison as plain data (what `diag compare --json` prints)."""
    ka = {e["key"]: e for e in a["evaluations"]}
    kb = {e["key"]: e for e in b["evaluations"]}
    return {
        "kind": "diag-compare",
        "a": {"path": str(a_path), "case": a["case"]["name"], "created": a.get("created")},
        "b": {"path": str(b_path), "case": b["case"]["name"], "created": b.get("created")},
        "provenance": provenance_diff(a, b),
        "verdicts": verdict_changes(a, b),
        "variants": [variant_diff(ka[k], kb[k], seed=seed, n_boot=n_boot) for k in ka if k in kb],
        "reference_keys": _reference_keys(a),
        "only_a": [k for k in ka if k not in kb],
        "only_b": [k for k in kb if k not in ka],
    }


def _reference_keys(rep: dict) -> list[str]:
    """Keys of A's variants at A's reference axes (every layout): the dataset table's rows."""
    where = reference_axes(rep)
    return [e["key"] for e in rep["evaluations"] if where.matches(axes_of(e))]


def _f(x, signed: bool = False) -> str:
    return "–" if x is None else (f"{x:+.2f}" if signed else f"{x:.2f}")


def _ci(ci, signed: bool = False) -> str:
    if not ci or ci[0] is None:
        return "–"
    return f"[{_f(ci[0], signed)}, {_f(ci[1], signed)}]"


def _diff_cell(v: dict) -> str:
    if v["difference"] is None:
        return "–"
    if not v["paired"]:
        return f"{_f(v['difference'], True)} (unpaired: prompts differ)"
    return f"{_f(v['difference'], True)} {_ci(v['difference_ci95'], True)}{' *' if v['significant'] else ''}"


def render_markdown(cmp: dict) -> str:
    out = [f"# diag compare: {cmp['a']['case']} vs {cmp['b']['case']}", "",
           f"- A: `{cmp['a']['path']}` ({cmp['a']['created']})",
           f"- B: `{cmp['b']['path']}` ({cmp['b']['created']})",
           "", "## Verdict changes", ""]
    changed = [v for v in cmp["verdicts"] if v["change"] != "same"]
    out += [f"- **{v['kind']}** {v['change']}: A {_verdict_text(v['a'])} → B {_verdict_text(v['b'])}"
            for v in changed] or ["No verdict changed."]
    out += ["", "## Provenance differences", ""]
    out += [f"- {p['field']}: A `{p['a']}` → B `{p['b']}`" for p in cmp["provenance"]] or ["None."]
    out += ["", "## Accept length by variant", "",
            "Trajectory accept length (bonus included), 95% CI over prompts; B − A with a paired bootstrap "
            "interval when both replayed the same prompts (* = interval excludes zero).", "",
            "| layout | mode | tree | regime | A | A 95% CI | B | B 95% CI | B − A [95% CI] |",
            "|---|---|---|---|---|---|---|---|---|"]
    for v in cmp["variants"]:
        reg = v["regime"] if v["regime"] == v["tokens_regime"] else f"{v['regime']}→{v['tokens_regime']}"
        out.append(f"| `{v['layout']}` | {v['mode']} | {v['tree']} | {reg} | {_f(v['a']['accept_length'])} | {_ci(v['a']['ci95'])} | "
                   f"{_f(v['b']['accept_length'])} | {_ci(v['b']['ci95'])} | {_diff_cell(v)} |")
    out += _category_table(cmp)
    for side in ("a", "b"):
        if cmp[f"only_{side}"]:
            out += ["", f"Only in {side.upper()}: " + ", ".join(f"`{k}`" for k in cmp[f"only_{side}"])]
    return "\n".join(out) + "\n"


def _category_table(cmp: dict) -> list[str]:
    ref = set(cmp.get("reference_keys") or [])
    rows = [(v, c) for v in cmp["variants"] if v["key"] in ref for c in v.get("by_category", [])]
    if len({c["category"] for _, c in rows}) < 2:
        return []
    out = ["", "## Accept length by dataset", "",
           "Per prompt category, for A's variants at its reference axes: B − A with a paired interval when "
           "both replayed the same prompts of the category (* = interval excludes zero).", "",
           "| layout | mode | category | prompts A / B | A | B | B − A [95% CI] |", "|---|---|---|---|---|---|---|"]
    for v, c in rows:
        out.append(f"| `{v['layout']}` | {v['mode']} | {c['category']} | {c['a']['prompts']} / {c['b']['prompts']} | "
                   f"{_f(c['a']['accept_length'])} | {_f(c['b']['accept_length'])} | {_diff_cell(c)} |")
    return out


def _verdict_text(v: dict | None) -> str:
    return "(none)" if v is None else f"[{v['severity'].upper()}] {v['text']}"


def render_terminal(cmp: dict) -> str:
    lines = [f"diag compare  A: {cmp['a']['path']}", f"              B: {cmp['b']['path']}", ""]
    for v in cmp["verdicts"]:
        if v["change"] != "same":
            lines.append(f"verdict {v['kind']} {v['change']}:\n  A {_verdict_text(v['a'])}\n"
                         f"  B {_verdict_text(v['b'])}")
    for p in cmp["provenance"]:
        lines.append(f"provenance {p['field']}: {p['a']} -> {p['b']}")
    lines += ["", f"{'variant':48} {'A':>5} {'B':>5}  B-A [95% CI]"]
    for v in cmp["variants"]:
        lines.append(f"{v['key'][:48]:48} {_f(v['a']['accept_length']):>5} {_f(v['b']['accept_length']):>5}  "
                     f"{_diff_cell(v)}")
    for side in ("a", "b"):
        if cmp[f"only_{side}"]:
            lines.append(f"only in {side.upper()}: {', '.join(cmp[f'only_{side}'])}")
    return "\n".join(lines)
