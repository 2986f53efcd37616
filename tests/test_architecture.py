"""Imports flow one way: leaves -> core -> edges (STYLE.md). Parsed with ast, so an import
hidden inside a function counts too."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "diag"

LEAVES = {"diag.errors", "diag.layouts", "diag.conventions", "diag.trees", "diag.metrics", "diag.stats",
          "diag.regimes", "diag.drift", "diag.speedup", "diag.explain", "diag.launch", "diag.serving",
          "diag.int4.format", "diag.int4.scheme", "diag.config_json"}
EDGES = ("diag.cli", "diag.commands", "diag.report", "diag.pytest_plugin", "diag.assertions",
         "diag.bench", "diag.validate", "diag.lint")


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("diag")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diag"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def layer(name: str) -> int:
    if name in LEAVES:
        return 0
    if name.startswith(EDGES):
        return 2
    return 1


def known(name: str) -> bool:
    return (PKG.parent / (name.replace(".", "/") + ".py")).exists() or \
        (PKG.parent / name.replace(".", "/") / "__init__.py").exists()


def test_imports_flow_from_leaves_to_edges():
    backwards = []
    for path in sorted(PKG.rglob("*.py")):
        me = module_name(path)
        for dep in imports(path):
            if known(dep) and dep != "diag" and layer(dep) > layer(me):
                backwards.append(f"{me} (layer {layer(me)}) imports {dep} (layer {layer(dep)})")
    assert not backwards, "\n".join(backwards)


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
