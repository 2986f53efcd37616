"""Layer-id conventions: what a list of layer ids means in each engine or trainer.

Engines and trainers write EAGLE-3 auxiliary layer ids differently. This module
turns ids into capture points (DESIGN.md §2) under a named, versioned rule and
back, and lists every convention's reading of the same ids side by side.

Residual-stream index r of a capture point: embed -> 0, L{i} -> i (the state
*entering* decoder layer i, i.e. the output of layer i-1). Every rule below is
"r = id + shift" with a per-convention shift and a capturable range of r.

Worked examples (Kimi-K2.5, N = 61 layers):
  sglang-llama    [2, 30, 58] -> r = [3, 31, 59]  -> L3+L31+L59
  sglang-llama    [-1, 2, 30] -> r = [0, 3, 31]   -> embed+L3+L31 (0.5.22+; before: TypeError)
  sglang-deepseek [2, 30, 58] -> first id != 1, r = ids -> L2+L30+L58
  sglang-deepseek [1, 29, 57] -> first id == 1, r = ids+1 -> L2+L30+L58
  sglang-deepseek [0, 3, 31]  -> first id != 1, r = ids -> embed+L3+L31 (0.5.14+)
  sglang-deepseek-pre-0.5.13 [2, 30, 58] -> r = ids+1 -> L3+L31+L59 (always +1, as Llama)
  sglang default  (no ids)    -> r = [2, 61//2, 61-3] -> L2+L30+L58
  specforge       default ids [1, 61//2-1, 61-4] = [1, 29, 57] -> L2+L30+L58
  speculators     default ids [2, 30, 58, 61] -> L2+L30+L58+L61

This module holds the machinery (resolve, to_ids, readings) and the conventions of trainers and
of engines without a package here (eagle-reference, specforge, speculators); an engine
package registers its own (the SGLang ones, one per version range in which the rule held, are
diag/engines/sglang/conventions.py, vLLM's diag/engines/vllm/conventions.py; which one a
release applies to which target is its capture.py). This module knows ids, shifts and ranges;
it knows nothing about config files, drafter weights, launch flags or which convention a given
deployment uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

from diag.engines import FAMILIES
from diag.errors import DiagError
from diag.layouts import Layout, point


@dataclass(frozen=True)
class Term:
    """One default index as data: value = N * num // den + add.
    Example, N = 61: Term(1, 2, -1) -> 61 * 1 // 2 - 1 = 29."""

    num: int
    den: int
    add: int

    def at(self, num_layers: int) -> int:
        return num_layers * self.num // self.den + self.add


_TWO = Term(0, 1, 2)          # 2
_HALF = Term(1, 2, 0)         # N // 2
_N_MINUS_3 = Term(1, 1, -3)   # N - 3
_N = Term(1, 1, 0)            # N


@dataclass(frozen=True)
class Convention:
    """One named reading of layer ids. r = id + shift; with `first_one_shift`
    the shift is 1 only when the first id in list order equals 1, else 0.
    Capturable r lies in [min_index, N + max_from_n]."""

    name: str
    version: str            # engine / trainer versions the rule was read from
    source: str             # file the rule was read from
    meaning: str            # the rule in words
    shift: int
    first_one_shift: bool   # SGLang >= 0.5.13 DeepSeek-family quirk
    ascending: bool         # engine concatenates in ascending layer order
    min_index: int
    max_from_n: int         # -1: r <= N-1 (captured inside the layer loop); 0: r <= N
    default: tuple[Term, ...]
    default_are_ids: bool   # True: default terms are ids (shift applies); False: r directly
    reads_ids: bool = True  # False: the convention ignores any ids (SGLang without nested ids)


DEFAULT_TERMS = (_TWO, _HALF, _N_MINUS_3)    # [2, N//2, N-3]: SGLang's, vLLM's and EAGLE's default

# Conventions of trainers and of engines without a package here; an engine package adds its own
# with register() (diag/engines/<family>/conventions.py), and those come first in every listing,
# in registry order.
OTHERS: dict[str, Convention] = {
    # SafeAILab/EAGLE eagle/model/modeling_llama_kv.py: appends hidden_states
    # entering layer idx for idx in {2, N//2, N-3} -> L{id}.
    "eagle-reference": Convention(
        "eagle-reference", "EAGLE-3 reference", "eagle/model/modeling_llama_kv.py",
        "id i captures the input of layer i, L{i}", 0, False, False,
        0, -1, DEFAULT_TERMS, True),
    # SpecForge specforge/modeling/target/eagle3_target_model.py: ids are
    # output-of-layer ids (SGLang-style +1); default aux_hidden_states_layers
    # [1, N//2 - 1, N - 4]. Id N-1 would be HF hidden_states[N] (already
    # final-normed), so ids stop at N-2 -> L{N-1}.
    "specforge": Convention(
        "specforge", "SpecForge 0.2.0", "specforge/modeling/target/eagle3_target_model.py",
        "id i captures the output of layer i, L{i+1}", 1, False, False,
        1, -1, (Term(0, 1, 1), Term(1, 2, -1), Term(1, 1, -4)), True),
    # speculators (vllm-project/speculators) Eagle3 configs: ids are vLLM input
    # indices, L{id}; id N is allowed and means the output of the last layer.
    # Default [2, N//2, N-3, N].
    "speculators": Convention(
        "speculators", "speculators 0.9.0", "src/speculators/models/eagle3.py",
        "id i captures the input of layer i, L{i}; id N is the last layer's output", 0, False,
        False, 0, 0, (_TWO, _HALF, _N_MINUS_3, _N), True),
}


@dataclass(frozen=True)
class Resolution:
    """ids read under one rule. `ids` are the ids as given (None: defaults
    applied). `conventions` lists every convention that reads to this layout
    (readings() fills it; resolve() gives just the one)."""

    layout: Layout
    convention: str
    rule: str
    ids: tuple[int, ...] | None
    conventions: tuple[str, ...] = ()


_REGISTERED: dict[str, dict[str, Convention]] = {}     # family -> its conventions by name


def register(family: str, conventions: dict[str, Convention]) -> None:
    """An engine package's own conventions (called when its conventions module is imported)."""
    _REGISTERED.setdefault(family, {}).update(conventions)


def all_conventions() -> dict[str, Convention]:
    """Every convention by name: the engines' (in registry order), then OTHERS. Importing each
    registered family's rules module imports its conventions, which registers them."""
    for module in FAMILIES.values():
        import_module(module)
    return {**{name: c for family in FAMILIES for name, c in _REGISTERED.get(family, {}).items()}, **OTHERS}


def get(name: str) -> Convention:
    """The named convention, or a DiagError listing the known ones."""
    known = all_conventions()
    if name not in known:
        raise DiagError("unknown layer-id convention", field="convention",
                        expected=", ".join(known), found=repr(name))
    return known[name]


def _shift(conv: Convention, ids: list[int]) -> int:
    """sglang-deepseek: [1, 29, 57] -> 1; [2, 30, 58] -> 0; [30, 1] -> 0 (list order)."""
    if conv.first_one_shift:
        return 1 if ids[0] == 1 else 0
    return conv.shift


def _check_ids(ids: list[int], conv: Convention) -> list[int]:
    if not ids:
        raise DiagError("empty layer-id list", field="eagle_aux_hidden_state_layer_ids",
                        expected="at least one layer id", found="[]")
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        raise DiagError("layer ids must be integers", field="eagle_aux_hidden_state_layer_ids",
                        expected="a list of integers", found=repr(ids))
    if len(set(ids)) != len(ids):
        raise DiagError(f"a layer id appears twice ({conv.name} would capture it once)",
                        field="eagle_aux_hidden_state_layer_ids", expected="distinct ids",
                        found=repr(ids))
    return list(ids)


def _indices(conv: Convention, ids: list[int] | None, num_layers: int) -> list[int]:
    """Residual indices r, in the convention's concatenation order."""
    if ids is None or not conv.reads_ids:
        terms = [t.at(num_layers) for t in conv.default]
        idx = [t + conv.shift for t in terms] if conv.default_are_ids else terms
    else:
        idx = [i + _shift(conv, ids) for i in ids]
    return sorted(idx) if conv.ascending else idx


def _check_range(conv: Convention, idx: list[int], ids: object, num_layers: int) -> None:
    top = num_layers + conv.max_from_n
    bad = [r for r in idx if r < conv.min_index or r > top]
    if bad:
        raise DiagError(
            f"{conv.name} cannot capture residual index {bad[0]} of a {num_layers}-layer target "
            f"({conv.version}, {conv.source})", field="eagle_aux_hidden_state_layer_ids",
            expected=f"ids mapping into L{conv.min_index}..L{top} ({conv.meaning})",
            found=repr(ids))


def _layout_of(idx: list[int]) -> Layout:
    return Layout(tuple(point(f"L{r}") for r in idx))


def _rule_text(conv: Convention, ids: list[int] | None, lay: Layout, num_layers: int) -> str:
    """A sentence naming the rule and the version, e.g. 'sglang-llama (SGLang
    0.5.23, python/sglang/srt/models/llama.py): id i captures ...; [2, 30, 58] -> L3+L31+L59'."""
    head = f"{conv.name} ({conv.version}, {conv.source}): {conv.meaning}"
    if ids is None or not conv.reads_ids:
        given = "ignored ids" if ids is not None else "no ids"
        what = "default ids " if conv.default_are_ids else "default capture indices "
        vals = [t.at(num_layers) for t in conv.default]
        return f"{head}; {given}, {what}{vals} for N={num_layers} -> {lay}"
    order = ""
    if conv.ascending and list(ids) != sorted(ids):
        order = " (concatenated in ascending layer order, not list order)"
    return f"{head}; {list(ids)} -> {lay}{order}"


def resolve(ids: list[int] | None, convention: str, num_layers: int) -> Resolution:
    """Capture points for `ids` under `convention` on an N-layer target.
    ids None means "no ids given": the convention's defaults apply."""
    conv = get(convention)
    if num_layers < 1:
        raise DiagError("target must have at least one layer", field="num_hidden_layers",
                        expected=">= 1", found=num_layers)
    checked = None if ids is None else _check_ids(list(ids), conv)
    idx = _indices(conv, checked, num_layers)
    if len(set(idx)) != len(idx):  # N = 6: sglang default [2, 6//2, 6-3] = [2, 3, 3]
        raise DiagError(f"{conv.name} defaults repeat a layer on a {num_layers}-layer target",
                        field="eagle_aux_hidden_state_layer_ids", expected="distinct layers",
                        found=idx, hint="give explicit ids in eagle_config")
    _check_range(conv, idx, ids if ids is not None else "defaults", num_layers)
    lay = _layout_of(idx)
    return Resolution(lay, conv.name, _rule_text(conv, checked, lay, num_layers),
                      None if checked is None else tuple(checked), (conv.name,))


def to_ids(layout: Layout, convention: str, num_layers: int) -> list[int] | None:
    """Ids that make `convention` capture exactly `layout`, or None when it
    cannot (e.g. `final` anywhere; a non-ascending layout under SGLang; L1 first
    under sglang-deepseek, whose id 1 would trigger the +1 shift; a point
    outside the capturable range; any layout under sglang-default)."""
    conv = get(convention)
    if not conv.reads_ids or any(p.is_final for p in layout.points):
        return None
    idx = [p.index for p in layout.points]
    if conv.ascending and idx != sorted(idx):
        return None
    if any(r < conv.min_index or r > num_layers + conv.max_from_n for r in idx):
        return None
    ids = [r - conv.shift for r in idx]
    if conv.first_one_shift and ids[0] == 1:
        # id 1 first would trigger the +1 shift; SGLang concatenates in ascending order
        # whatever the list order, so the same points are captured with id 1 moved last.
        # Example (N=4): L1+L2 -> [2, 1] (first id 2: no shift; L2, L1 -> ascending L1+L2).
        if len(ids) == 1 or not conv.ascending:
            return None
        ids = ids[1:] + ids[:1]
    return ids


def readings(ids: list[int], num_layers: int) -> list[Resolution]:
    """Every id-reading convention's layout for the same ids, one entry per
    distinct layout (first-seen order), listing all conventions that agree.
    Conventions that cannot read the ids (out of range) are left out."""
    groups: dict[Layout, list[Resolution]] = {}
    for name, conv in all_conventions().items():
        if not conv.reads_ids:
            continue
        try:
            res = resolve(ids, name, num_layers)
        except DiagError:
            continue
        groups.setdefault(res.layout, []).append(res)
    return [_merge(group) for group in groups.values()]


def _merge(group: list[Resolution]) -> Resolution:
    first = group[0]
    names = tuple(r.convention for r in group)
    rule = " | ".join(r.rule for r in group)
    return Resolution(first.layout, first.convention, rule, first.ids, names)
