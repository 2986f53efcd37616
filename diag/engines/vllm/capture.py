"""Which hidden states a vLLM release feeds an EAGLE-3 drafter, from table.py's rows.

Residual-stream index r as in diag/layouts.py: r = 0 is the embeddings ("embed"), r = i the
state entering decoder layer i ("L{i}"), r = N the last layer's output before the final norm.
vLLM reads ids literally, r = id (no +1, unlike SGLang's Llama rule); what differs by release
is which ids work and whether the drafter's ids are read at all. Worked examples, N = 6:
    vllm-0.32.0 llama  ids [0, 2, 4]  -> embed+L2+L4
    vllm-0.32.0 llama  ids [4, 2, 0]  -> embed+L2+L4      (ascending layer order, whatever the order given)
    vllm-0.32.0 llama  ids None       -> the default (2, 6 // 2, 6 - 3) = (2, 3, 3) -> L2+L3 (one state for
                                         the repeated id: a 3-state drafter's fc then does not fit)
    vllm-0.17.1 llama  ids [0, 2, 4]  -> DiagError: id 0 raises TypeError at the first forward
    vllm-0.11.0 llama  ids [0, 2, 4]  -> L2+L3 (the ids are ignored; the default is served)
    vllm-0.17.1 llama  ids [2, 4, 6]  -> DiagError: id 6 = N is never captured (one state short)
This module knows ids and the rule rows; nothing about config files or drafter weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.engines.vllm.releases import VllmRelease, rule, rule_row, span, vllm_release
from diag.errors import DiagError

FAMILIES = ("llama", "qwen3", "deepseek")


@dataclass(frozen=True)
class Served:
    """The layout a vLLM release serves, and why."""

    release: VllmRelease
    family: str
    ids: tuple[int, ...]          # the ids vLLM sets (after the default / ignoring rule)
    layout: str                   # "embed+L2+L4"
    reason: str                   # the rule in words, with its release range


def default_ids(family: str, num_layers: int, eng: str | VllmRelease | None) -> tuple[int, ...]:
    """The release's default aux ids, evaluated from the expression read out of the wheel:
    "(2, num_layers // 2, num_layers - 3)" at N = 61 -> (2, 30, 58)."""
    expr = rule(f"aux_default.{family}", eng)
    if not expr.startswith("("):
        raise DiagError(f"{vllm_release(eng).label} has no EAGLE-3 for this model family", field="family",
                        expected="a family vLLM captures for", found=family, hint=expr)
    return tuple(eval(compile(expr, "<table.py>", "eval"), {"__builtins__": {}}, {"num_layers": num_layers}))


def _point(r: int) -> str:
    return "embed" if r == 0 else f"L{r}"


def served(family: str, ids, num_layers: int, eng: str | VllmRelease | None) -> Served:
    """The layout this release serves to the drafter given the drafter config's ids (None: absent)."""
    if family not in FAMILIES:
        raise DiagError("unknown model family for vLLM's EAGLE-3 capture", field="family",
                        expected=" or ".join(FAMILIES), found=repr(family))
    r = vllm_release(eng)
    cap = rule_row(f"aux_capture.{family}", r)
    if len(cap.value) == 1:
        raise DiagError(f"{r.label} has no EAGLE-3 capture for {family} models", field="engine",
                        expected=f"a release where vllm/{cap.source} captures aux hidden states",
                        found=f"{r.version} ({span(cap)}: {cap.value[0]})")
    source = rule_row("aux_ids_source", r)
    given = tuple(int(i) for i in ids) if ids else None
    if given is None or "ignored" in source.value[0]:
        used, why = default_ids(family, num_layers, r), "the model's default " + rule(f"aux_default.{family}", r)
        if given is not None:
            why += f"; vLLM {span(source)} ignores the drafter's ids {list(given)}"
    else:
        used, why = given, f"the drafter's eagle_aux_hidden_state_layer_ids read literally (vLLM {span(source)})"
    for i in used:
        if i == 0 and "TypeError" in cap.value[1]:
            raise DiagError(f"{r.label} cannot serve aux id 0 to a {family} target",
                            field="eagle_aux_hidden_state_layer_ids",
                            expected="ids >= 1 (the embeddings are capturable from vLLM 0.18.0 for Llama/Qwen3)",
                            found=list(used), hint=f"{cap.source} ({span(cap)}): {cap.value[1]}")
        if i == num_layers and "never captured" in cap.value[2]:
            raise DiagError(f"{r.label} never captures aux id {num_layers} (= num_layers) of a {family} target",
                            field="eagle_aux_hidden_state_layer_ids", expected=f"ids < {num_layers}",
                            found=list(used), hint=f"{cap.source} ({span(cap)}): {cap.value[2]}")
        if not 0 <= i <= num_layers:
            raise DiagError("aux layer id out of range", field="eagle_aux_hidden_state_layer_ids",
                            expected=f"0..{num_layers}", found=list(used))
    order = sorted(set(used))
    return Served(r, family, tuple(used), "+".join(_point(i) for i in order), why)
