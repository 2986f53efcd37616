"""The folders are the data path, and imports flow along it (STYLE.md).

ORDER lists diag's packages in data-path order; a module may import from its own group and
from earlier ones only. Imports are read with ast, so one hidden inside a function counts
too. Every module must belong to a group, and the top level stays small."""

import ast
import io
import re
import tokenize
from pathlib import Path

from diag.engines import FAMILIES, families

PKG = Path(__file__).resolve().parents[1] / "diag"

ORDER = [
    ("diag.errors",),
    ("diag.layouts", "diag.trees", "diag.metrics", "diag.stats"),   # leaves everything uses
    ("diag.checkpoint",),       # config.json, safetensors headers, content digests
    ("diag.engines",),          # what each serving engine decides, per release
    ("diag.int4",),             # the INT4 format
    ("diag.target",),           # the target: load, capture, passes, regimes, placement
    ("diag.drafter",),          # the drafter: model, formats, drafting, trees
    ("diag.zoo",),              # tiny real checkpoints built from the two above
    ("diag.replay",),           # verify, replay, the typed evaluation records
    ("diag.report.sections.cells", "diag.report.views", "diag.report.figure"),   # report.md's cells and
                                # the plots' figures: formatting the diagnoses share with the report
    ("diag.run", "diag.diagnoses"),   # a case end to end: inputs, passes, evaluate, verdicts; the diagnoses
    ("diag.report",),           # report.json, report.md, plots, compare
    ("diag.probe",),            # a live server as an input: send the prompts, save its answers
    ("diag.checks",),           # lint, validate
    ("diag.bench",),
    ("diag.cli",),
    ("diag.assertions",),
    ("diag.pytest_plugin",),
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def group(name: str) -> int | None:
    for i, members in enumerate(ORDER):
        if any(name == m or name.startswith(m + ".") for m in members):
            return i
    return None


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("diag.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diag."):
            out.add(node.module)
    return out


def modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if module_name(p) != "diag")


def test_every_module_belongs_to_a_group():
    lost = [module_name(p) for p in modules() if group(module_name(p)) is None]
    assert not lost, f"modules outside ORDER (add their package to it): {lost}"


def test_imports_flow_along_the_data_path():
    backwards = []
    for path in modules():
        me = module_name(path)
        for dep in imports(path):
            if group(dep) is not None and group(dep) > group(me):
                backwards.append(f"{me} ({ORDER[group(me)][0]}) imports {dep} ({ORDER[group(dep)][0]})")
    assert not backwards, "\n".join(backwards)


def test_the_top_level_stays_small():
    top = sorted(p.name for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 10, top


def test_sglang_is_imported_lazily_in_one_module():
    users = [module_name(p) for p in PKG.rglob("*.py") if "import sglang" in p.read_text()
             or "from sglang" in p.read_text()]
    assert len(users) <= 1, users
    for p in PKG.rglob("*.py"):
        tree = ast.parse(p.read_text())
        for node in tree.body:  # module level only
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.startswith("sglang") for n in names), f"{p}: top-level sglang import"


def test_a_backwards_import_is_caught(tmp_path):
    """The checker itself: a target module importing the run package would fail."""
    bad = tmp_path / "x.py"
    bad.write_text("from diag.run.pipeline import run_case\n")
    assert group("diag.run.pipeline") > group("diag.target.load")
    assert imports(bad) == {"diag.run.pipeline"}


# ---- engines: one package each, named nowhere else ---------------------------------------
#
# A family's name ("sglang") may appear in code only inside its package (diag/engines/<family>/),
# the registry (diag/engines/__init__.py), the docs and the tests. "In code" means identifiers,
# import paths and string literals; comments and docstrings are documentation (they cite the
# engine's source files, e.g. "SGLang's llama_eagle3.py") and are not counted.
# NAMED_OUTSIDE lists the modules that still name a family, with how many times: the count may
# only shrink (lower it when you route a use through diag.engines.rules(); a stale count fails
# too); a new module naming an engine fails. What remains, by kind:
#   values users type or read, named once each: the drafter format "sglang-eagle3" (a report.json
#     enum, checkpoint/drafter_format.py EAGLE3_FORMAT), the tree presets "sglang-llama-default" /
#     "sglang-deepseek-default" (trees.py), the case key [server] vllm_metrics (run/case.py, its
#     flag's dest in cli/paths.py and cli/run.py), the zoo entry llama-tiny-eagle3-embed-vllm-ids
#     (its recipe, summary and "vllm" convention in zoo/recipes.py; shipped in zoo/shipped.py);
#   the live server (diag/diagnoses/live_serving/) reads every engine's files through the protocol;
#     its one leftover is that case key's field, [server] vllm_metrics (live_serving/inputs.py).
# The rest goes through the protocol: lint's cross-check (EngineRules.cross_check), the reported
# accept rates (report_rates), benchmark settings (simulated_acceptance, diag/engines/simulate.py),
# `diag explain` (explain_logged), help texts (the registry's families and DEFAULT_ENGINE).
NAMED_OUTSIDE: dict[str, dict[str, int]] = {
    "sglang": {
        "diag/checkpoint/drafter_format.py": 1,   # the format's name, a report.json enum value
        "diag/trees.py": 2,                       # tree presets users name in cases and flags
        "diag/zoo/recipes.py": 1,                 # the vllm-ids entry's summary
    },
    "vllm": {
        "diag/cli/paths.py": 1,             # --server-metrics's dest server_vllm_metrics (a path)
        "diag/cli/run.py": 1,               # --server-metrics sets the case key vllm_metrics
        "diag/diagnoses/live_serving/inputs.py": 1,   # reads the case key [server] vllm_metrics
        "diag/run/case.py": 1,              # the case key [server] vllm_metrics
        "diag/zoo/recipes.py": 3,           # the entry llama-tiny-eagle3-embed-vllm-ids: name, summary, convention
        "diag/zoo/shipped.py": 1,           # the zoo entry's name, llama-tiny-eagle3-embed-vllm-ids
    },
}


def _docstrings(tree: ast.Module) -> set[tuple[int, int]]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add((first.lineno, first.col_offset))
    return out


def names_in_code(path: Path, name: str) -> int:
    """How often `name` (any case) occurs in identifiers and non-docstring string literals."""
    src = path.read_text()
    docs = _docstrings(ast.parse(src))
    kinds = {tokenize.NAME, tokenize.STRING} | ({tokenize.FSTRING_MIDDLE} if hasattr(tokenize, "FSTRING_MIDDLE")
                                                 else set())
    return sum(len(re.findall(name, tok.string, re.I))
               for tok in tokenize.generate_tokens(io.StringIO(src).readline)
               if tok.type in kinds and not (tok.type == tokenize.STRING and tok.start in docs))


def outside_its_package(family: str) -> dict[str, int]:
    home = f"diag/engines/{family}/"
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel.startswith(home) or rel == "diag/engines/__init__.py":
            continue
        if (n := names_in_code(path, family)):
            out[rel] = n
    return out


def test_every_registered_engine_is_a_package_of_its_own():
    assert families()[0] == "sglang"
    for family, module in FAMILIES.items():
        assert module.startswith(f"diag.engines.{family}."), module
        assert (PKG / "engines" / family / "__init__.py").is_file()


def test_an_engine_is_named_only_in_its_package_the_registry_docs_and_tests():
    grown = []
    for family in families():
        allowed = NAMED_OUTSIDE.get(family, {})
        for rel, n in outside_its_package(family).items():
            if n > allowed.get(rel, 0):
                grown.append(f"{rel} names {family!r} {n} times (allowed {allowed.get(rel, 0)}): "
                             "route it through diag.engines.rules()")
    assert not grown, "\n".join(grown)


def test_the_list_of_exceptions_is_exact():
    """A module routed through the protocol leaves the list: stale entries fail, so the count shrinks."""
    for family in families():
        found = outside_its_package(family)
        stale = {rel: (n, found.get(rel, 0)) for rel, n in NAMED_OUTSIDE.get(family, {}).items()
                 if found.get(rel, 0) < n}
        assert not stale, f"lower these counts in NAMED_OUTSIDE[{family!r}] (listed, found): {stale}"


def test_the_name_counter_skips_docs_and_sees_code(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""SGLang docs."""\n# sglang comment\nfrom diag.engines.sglang import x  # SGLang\n'
                 'def g():\n    """SGLang."""\n    return f"SGLang {x}"\n')
    assert names_in_code(f, "sglang") == 2


# ---- diagnoses: one module each, named nowhere else ---------------------------------------
#
# A registered diagnosis's name (`loops`, `long_context`, ...) may appear in code only in its own
# module (diag/diagnoses/<name>.py) or package (diag/diagnoses/<name>/), the registry
# (diag/diagnoses/__init__.py), the docs and the tests. The rule: the name as a whole word, any
# case, in identifiers, import paths and non-docstring string literals (names_in_code above), so
# `case.long_context`, `LONG_CONTEXT` and "long_context.length" count and `long_context_prompts`
# does not. What a new diagnosis then touches is its module and the registry (and the schema's
# README, docs). DIAGNOSIS_NAMED_OUTSIDE lists what still names one, with counts that may only
# shrink (a stale count fails too):
#   long_context: its case section [long_context] (Case's field and LongContextSpec: run/case.py), the
#     ladder cut before any weight is loaded (run/inputs.py) and its extra pass's key LONG_CONTEXT
#     (run/target_passes.py); its flags are its own (Diagnosis.add_flags);
#   coverage: another quantity of the same name, the drafter-health check "vocab coverage"
#     (drafter/health.py), not the diagnosis;
#   pricing: the GPU bench times the pipeline's step-cost measurement itself (bench/gpu.py);
DIAGNOSIS_NAMED_OUTSIDE: dict[str, dict[str, int]] = {
    "coverage": {"diag/drafter/health.py": 3},
    "pricing": {"diag/bench/gpu.py": 1},
    "long_context": {
        "diag/run/case.py": 2,
        "diag/run/inputs.py": 3,
        "diag/run/target_passes.py": 2,
    },
}


def diagnosis_named_outside(name: str) -> dict[str, int]:
    homes = (f"diag/diagnoses/{name}.py", "diag/diagnoses/__init__.py")
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel in homes or rel.startswith(f"diag/diagnoses/{name}/"):
            continue
        if (n := names_in_code(path, rf"\b{name}\b")):
            out[rel] = n
    return out


def test_every_registered_diagnosis_is_a_module_of_its_own():
    from diag.diagnoses import DIAGNOSES
    names = [d.name for d in DIAGNOSES]
    assert len(set(names)) == len(names) >= 4, names
    for d in DIAGNOSES:
        home = PKG / "diagnoses" / d.name
        assert home.with_suffix(".py").is_file() or (home / "__init__.py").is_file(), d.name
        assert type(d).__module__ in (f"diag.diagnoses.{d.name}", f"diag.diagnoses.{d.name}.__init__")


def test_a_diagnosis_is_named_only_in_its_module_the_registry_docs_and_tests():
    from diag.diagnoses import DIAGNOSES
    grown, stale = [], {}
    for d in DIAGNOSES:
        found, allowed = diagnosis_named_outside(d.name), DIAGNOSIS_NAMED_OUTSIDE.get(d.name, {})
        grown += [f"{rel} names {d.name!r} {n} times (allowed {allowed.get(rel, 0)}): move it into "
                  f"diag/diagnoses/{d.name}.py" for rel, n in found.items() if n > allowed.get(rel, 0)]
        stale.update({f"{d.name}: {rel}": (n, found.get(rel, 0)) for rel, n in allowed.items()
                      if found.get(rel, 0) < n})
    assert not grown, "\n".join(grown)
    assert not stale, f"lower these counts in DIAGNOSIS_NAMED_OUTSIDE (listed, found): {stale}"
    assert set(DIAGNOSIS_NAMED_OUTSIDE) <= {d.name for d in DIAGNOSES}


def section_read_by_key(key: str, path: Path) -> int:
    """`run.<key>`, `rep["<key>"]` and `rep.get("<key>")` in code: a section read by its report key."""
    q = "[\"']"
    pattern = rf"\brun\.{key}\b|\brep\[{q}{key}{q}\]|\brep\.get\({q}{key}{q}"
    return len(re.findall(pattern, path.read_text()))


def test_a_section_is_read_by_its_report_key_only_in_its_diagnosis():
    """A diagnosis whose report key is a common word (`regimes`) has another name; its section is
    still read back by key (run.regimes, rep["regimes"]) nowhere but in its own module."""
    from diag.diagnoses import DIAGNOSES
    found = []
    for d in DIAGNOSES:
        for path in sorted(PKG.rglob("*.py")):
            rel = path.relative_to(PKG.parent).as_posix()
            if rel != f"diag/diagnoses/{d.name}.py" and not rel.startswith(f"diag/diagnoses/{d.name}/") \
                    and section_read_by_key(d.key, path):
                found.append(f"{rel} reads the section {d.key!r}: read it through diag/diagnoses/{d.name}.py")
    assert not found, "\n".join(found)


def test_the_section_key_rule(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('def g(run, rep):\n    return run.regimes, rep["regimes"], rep.get(\'regimes\'), inp.regimes, run.regimes_x\n')
    assert section_read_by_key("regimes", f) == 3


def test_the_diagnosis_name_rule(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""loops docs."""\n# loops comment\nfrom diag.diagnoses.loops import x\n'
                 'def g(run):\n    return run.loops, find_loops, "loops", LOOPS\n')
    assert names_in_code(f, r"\bloops\b") == 4


# ---- a diagnosis's section is read by key only in its own package ---------------------------
#
# Its report key (Diagnosis.key: "speedup" for pricing, "server" for live_serving) may be read
# (`run.<key>`, `rep["<key>"]`, `rep.get("<key>")`, also on `report`) only in its own module or
# package; KEY_READ_OUTSIDE lists the leftovers, with counts that may only shrink:
#   speedup: the pytest plugin's assert_speculation_pays reads the report a user's test holds
#     (assertions.py).
KEY_READ_OUTSIDE: dict[str, dict[str, int]] = {
    "speedup": {"diag/assertions.py": 1},
}


def key_reads(path: Path, key: str) -> int:
    k = re.escape(key)
    pattern = rf"\brun\.{k}\b|\b(?:rep|report)\s*(?:\[\s*[\"']{k}[\"']\s*\]|\.get\(\s*[\"']{k}[\"'])"
    return len(re.findall(pattern, path.read_text()))


def test_a_section_is_read_by_its_key_only_in_its_diagnosis():
    from diag.diagnoses import DIAGNOSES
    found = {}
    for d in DIAGNOSES:
        for path in sorted(PKG.rglob("*.py")):
            rel = path.relative_to(PKG.parent).as_posix()
            if rel in (f"diag/diagnoses/{d.name}.py", "diag/diagnoses/__init__.py") \
                    or rel.startswith(f"diag/diagnoses/{d.name}/"):
                continue
            if (n := key_reads(path, d.key)):
                found.setdefault(d.key, {})[rel] = n
    assert found == KEY_READ_OUTSIDE, f"read these sections through their diagnosis (found, allowed): " \
                                      f"{found} {KEY_READ_OUTSIDE}"


def test_the_key_read_rule(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('x = run.speedup\ny = rep["speedup"]\nz = report.get("speedup")\nw = run.case.speedup\n')
    assert key_reads(f, "speedup") == 3
