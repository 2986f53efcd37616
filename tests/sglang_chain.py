"""SGLang's draft-tree chain, per version, from its own wheel source (tests/sglang_wheels.py):
select_top_k_tokens -> organize_draft_results -> build_tree_kernel_efficient ->
verify_tree_greedy_func, run on the CPU.

The two kernels: since 0.5.15 the wheel carries Triton versions of build_tree and
verify_tree_greedy (srt/speculative/triton_ops/spec_tree.py, then kernels/ops/speculative/
spec_tree.py) behind `_is_xpu`; the namespace sets `_is_xpu = True` so the version's own
dispatch reaches them, run under TRITON_INTERPRET=1. Up to 0.5.14 the wheel calls
sgl_kernel's CUDA ops only; those versions run their own Python (draft selection, tree
wrappers, dispatch) with the CUDA ops bound to the Triton port of the earliest wheel that
has one (0.5.15; the Triton kernels are byte-identical from 0.5.15 to 0.5.23), and the
CUDA kernels themselves are checked against sgl-kernel's own golden vectors
(tests/sglang_golden.py). `kernel_origin(version)` says which applies.

The interpreted kernels are slow (a Python call per Triton op), so each launch is
memoized on (the source of the launcher and its kernel, the launch's inputs): a version
whose Python parts hand the same kernel code the same inputs gets the outputs that code
computed, copied into its own output tensors.

Shapes (SGLang's names): P trees, topk K, spec_steps S, num_verify_tokens D.
This module is test support; it knows SGLang's functions and tensors, nothing about diag.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import types
from dataclasses import dataclass
from functools import lru_cache

import torch

import sglang_wheels as wheels

TRITON_FROM = "0.5.15"
_FLAGS = {"_is_npu": False, "_is_xpu": True, "_is_cpu": False, "_is_cuda": False, "_is_hip": False,
          "_is_musa": False}


def _present(version: str, rel: str, names) -> list[str]:
    return [n for n in names if wheels.definition_source(version, rel, n) is not None]


def kernel_file(version: str) -> str | None:
    for rel in ("kernels/ops/speculative/spec_tree.py", "srt/speculative/triton_ops/spec_tree.py"):
        if wheels.has(version, rel):
            return rel
    return None


def kernel_origin(version: str) -> str:
    return version if kernel_file(version) else TRITON_FROM


_KERNEL_NAMES = ("TreeMaskMode", "sgl_build_tree_kernel_efficient_triton",
                 "verify_tree_greedy_kernel_triton", "sgl_build_tree_kernel_triton",
                 "verify_tree_greedy_triton", "build_tree_kernel_efficient_func",
                 "verify_tree_greedy_func")
_EAGLE_NAMES = ("TreeMaskMode", "organize_draft_results", "sgl_build_tree_kernel_triton",
                "verify_tree_greedy_triton", "build_tree_kernel_efficient", "verify_tree_greedy_func")
_SPEC_NAMES = ("_select_top_k_tokens_first", "_select_top_k_tokens_later", "select_top_k_tokens")


def _stub_platform() -> dict:
    def refuse(*a, **k):
        raise AssertionError("the namespace took a non-Triton kernel path")
    return {"maybe_detect_oob": lambda *a, **k: None, "reject_out_of_tree_path": refuse,
            "current_platform": None, "logger": None}


_LAUNCHES: dict = {}


def _fingerprint(args) -> tuple:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((tuple(a.shape), str(a.dtype), hashlib.sha256(a.contiguous().numpy().tobytes()).hexdigest()))
        else:
            out.append(repr(a))
    return tuple(out)


def _memoized(launcher, code: str, outputs: tuple[str, ...], write_only: tuple[str, ...] = ()):
    """Wrap a Triton launcher whose `outputs` arguments it writes in place; `write_only`
    outputs (every element written, e.g. positions from torch.empty) stay out of the key."""
    import inspect
    names = list(inspect.signature(launcher).parameters)

    def run(*args, **kwargs):
        bound = dict(zip(names, args), **kwargs)
        key = (code, _fingerprint([bound[n] for n in names if n in bound and n not in write_only]))
        if key not in _LAUNCHES:
            launcher(*args, **kwargs)
            _LAUNCHES[key] = {n: bound[n].clone() for n in outputs}
        for n in outputs:
            bound[n].copy_(_LAUNCHES[key][n])
    return run


def _memoize_kernels(ns: dict, sources: dict[str, str]) -> None:
    build_src = sources["sgl_build_tree_kernel_triton"] + sources["sgl_build_tree_kernel_efficient_triton"]
    verify_src = sources["verify_tree_greedy_triton"] + sources["verify_tree_greedy_kernel_triton"]
    ns["sgl_build_tree_kernel_triton"] = _memoized(
        ns["sgl_build_tree_kernel_triton"], build_src,
        ("tree_mask", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling"),
        write_only=("positions",))
    ns["verify_tree_greedy_triton"] = _memoized(
        ns["verify_tree_greedy_triton"], verify_src, ("predicts", "accept_index", "accept_token_num"))


@dataclass(frozen=True)
class Chain:
    version: str
    ns: dict
    code_key: str           # hash of every definition run: equal keys run equal code

    def __getattr__(self, name):
        return self.ns[name]


def _load(version: str, rel: str, names, ns: dict, sources: dict) -> list[str]:
    present = _present(version, rel, names)
    wheels.load(version, rel, present, ns, triton=True)
    sources.update({n: wheels.definition_source(version, rel, n) for n in present})
    return present


@lru_cache(maxsize=None)
def chain(version: str) -> Chain:
    """The namespace holding this version's chain (see the module docstring)."""
    ns = {**_FLAGS, **_stub_platform()}
    kernel_sources: dict[str, str] = {}
    kv = kernel_origin(version)
    _load(kv, kernel_file(kv), _KERNEL_NAMES, ns, kernel_sources)
    if kv != version:       # the port's launchers live in its eagle_utils.py
        _load(kv, "srt/speculative/eagle_utils.py",
              ("TreeMaskMode", "sgl_build_tree_kernel_triton", "verify_tree_greedy_triton"), ns, kernel_sources)
    own: dict[str, str] = {}
    _load(version, "srt/utils/common.py", ["fast_topk"], ns, own)
    _load(version, "srt/speculative/spec_utils.py", _SPEC_NAMES, ns, own)
    enames = _EAGLE_NAMES
    if kv != version:       # no Triton in this wheel: its CUDA calls go to the Triton port
        enames = [n for n in enames if n not in ("sgl_build_tree_kernel_triton", "verify_tree_greedy_triton")]
        ns.update(_is_cuda=True, _is_xpu=False)
    _load(version, "srt/speculative/eagle_utils.py", enames, ns, own)
    launchers = {**kernel_sources, **{k: v for k, v in own.items() if k in kernel_sources or k in
                                      ("sgl_build_tree_kernel_triton", "verify_tree_greedy_triton")}}
    _memoize_kernels(ns, launchers)
    if kv != version:
        ns["sgl_build_tree_kernel_efficient"] = ns["sgl_build_tree_kernel_triton"]
    key = hashlib.sha256("\0".join(f"{k}\1{v}" for k, v in sorted({**kernel_sources, **own}.items()))
                         .encode()).hexdigest()[:16]
    return Chain(version, ns, key)


@contextlib.contextmanager
def _cuda_verify_stub(ch: Chain):
    """Up to 0.5.14, verify_tree_greedy_func does `from sgl_kernel import verify_tree_greedy`
    (kwargs retrive_*): answer it with the Triton port, for the duration of the call."""
    if kernel_origin(ch.version) == ch.version:
        yield
        return
    port = ch.ns["verify_tree_greedy_triton"]
    mod = types.ModuleType("sgl_kernel")
    mod.verify_tree_greedy = lambda retrive_index, retrive_next_token, retrive_next_sibling, **kw: port(
        retrieve_index=retrive_index, retrieve_next_token=retrive_next_token,
        retrieve_next_sibling=retrive_next_sibling, **kw)
    old = sys.modules.get("sgl_kernel")
    sys.modules["sgl_kernel"] = mod
    try:
        yield
    finally:
        if old is None:
            sys.modules.pop("sgl_kernel", None)
        else:
            sys.modules["sgl_kernel"] = old


def draft(ch: Chain, probs: list[torch.Tensor], topk: int):
    """SGLang's draft loop (eagle_worker.draft_forward) over given distributions.
    probs[0] [P, V]; probs[s] [P*K, V] for s >= 1 (row p*K + r follows beam row r).
    Returns (score_list, token_list, parents_list)."""
    P = probs[0].shape[0]
    hidden = torch.zeros(P, 1)
    scores = None
    score_list, token_list, parents_list = [], [], []
    for i, p in enumerate(probs):
        topk_p, topk_index = ch.fast_topk(p, topk, dim=-1)
        _, hidden, scores, info = ch.select_top_k_tokens(i, topk_p, topk_index, hidden, scores, topk)
        score_list.append(info[0])
        token_list.append(info[1])
        parents_list.append(info[2])
    return score_list, token_list, parents_list


def build(ch: Chain, score_list, token_list, parents_list, bonus, seq_lens, topk: int, steps: int,
          num_draft_tokens: int):
    """organize_draft_results + build_tree_kernel_efficient -> (positions [P*D],
    retrieve_index [P, D], next_token [P, D], next_sibling [P, D], draft_tokens [P*D])."""
    parent_list, top_idx, tokens = ch.organize_draft_results(score_list, token_list, parents_list,
                                                             num_draft_tokens)
    with wheels.interpreting():
        out = ch.build_tree_kernel_efficient(bonus, parent_list, top_idx, tokens, seq_lens,
                                             int(seq_lens.sum()), topk, steps, num_draft_tokens)
    _, positions, r_index, r_next, r_sib, draft_tokens = out
    return positions, r_index, r_next, r_sib, draft_tokens


def verify(ch: Chain, candidates, r_index, r_next, r_sib, target_predict, steps: int):
    """verify_tree_greedy_func as EagleVerifyInput.verify calls it (greedy) ->
    (predicts [P*D], accept_index [P, S+1], accept_token_num [P])."""
    P, D = candidates.shape
    predicts = torch.full((P * D,), -1, dtype=torch.int32)
    accept_index = torch.full((P, steps + 1), -1, dtype=torch.int32)
    accept_num = torch.zeros(P, dtype=torch.int32)
    with wheels.interpreting(), _cuda_verify_stub(ch):
        return ch.verify_tree_greedy_func(predicts, accept_index, accept_num, candidates, r_index,
                                          r_next, r_sib, target_predict)


def parents_from_links(r_next: torch.Tensor, r_sib: torch.Tensor) -> torch.Tensor:
    """SGLang's child/sibling links -> a parents array [P, D] (-1: root or unlinked).
    Example: next_token [1, 3, -1, -1], next_sibling [-1, 2, -1, -1] -> parents [-1, 0, 0, 1]."""
    P, D = r_next.shape
    parents = torch.full((P, D), -1, dtype=torch.long)
    for p in range(P):
        for node in range(D):
            child = int(r_next[p, node])
            while child != -1:
                parents[p, child] = node
                child = int(r_sib[p, child])
    return parents
