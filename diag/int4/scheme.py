"""Which modules a compressed-tensors `quantization_config` quantizes, and the
config JSON itself.

Matching follows compressed-tensors' `match_name` / `is_match`:
  "re:<regex>"  re.match (anchored at the start, not at the end) on the
                full module name
  "<name>"      exact module name
  "<Class>"     a class name in the module's MRO (e.g. "Linear")
A module is quantized when some target matches and no ignore entry does.

Worked examples with KIMI_IGNORE and targets ["Linear"] (all Linear):
  model.layers.3.mlp.experts.7.up_proj        quantized (routed expert)
  model.layers.3.mlp.shared_experts.up_proj   ignored by re:.*shared_experts.*
  model.layers.0.mlp.down_proj                ignored by re:.*mlp\\.(gate|up|gate_up|down)_proj.*
  model.layers.3.self_attn.kv_b_proj          ignored by re:.*self_attn.*
  lm_head                                     ignored by "lm_head" (exact)
Names are the *text model's* module names: in the Kimi-K2.5 wrapper the checkpoint key
`language_model.lm_head.weight` belongs to module `lm_head`, which "lm_head" ignores
(SGLang builds the wrapper's language model with prefix "" for compressed-tensors,
kimi_k25.py; int4/load.py strips the prefix before matching).

This module knows names and JSON; it knows nothing about tensors or files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.errors import DiagError

# Kimi-K2-Instruct / K2-Thinking: only routed experts are INT4.
KIMI_IGNORE: tuple[str, ...] = (
    "lm_head",
    "re:.*self_attn.*",
    "re:.*shared_experts.*",
    r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
)
# Kimi-K2.5 (multimodal wrapper, text weights under `language_model.`): the published
# config.json carries the same list as K2 (real-configs/kimi-k2.5), matched against the
# text model's names; its vision tower and projector are stored dense.
KIMI_K25_IGNORE: tuple[str, ...] = KIMI_IGNORE
LINEAR_CLASSES: tuple[str, ...] = ("Linear", "Module")


def match_name(name: str, pattern: str) -> bool:
    """compressed-tensors semantics: "re:" -> re.match, else equality.
    match_name("a.lm_head", "re:.*lm_head") -> True; ("a.lm_head", "lm_head") -> False."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern == name


def matches(name: str, class_names: tuple[str, ...], patterns: tuple[str, ...] | list[str]) -> bool:
    """True if a pattern matches the module name or one of its class names."""
    return any(match_name(name, p) or p in class_names for p in patterns)


def is_targeted(name: str, class_names: tuple[str, ...], targets, ignore) -> bool:
    """Quantized = some target matches and no ignore entry matches."""
    return matches(name, class_names, targets) and not matches(name, class_names, ignore)


@dataclass(frozen=True)
class Int4Group:
    """One config group: symmetric INT4 weights, per group of columns."""

    name: str
    group_size: int
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Int4Scheme:
    """A parsed pack-quantized config: its groups and the ignore list."""

    groups: tuple[Int4Group, ...]
    ignore: tuple[str, ...]

    def group_for(self, name: str, class_names: tuple[str, ...] = LINEAR_CLASSES) -> Int4Group | None:
        """The config group quantizing module `name`, or None. Several matching
        groups resolve like compressed-tensors: exact name, then regex, then class."""
        if matches(name, class_names, self.ignore):
            return None
        ranked = []
        for g in self.groups:
            for t in g.targets:
                if match_name(name, t):
                    ranked.append((1 if t.startswith("re:") else 0, g))
                elif t in class_names:
                    ranked.append((2, g))
        return min(ranked, key=lambda r: r[0])[1] if ranked else None


def quantization_config(group_size: int = 32, *, targets=("Linear",), ignore=KIMI_IGNORE) -> dict:
    """The `quantization_config` block as compressed-tensors writes it for Kimi."""
    weights = {"actorder": None, "block_structure": None, "dynamic": False,
               "group_size": group_size, "num_bits": 4, "observer": "minmax",
               "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int"}
    group = {"input_activations": None, "output_activations": None,
             "targets": list(targets), "weights": weights}
    return {"config_groups": {"group_0": group}, "format": "pack-quantized",
            "ignore": list(ignore), "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed"}


def _expect(ok: bool, message: str, *, file, field, expected, found) -> None:
    if not ok:
        raise DiagError(message, file=file, field=field, expected=expected, found=found)


def _parse_group(name: str, group: dict, file: str | None) -> Int4Group:
    w = group.get("weights") or {}
    where = f"quantization_config.config_groups.{name}"
    kind = (w.get("num_bits"), w.get("type"), w.get("symmetric"), w.get("strategy"))
    _expect(kind == (4, "int", True, "group"), "unsupported INT4 weight scheme", file=file,
            field=f"{where}.weights", expected="num_bits 4, type int, symmetric, strategy group",
            found=f"num_bits={kind[0]}, type={kind[1]}, symmetric={kind[2]}, strategy={kind[3]}")
    _expect(group.get("input_activations") is None, "activation quantization is not supported",
            file=file, field=f"{where}.input_activations", expected="null",
            found=group.get("input_activations"))
    _expect(group.get("format") in (None, "pack-quantized"), "config group has another format",
            file=file, field=f"{where}.format", expected="pack-quantized", found=group.get("format"))
    gs = w.get("group_size")
    _expect(isinstance(gs, int) and gs > 0, "missing group size", file=file,
            field=f"{where}.weights.group_size", expected="a positive integer", found=gs)
    return Int4Group(name, gs, tuple(group.get("targets") or ()))


def parse_quantization_config(qc: dict, *, file: str | None = None,
                              field: str = "quantization_config") -> Int4Scheme:
    """Validate a compressed `pack-quantized` config and return its scheme."""
    _expect(qc.get("quant_method") == "compressed-tensors", "not a compressed-tensors checkpoint",
            file=file, field=f"{field}.quant_method", expected="compressed-tensors",
            found=qc.get("quant_method"))
    _expect(qc.get("format") == "pack-quantized", "not a pack-quantized checkpoint", file=file,
            field=f"{field}.format", expected="pack-quantized", found=qc.get("format"))
    _expect(qc.get("quantization_status") == "compressed", "weights are not stored compressed",
            file=file, field=f"{field}.quantization_status", expected="compressed",
            found=qc.get("quantization_status"))
    groups = qc.get("config_groups") or {}
    _expect(bool(groups), "no config groups", file=file, field=f"{field}.config_groups",
            expected="at least one group", found=groups)
    parsed = tuple(_parse_group(n, g, file) for n, g in groups.items())
    return Int4Scheme(parsed, tuple(qc.get("ignore") or ()))
