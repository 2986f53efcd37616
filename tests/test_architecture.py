"""The folders are the data path, and imports flow along it (STYLE.md).

ORDER lists diag's packages in data-path order; a module may import from its own group and
from earlier ones only. Imports are read with ast, so one hidden inside a function counts
too. Every module must belong to a group, and the top level stays small."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "diag"

ORDER = [
    ("diag.errors",),
    ("diag.layouts", "diag.trees", "diag.metrics", "diag.stats"),   # leaves everything uses
    ("diag.checkpoint",),       # config.json, safetensors headers, content digests
    ("diag.engine", "diag.engines"),   # what SGLang / vLLM decide, per version
    ("diag.int4",),             # the INT4 format
    ("diag.target",),           # the target: load, capture, passes, regimes, placement
    ("diag.drafter",),          # the drafter: model, formats, drafting, trees
    ("diag.zoo",),              # tiny real checkpoints built from the two above
    ("diag.replay",),           # verify, replay, the typed evaluation records
    ("diag.run",),              # a case end to end: inputs, passes, evaluate, verdicts
    ("diag.report",),           # report.json, report.md, plots, compare
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
