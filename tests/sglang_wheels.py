"""SGLang's own source, from its released wheels, loaded without importing `sglang`.

The `sglang` package cannot be imported without its CUDA runtime, so the differential tests
(tests/test_sglang_*.py) take the released wheel of each version (diag.engines.sglang.wheels, the
same cached wheel server_flags_gen reads; the source files the tests read are unpacked once
beside it, under `sglang-wheels/X/`) and load just the top-level definitions they need
with `ast` into a small namespace: `@torch.compile` decorators are dropped, everything the
definitions name from elsewhere in sglang is given as a stub by the caller, and Triton
kernels run on the CPU under TRITON_INTERPRET=1 (set only while they are defined and run).

Worked example:
    ns = load("0.5.23", "srt/models/llama.py", ["LlamaForCausalLM.set_eagle3_layers_to_capture"])
    ns["set_eagle3_layers_to_capture"](fake_self, [2, 30, 58])   # fake_self.model.layers_to_capture
                                                                  # -> [3, 31, 59]
Each file is parsed once per session (lru_cache). This module is test support: it knows
files and ast (the wheels come from diag.engines.sglang.wheels); it knows nothing else of diag.
"""

from __future__ import annotations

import ast
import contextlib
import os
import shutil
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from diag.engines.sglang import wheels

# Source files the differential tests read (paths inside the wheel, under sglang/); a
# version lacks some of them, which the tests treat as a fact about that version.
FILES = (
    "srt/models/llama.py", "srt/models/deepseek_v2.py", "srt/models/kimi_k25.py",
    "srt/models/kimi_vl.py", "srt/models/llama_eagle3.py", "srt/models/kimi_k25_eagle3.py",
    "srt/server_args.py", "srt/arg_groups/speculative_hook.py",
    "srt/speculative/spec_utils.py", "srt/speculative/eagle_utils.py",
    "srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py",
    "srt/speculative/triton_ops/spec_tree.py", "kernels/ops/speculative/spec_tree.py",
    "srt/utils/common.py", "srt/model_executor/model_runner.py",
    "srt/model_executor/cuda_graph_runner.py", "srt/model_executor/runner/base_cuda_graph_runner.py",
    "srt/model_executor/runner/decode_cuda_graph_runner.py",
    "srt/model_executor/model_runner_components/spec_aux_hidden_state.py",
    "srt/model_executor/model_runner_components/attention_backend_setup.py",
    "srt/managers/scheduler_metrics_mixin.py", "srt/observability/scheduler_metrics_mixin.py",
    "srt/managers/scheduler_components/metrics_reporter.py",
)
_MARKER = ".complete"
_FILES_KEY = __import__("hashlib").sha256("\n".join(FILES).encode()).hexdigest()[:12]


def cache_root() -> Path:
    return wheels.wheel_dir()


def _wheel(version: str) -> Path:
    try:
        return wheels.wheel(version)
    except wheels.WheelError as err:
        raise RuntimeError(f"{err}\n(the sglang differential tests need PyPI once per release; "
                           "deselect them with -m 'not sglang')") from err


def source_dir(version: str) -> Path:
    """CACHE/version/sglang/..., holding FILES from the version's wheel (fetched once)."""
    final = cache_root() / version
    marker = final / _MARKER
    if marker.exists() and marker.read_text().endswith(_FILES_KEY):
        return final
    cache_root().mkdir(parents=True, exist_ok=True)
    wheel = _wheel(version)
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        stage = Path(tmp) / "src"
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            for rel in FILES:
                if f"sglang/{rel}" in names:
                    zf.extract(f"sglang/{rel}", stage)
        (stage / _MARKER).write_text(f"{wheel.name} {_FILES_KEY}")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(stage, final)          # atomic: a concurrent session sees all or nothing
    return final


def fetch_all(versions) -> dict[str, Path]:
    """source_dir for every version, four downloads at a time."""
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(versions, pool.map(source_dir, versions)))


@lru_cache(maxsize=None)
def path(version: str, rel: str) -> Path:
    if rel in EXTRA_FILES:
        return extra_file(version, rel)
    return source_dir(version) / "sglang" / rel


# Read by one test each, extracted on first use beside FILES (adding them to FILES would make
# every version's FILES be unpacked again); a version without one is a fact about that version.
EXTRA_FILES = ("srt/managers/schedule_batch.py", "srt/managers/scheduler_components/batch_result_processor.py")


def extra_file(version: str, rel: str) -> Path:
    """CACHE/extra/version/sglang/<rel> from the version's wheel (outside CACHE/version, which
    source_dir replaces whole) (written under a temporary
    name, then renamed: a concurrent session sees all of it or none); a missing path when the
    wheel has no such file."""
    final = cache_root() / "extra" / version / "sglang" / rel
    if final.is_file():
        return final
    with zipfile.ZipFile(_wheel(version)) as zf:
        if f"sglang/{rel}" not in zf.namelist():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=final.parent, suffix=".part")
        with os.fdopen(fd, "wb") as out:
            out.write(zf.read(f"sglang/{rel}"))
    os.replace(tmp, final)
    return final


def has(version: str, rel: str) -> bool:
    return path(version, rel).is_file()


@lru_cache(maxsize=None)
def _tree(file: str) -> ast.Module:
    return ast.parse(_text(file), filename=file)


@lru_cache(maxsize=None)
def _text(file: str) -> str:
    return Path(file).read_text()


@lru_cache(maxsize=None)
def _lines(file: str) -> tuple[str, ...]:
    return tuple(_text(file).splitlines(keepends=True))


def _segment(file: str, node: ast.AST) -> str:
    """ast.get_source_segment without re-splitting the file each time."""
    lines = _lines(file)[node.lineno - 1:node.end_lineno]
    if not lines:
        return ""
    if len(lines) == 1:
        return lines[0].encode()[node.col_offset:node.end_col_offset].decode()
    first = lines[0].encode()[node.col_offset:].decode()
    last = lines[-1].encode()[:node.end_col_offset].decode()
    return first + "".join(lines[1:-1]) + last


def _is_torch_compile(dec: ast.expr) -> bool:
    """@torch.compile, @torch.compile(...)."""
    target = dec.func if isinstance(dec, ast.Call) else dec
    return isinstance(target, ast.Attribute) and target.attr == "compile" and \
        isinstance(target.value, ast.Name) and target.value.id == "torch"


def _find(tree: ast.Module, name: str) -> ast.stmt | None:
    """Top-level def / class / assignment `name`, or "Class.method"."""
    owner, _, member = name.rpartition(".")
    body = tree.body
    if owner:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            return None
        body, name = cls.body, member
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
    return None


@lru_cache(maxsize=None)
def definition_source(version: str, rel: str, name: str) -> str | None:
    """The source text of one definition (None when the version has no such definition)."""
    file = path(version, rel)
    if not file.is_file():
        return None
    node = _find(_tree(str(file)), name)
    return None if node is None else _segment(str(file), node)


def load(version: str, rel: str, names, namespace: dict | None = None, *, triton: bool = False) -> dict:
    """Execute the named definitions of sglang/<rel> in `namespace` (updated in place; a
    fresh dict by default), which also gets torch, math, IntEnum and the typing names, and
    return it. Missing names raise KeyError."""
    import math
    import typing
    from enum import IntEnum

    import torch

    file = path(version, rel)
    tree = _tree(str(file))
    nodes = []
    for name in names:
        node = _find(tree, name)
        if node is None:
            raise KeyError(f"sglang {version} {rel} has no {name}")
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = [d for d in node.decorator_list if not _is_torch_compile(d)]
        nodes.append(node)
    ns = {} if namespace is None else namespace
    base = {"torch": torch, "math": math, "IntEnum": IntEnum, "__name__": f"sglang_{version}",
            **{n: getattr(typing, n) for n in ("List", "Optional", "Tuple", "Union", "Dict", "Any")}}
    for key, value in base.items():
        ns.setdefault(key, value)
    code = compile(ast.Module(body=nodes, type_ignores=[]), str(file), "exec")
    with interpreting(triton):
        if triton:
            import triton as tr
            import triton.language as tl
            ns.setdefault("triton", tr)
            ns.setdefault("tl", tl)
        exec(code, ns)
    return ns


@contextlib.contextmanager
def interpreting(on: bool = True):
    """TRITON_INTERPRET=1 for the block only (other tests in the session must not see it:
    diag's int4 kernel switches on it)."""
    if not on:
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


@lru_cache(maxsize=None)
def statement(version: str, rel: str, kind: type, *needles: str) -> ast.stmt | None:
    """The smallest statement of `kind` (ast.If, ast.Try, ...) in sglang/<rel> whose source
    contains every needle, or None. Example: (ast.If, "speculative_eagle_topk == 1",
    "speculative_num_steps + 1") -> the topk=1 rewrite."""
    file = path(version, rel)
    if not file.is_file() or not all(n in _text(str(file)) for n in needles):
        return None
    best = None
    for node in ast.walk(_tree(str(file))):
        if isinstance(node, kind):
            seg = _segment(str(file), node)
            if all(n in seg for n in needles) and (best is None or len(seg) < best[0]):
                best = (len(seg), node)
    return None if best is None else best[1]


def segment(version: str, rel: str, node: ast.AST) -> str:
    return _segment(str(path(version, rel)), node)


def run_statements(version: str, rel: str, nodes, env: dict) -> dict:
    """Execute SGLang statements (as a function body, so `return` is legal) with `env` as
    its globals; returns env with the body's locals merged in."""
    file = path(version, rel)
    mod = ast.parse("def _sglang_body():\n    return locals()\n")
    fn = mod.body[0]
    fn.body = list(nodes) + fn.body
    mod = ast.fix_missing_locations(mod)
    exec(compile(mod, str(file), "exec"), env)
    env.update(env["_sglang_body"]())
    return env
