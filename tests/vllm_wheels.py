"""vLLM's own functions, from its released wheels, loaded without importing `vllm`.

The files come from diag.engines.vllm.wheels (HTTP range reads, cached under
$DIAG_CACHE_DIR/vllm-wheels/<version>/). `load` parses one file with `ast` and executes only the
named top-level definitions (plus the file's int constants) in a namespace holding torch, numpy,
triton and tl; Triton kernels run on the CPU under TRITON_INTERPRET=1 (sglang_wheels.interpreting).
Worked example:
    ns = load("0.32.0", "vllm/v1/sample/rejection_sampler.py", ["rejection_greedy_sample_kernel"])
    ns["rejection_greedy_sample_kernel"][(batch,)](**kwargs)     # under interpreting()
This module is test support: it knows files and ast; nothing else of diag.
"""

from __future__ import annotations

import ast
import sys
import types
from functools import lru_cache

from sglang_wheels import interpreting

from diag.engines.vllm import wheels


@lru_cache(maxsize=None)
def _tree(version: str, rel: str) -> ast.Module:
    text = wheels.read_text(version, rel)
    if text is None:
        raise FileNotFoundError(f"vllm {version} has no {rel}")
    return ast.parse(text, filename=f"vllm-{version}/{rel}")


def _find(tree: ast.Module, name: str) -> ast.stmt | None:
    owner, _, member = name.rpartition(".")
    body = tree.body
    if owner:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        body, name = ([] if cls is None else cls.body), member
    return next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)


def _constants(tree: ast.Module) -> list[ast.stmt]:
    """Top-level NAME = <int literal> assignments (PLACEHOLDER_TOKEN_ID = -1, ...)."""
    return [n for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, (ast.Constant, ast.UnaryOp))
            and all(isinstance(t, ast.Name) for t in n.targets)]


def _range(*bounds):
    """`range` for interpreted kernels: triton 3.4's interpreter hands `range(n)` a loaded scalar
    as a 1-element array (vLLM's kernels loop `for pos in range(num_draft_tokens)`)."""
    import builtins
    return builtins.range(*(int(b.handle.data.reshape(-1)[0]) if hasattr(b, "handle") else int(b) for b in bounds))


def load(version: str, rel: str, names, *, triton: bool = False, extra: dict | None = None) -> dict:
    """Execute the named definitions of vllm/<rel>; KeyError if one is missing."""
    import numpy as np
    import torch
    tree = _tree(version, rel)
    nodes = _constants(tree)
    for name in names:
        node = _find(tree, name)
        if node is None:
            raise KeyError(f"vllm {version} {rel} has no {name}")
        nodes.append(node)
    # a registered module, so that @dataclass (which looks its class's module up) works
    mod = types.ModuleType(f"vllm_{version.replace('.', '_')}_{rel.replace('/', '_').removesuffix('.py')}")
    sys.modules[mod.__name__] = mod
    ns = mod.__dict__
    ns.update({"torch": torch, "np": np, **(extra or {})})
    with interpreting(triton):
        if triton:
            import triton as tr
            import triton.language as tl
            ns.update(triton=tr, tl=tl, range=_range)
        exec(compile(ast.Module(body=nodes, type_ignores=[]), f"vllm-{version}/{rel}", "exec"), ns)
    return ns


def load_module(version: str, rel: str, ns: dict, *, skip=()) -> dict:
    """Execute every top-level statement of vllm/<rel> but its imports (and the names in `skip`)
    in `ns`, under TRITON_INTERPRET=1: a module of Triton helpers whose imports the caller gives."""
    tree = _tree(version, rel)
    body = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))
            and getattr(n, "name", None) not in skip]
    with interpreting(True):
        exec(compile(ast.Module(body=body, type_ignores=[]), f"vllm-{version}/{rel}", "exec"), ns)
    return ns
