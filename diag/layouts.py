"""Capture points and layouts (DESIGN.md §2), as plain values.

A capture point names one hidden state of the target per token:
  embed (= L0)  token embeddings                 hidden_states[0]
  L{i}, 0<i<N   residual stream entering layer i hidden_states[i]
  L{N}          output of the last layer, un-normed (not in hidden_states)
  final         after the final norm             hidden_states[N]
A layout is an ordered list of capture points, written "embed+L3+L31"; the
drafter's fc input is their concatenation in that order.

This module knows names and their order; it knows nothing about models,
engines or layer-id conventions (see diag/engines/conventions.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.errors import DiagError

_POINT = re.compile(r"^(embed|final|L(0|[1-9][0-9]*))$")


@dataclass(frozen=True, order=True)
class CapturePoint:
    """One hidden state per token. `index` is the residual-stream index:
    embed -> 0, L{i} -> i; `final` sorts after every layer (index -1 is
    never used for ordering, see sort_key)."""

    name: str  # canonical: "embed", "L{i}" with i > 0, or "final"

    @property
    def is_final(self) -> bool:
        return self.name == "final"

    @property
    def index(self) -> int:
        """Residual-stream index: embed -> 0, L3 -> 3. `final` has none."""
        if self.is_final:
            raise ValueError("'final' is not a residual-stream index")
        return 0 if self.name == "embed" else int(self.name[1:])

    def sort_key(self, num_layers: int) -> int:
        """embed=0 < L1 < ... < L{N} = N < final = N + 1."""
        return num_layers + 1 if self.is_final else self.index

    def __str__(self) -> str:
        return self.name


def point(text: str, *, field: str = "layout") -> CapturePoint:
    """Parse one capture point. "L0" and "embed" are the same point (canonical
    "embed"); "l3" is accepted as "L3"."""
    raw = text.strip()
    norm = "L" + raw[1:] if raw[:1] == "l" and raw[1:].isdigit() else raw
    if not _POINT.match(norm):
        raise DiagError("not a capture point", field=field,
                        expected="embed, final or L{i} (e.g. L3)", found=repr(text))
    return CapturePoint("embed" if norm == "L0" else norm)


@dataclass(frozen=True)
class Layout:
    """An ordered tuple of capture points, e.g. embed+L3+L31."""

    points: tuple[CapturePoint, ...]

    def __str__(self) -> str:
        return "+".join(p.name for p in self.points)

    def __len__(self) -> int:
        return len(self.points)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.points)

    def check_against(self, num_layers: int, *, field: str = "layout") -> "Layout":
        """Fail if a point lies beyond the model: L{i} needs i <= N."""
        for p in self.points:
            if not p.is_final and p.index > num_layers:
                raise DiagError(f"capture point {p} does not exist in a {num_layers}-layer target",
                                field=field, expected=f"embed, L1..L{num_layers} or final",
                                found=str(self))
        return self

    def sorted(self, num_layers: int) -> "Layout":
        """Ascending residual-stream order (what SGLang concatenates)."""
        return Layout(tuple(sorted(self.points, key=lambda p: p.sort_key(num_layers))))

    def shifted(self, delta: int, num_layers: int) -> "Layout | None":
        """Every layer point moved by delta (embed counts as L0); None if any
        point would leave [0, N] or if the layout holds `final`."""
        if any(p.is_final for p in self.points):
            return None
        moved = [p.index + delta for p in self.points]
        if min(moved) < 0 or max(moved) > num_layers:
            return None
        return Layout(tuple(point(f"L{i}") for i in moved))


def layout(text: str | Layout, *, field: str = "layout") -> Layout:
    """Parse "embed+L3+L31" (also accepts commas: "embed,L3,L31")."""
    if isinstance(text, Layout):
        return text
    parts = [p for p in re.split(r"[+,]", text.strip()) if p.strip()]
    if not parts:
        raise DiagError("empty layout", field=field,
                        expected="capture points joined by '+', e.g. embed+L3+L31", found=repr(text))
    pts = tuple(point(p, field=field) for p in parts)
    if len(set(pts)) != len(pts):
        raise DiagError("a capture point appears twice in the layout", field=field,
                        expected="distinct points", found=repr(text))
    return Layout(pts)


def union_points(layouts: list[Layout]) -> tuple[CapturePoint, ...]:
    """Every point some layout needs, each once, in first-seen order."""
    seen: dict[CapturePoint, None] = {}
    for lay in layouts:
        for p in lay.points:
            seen.setdefault(p, None)
    return tuple(seen)
