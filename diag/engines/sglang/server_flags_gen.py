"""Generate diag/engines/sglang/server_flags.json from SGLang's released wheels, or check it.

    python -m diag.engines.sglang.server_flags_gen 0.5.6 0.5.14 0.5.23   # rewrites server_flags.json
    python -m diag.engines.sglang.server_flags_gen --check              # every release it holds vs its wheel

For each version: the release's wheel (diag.engines.sglang.wheels: fetched once with pip into
$DIAG_SGLANG_WHEELS, default $DIAG_CACHE_DIR/sglang-wheels), then read, without importing
anything (sglang cannot be imported without its CUDA stack), what
`ServerArgs.add_cli_args(parser)` registers:
  - explicit `parser.add_argument("--x", "--alias", action=..., nargs=..., choices=[...])`
    calls in srt/server_args.py (every release; the only kind up to 0.5.13);
  - dataclass fields declared `name: A[T, "help"]` or `A[T, Arg(cli_name=, aliases=, action=,
    nargs=, no_cli=)]` (ServerArgs itself in 0.5.14, the `_NS_PATH` namespaces under
    srt/arg_groups/fields/ in 0.5.23), turned into arguments as arg_utils'
    `add_cli_args_from_dataclass` does: bool -> a switch, List[X] -> nargs "+", Literal -> choices,
    `argparse.BooleanOptionalAction` -> --X and --no-X, a custom Action -> its __init__'s nargs.
  - the --speculative-algorithm names: argparse `choices` when the release has them, else the
    members of `SpeculativeAlgorithm` (spec_info.py, which `from_string` looks up upper-cased)
    plus NEXTN, which the server-args code rewrites to EAGLE before from_string sees it.
For 0.5.23 this reading was checked against the parser SGLang itself builds (imported with
stubbed CUDA modules): the same 531 arguments, the same option strings and nargs.
tests/test_server_flags.py re-extracts releases from their wheels and runs the check mode.

This module knows wheels, pip and argparse; it knows nothing about diag's models or reports.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from diag.engines.sglang import server_flags, wheels

TABLE_FILE = Path(__file__).with_name(server_flags.DATA)

_SWITCH_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


def _const(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return None


def _action_name(node) -> str | None:
    """'store_true' / 'BooleanOptionalAction' / 'DeprecatedStoreTrueAction' from an action= value."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _action_defaults(sources: dict[str, ast.Module]) -> dict[str, object]:
    """Custom argparse.Action classes -> the nargs their __init__ defaults to (None: one value).
    Example: `def __init__(self, option_strings, dest, nargs=0, **kw)` -> 0."""
    out: dict[str, object] = {}
    for tree in sources.values():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is None:
                continue
            args = init.args.args + init.args.kwonlyargs
            defaults = [None] * (len(init.args.args) - len(init.args.defaults)) + init.args.defaults
            defaults += init.args.kw_defaults
            for arg, default in zip(args, defaults):
                if arg.arg == "nargs":
                    out[cls.name] = _const(default) if default is not None else None
    return out


_UNSET = object()


def _nargs(action: str | None, nargs, custom: dict[str, object]) -> object:
    """argparse's nargs for one argument: 0 for a switch, 1 for one value, "?", "+", "*".
    An explicit `nargs=None` is one value, whatever the action class defaults to."""
    if nargs is not _UNSET:
        return 1 if nargs is None else nargs
    if action in _SWITCH_ACTIONS or action == "BooleanOptionalAction":
        return 0
    value = custom.get(action)
    return 1 if value is None else value


def _options(names: list[str], action: str | None) -> list[str]:
    """BooleanOptionalAction also registers --no-X for every --X."""
    if action != "BooleanOptionalAction":
        return names
    return names + ["--no-" + n[2:] for n in names if n.startswith("--")]


def _explicit(tree: ast.Module, custom: dict) -> list[tuple[list[str], object, list | None]]:
    """`parser.add_argument("--x", "--y", action=..., nargs=..., choices=[...])` with literal names."""
    out = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_argument" and call.args
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args)):
            continue
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        action = _action_name(kw["action"]) if "action" in kw else None
        names = [a.value for a in call.args]
        if not names[0].startswith("-"):
            continue
        nargs = _const(kw["nargs"]) if "nargs" in kw else _UNSET
        out.append((_options(names, action), _nargs(action, nargs, custom),
                    _const(kw["choices"]) if "choices" in kw else None))
    return out


def _inner_type(node) -> tuple[str, list | None]:
    """('bool' | 'list' | 'literal' | 'value', literal values) of a field's type, Optional removed.
    Example: Optional[List[int]] -> ('list', None); Literal['a', 'b'] -> ('literal', ['a', 'b'])."""
    text = ast.unparse(node)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Optional", "typing.Optional"):
        return _inner_type(node.slice)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        side = node.right if ast.unparse(node.left) == "None" else node.left
        return _inner_type(side)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Literal", "typing.Literal"):
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return "literal", [_const(e) for e in elts]
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("List", "list", "typing.List"):
        return "list", None
    return ("bool", None) if text == "bool" else ("value", None)


def _field(node: ast.AnnAssign, custom: dict) -> tuple[list[str], object, list | None] | None:
    """A dataclass field `name: A[T, "help"]` or `A[T, Arg(...)]` -> its argument, as
    arg_utils.add_cli_args_from_dataclass registers it; None for fields without a CLI surface."""
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated")
            and isinstance(ann.slice, ast.Tuple) and len(ann.slice.elts) >= 2):
        return None
    typ, meta = ann.slice.elts[0], ann.slice.elts[1]
    if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
        kw = {}
    elif isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg":
        kw = {k.arg: k.value for k in meta.keywords if k.arg}
    else:
        return None
    if _const(kw.get("no_cli")) is True:
        return None
    name = node.target.id
    names = [_const(kw["cli_name"]) if "cli_name" in kw else "--" + name.replace("_", "-")]
    names += list(_const(kw["aliases"]) or []) if "aliases" in kw else []
    choices = _const(kw["choices"]) if "choices" in kw else None
    if "action" in kw:
        action = _action_name(kw["action"])
        nargs = _const(kw["nargs"]) if "nargs" in kw else _UNSET
        extra = kw.get("action_kwargs")            # e.g. {"type": str, "nargs": "*"}
        if isinstance(extra, ast.Dict):
            nargs = next((_const(v) for k, v in zip(extra.keys, extra.values) if _const(k) == "nargs"), nargs)
        return _options(names, action), _nargs(action, nargs, custom), choices
    kind, literal = _inner_type(typ)
    if kind == "literal":
        return names, _const(kw["nargs"]) if "nargs" in kw else 1, choices or literal
    if kind == "list" and "type_parser" not in kw:
        return names, _const(kw["nargs"]) if "nargs" in kw else "+", choices
    if kind == "bool":
        return names, 0, None
    return names, _const(kw["nargs"]) if "nargs" in kw else 1, choices


def _dataclass_fields(sources: dict[str, ast.Module], custom: dict) -> list:
    """Fields of ServerArgs (0.5.14: in server_args.py) and of the namespace classes that carry
    _NS_PATH (0.5.23: arg_groups/fields/*.py)."""
    out = []
    for path, tree in sources.items():
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            ns = any(isinstance(s, (ast.Assign, ast.AnnAssign)) and "_NS_PATH" in ast.unparse(s)
                     for s in cls.body)
            if not (ns and "/fields/" in path) and not (cls.name == "ServerArgs" and path.endswith("srt/server_args.py")):
                continue
            out += [f for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    and (f := _field(s, custom)) is not None]
    return out


def _algorithms(sources: dict[str, ast.Module], flags: list) -> dict:
    """The --speculative-algorithm names a release accepts: argparse choices when it has them,
    else SpeculativeAlgorithm's members (from_string upper-cases and looks them up), plus
    NEXTN, which the server-args code rewrites to EAGLE before from_string sees it."""
    choices = next((c for names, _, c in flags if "--speculative-algorithm" in names and c), None)
    if choices:
        return {"checked_by": "argparse", "names": sorted(choices)}
    names = set()
    for path, tree in sources.items():
        if path.endswith("speculative/spec_info.py"):
            cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm")
            names |= {t.id for s in cls.body if isinstance(s, ast.Assign) for t in s.targets
                      if isinstance(t, ast.Name) and t.id.isupper()}
    if any(isinstance(n, ast.Constant) and n.value == "NEXTN" for p, t in sources.items()
           if p.endswith(("srt/server_args.py", "speculative_hook.py", "spec_registry.py"))
           for n in ast.walk(t)):
        names.add("NEXTN")
    return {"checked_by": "from_string", "names": sorted(names)}


def _sources(root: Path) -> dict[str, ast.Module]:
    srt = root / "sglang" / "srt"
    files = [srt / "server_args.py", *sorted((srt / "arg_groups").rglob("*.py")),
             srt / "speculative" / "spec_info.py", srt / "speculative" / "spec_registry.py"]
    return {str(f.relative_to(root)).replace(os.sep, "/"): ast.parse(f.read_text()) for f in files if f.is_file()}


def extract_from_source(root: Path) -> dict:
    """{"flags": [[option strings], nargs], "algorithm": {...}} from an unpacked sglang tree."""
    sources = _sources(root)
    custom = _action_defaults(sources)
    flags = _dataclass_fields(sources, custom)
    flags += _explicit(sources["sglang/srt/server_args.py"], custom)
    seen, out = set(), []
    for names, nargs, choices in flags:
        if names[0] not in seen:
            seen.add(names[0])
            out.append([names, nargs])
    return {"flags": sorted(out, key=lambda f: f[0][0]), "algorithm": _algorithms(sources, flags)}


def extract(version: str) -> dict:
    """The flag table of one release, from its wheel, with the wheel's name and the sha256
    of its server_args.py."""
    wheel = wheels.wheel(version)
    with tempfile.TemporaryDirectory(prefix="diag-sglang-") as tmp, zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp, [n for n in zf.namelist() if n.startswith("sglang/srt/") and n.endswith(".py")])
        sha = hashlib.sha256((Path(tmp) / "sglang/srt/server_args.py").read_bytes()).hexdigest()
        data = extract_from_source(Path(tmp))
    return {**data, "wheel": wheel.name, "server_args_sha256": sha}


def _pairs(table: dict) -> list[list]:
    """[option, nargs] for every option string, in the extraction's order (aliases after their
    first option)."""
    return [[o, n] for opts, n in table["flags"] for o in opts]


def _edits(previous: list, current: list) -> list:
    """[at, drop, items] turning `previous` into `current` (server_flags.py's edit format)."""
    prev, cur = [tuple(x) for x in previous], [tuple(x) for x in current]
    ops = difflib.SequenceMatcher(None, prev, cur, autojunk=False).get_opcodes()
    return [[i1, i2 - i1, [list(x) for x in cur[j1:j2]]] for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def encode(tables: dict[str, dict]) -> dict:
    """The content of server_flags.json for these releases (given oldest first): the first
    one's flags whole, each later one's as edits from the one before."""
    out, previous = [], None
    for v, t in tables.items():
        entry = {"version": v, "wheel": t["wheel"], "server_args_sha256": t["server_args_sha256"],
                 "algorithms": [t["algorithm"]["checked_by"], list(t["algorithm"]["names"])]}
        pairs = _pairs(t)
        if previous is None:
            entry["flags"] = pairs
        else:
            entry["edits"] = _edits(previous, pairs)
        out.append(entry)
        previous = pairs
    return {"generated_by": "python -m diag.engines.sglang.server_flags_gen " + " ".join(tables),
            "releases": out}


def render(tables: dict[str, dict]) -> str:
    """The text of server_flags.json: one release per block, one flag or edit per line."""
    data = encode(tables)
    lines = ["{", f'  "generated_by": {json.dumps(data["generated_by"])},', '  "releases": [']
    for i, r in enumerate(data["releases"]):
        lines.append("    {")
        lines += [f'      {json.dumps(k)}: {json.dumps(r[k])},' for k in ("version", "wheel", "server_args_sha256",
                                                                        "algorithms")]
        key = "flags" if "flags" in r else "edits"
        items = [f"        {json.dumps(x)}" for x in r[key]]
        lines.append(f'      "{key}": [' + ("" if items else "]"))
        if items:
            lines += [x + "," for x in items[:-1]] + [items[-1], "      ]"]
        lines.append("    }" + ("," if i + 1 < len(data["releases"]) else ""))
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def check(versions: list[str]) -> list[str]:
    """Where the packaged server_flags.json differs from the wheels of `versions` (default:
    the releases it holds), one line per difference; [] when it matches."""
    held = server_flags.load()
    versions = versions or list(held)
    problems = [f"{v}: not in {TABLE_FILE.name}" for v in versions if v not in held]
    for v in (v for v in versions if v in held):
        t, mine = extract(v), held[v]
        if (t["wheel"], t["server_args_sha256"]) != (mine["wheel"], mine["server_args_sha256"]):
            problems.append(f"{v}: wheel {t['wheel']} / {t['server_args_sha256'][:12]} differs from "
                            f"{mine['wheel']} / {mine['server_args_sha256'][:12]}")
        if [t["algorithm"]["checked_by"], list(t["algorithm"]["names"])] != mine["algorithms"]:
            problems.append(f"{v}: --speculative-algorithm names differ: wheel {t['algorithm']}, "
                            f"file {mine['algorithms']}")
        wheel_flags, file_flags = dict(tuple(x) for x in _pairs(t)), dict(mine["flags"])
        if wheel_flags != file_flags:
            gone = sorted(set(file_flags.items()) - set(wheel_flags.items()), key=str)
            new = sorted(set(wheel_flags.items()) - set(file_flags.items()), key=str)
            problems.append(f"{v}: flags differ: only in the file {gone[:5]}, only in the wheel {new[:5]}")
    return problems


def main(argv: list[str]) -> int:
    """`VERSION ...` rewrites server_flags.json; `--check [VERSION ...]` compares it with the
    wheels and exits 1 on any difference."""
    if argv[:1] == ["--check"]:
        problems = check(argv[1:])
        print("\n".join(problems) if problems else f"{TABLE_FILE.name} matches the wheels")
        return 1 if problems else 0
    tables = {v: extract(v) for v in argv}
    TABLE_FILE.write_text(render(tables))
    counts = ", ".join(f"{v}: {len(_pairs(t))} option strings" for v, t in tables.items())
    print(f"wrote {TABLE_FILE} ({counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
