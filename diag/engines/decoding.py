"""The decoding a request runs under: greedy, or sampled with temperature, top-p and top-k,
verified with two acceptance thresholds (DESIGN.md §11). Engine-neutral: every family reads the
same Decoding; what a request that sets nothing runs is each family's rule (for SGLang,
diag/engines/sglang/decoding.py).

The ranges, as SGLang 0.5.23 checks them:
- `SamplingParams.verify`: temperature finite and >= 0, top_p in (0, 1], top_k -1 (the whole
  vocabulary) or >= 1. diag refuses temperature <= 0 *given as sampling* (say greedy instead).
- `SamplingParams.__init__`: temperature below 1e-6 (_SAMPLING_EPS) samples with top_k = 1 at
  temperature 1.0, i.e. the argmax; diag's probabilities do the same (replay/sampling.py).
- `--speculative-accept-threshold-single` / `-acc` (server flags, default 1.0): the kernel checks
  both lie in [0, 1]; diag asks for (0, 1] (0 accepts every draft with any mass). Below 1 the
  verification accepts more than the target distribution allows: lossy.
- Greedy requests are verified greedily (`verify_tree_greedy`); thresholds do not apply.

Names are stable axis values: "greedy"; "t1.0-p0.95-k-1"; thresholds appended when either
is below 1: "t1.0-p0.95-k-1-ts0.5-ta0.8". This module knows numbers and names; it knows
nothing about tensors, files or reports.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from diag.errors import DiagError

SAMPLING_EPS = 1e-6            # SGLang _SAMPLING_EPS: below it a temperature means argmax

FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
          "threshold_single": "threshold_single", "threshold_acc": "threshold_acc"}


@dataclass(frozen=True)
class Decoding:
    """temperature None = greedy (thresholds then fixed at 1.0: greedy verification has none)."""

    temperature: float | None = None
    top_p: float = 1.0
    top_k: int = -1
    threshold_single: float = 1.0
    threshold_acc: float = 1.0

    def __post_init__(self):
        check(self.temperature, self.top_p, self.top_k, self.threshold_single, self.threshold_acc)

    @property
    def greedy(self) -> bool:
        return self.temperature is None

    @property
    def lossy(self) -> bool:
        """Thresholds below 1 accept drafts the target distribution would not emit."""
        return not self.greedy and (self.threshold_single < 1.0 or self.threshold_acc < 1.0)

    @property
    def name(self) -> str:
        if self.greedy:
            return "greedy"
        base = f"t{_num(self.temperature)}-p{_num(self.top_p)}-k{self.top_k}"
        if self.threshold_single < 1.0 or self.threshold_acc < 1.0:
            base += f"-ts{_num(self.threshold_single)}-ta{_num(self.threshold_acc)}"
        return base

    def __str__(self) -> str:
        return self.name

    def to_dict(self) -> dict:
        return {"name": self.name, "greedy": self.greedy, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "threshold_single": self.threshold_single,
                "threshold_acc": self.threshold_acc, "lossy": self.lossy}



def _num(x: float) -> str:
    """1 -> "1.0", 0.95 -> "0.95", 1e-7 -> "1e-07": short, and always readable as a float."""
    s = f"{float(x):.6g}"
    return s if any(c in s for c in ".en") else s + ".0"


def _fail(what: str, key: str, expected: str, found, names: dict, file: str | None):
    raise DiagError(f"bad decoding: {what}", file=file, field=names.get(key, key), expected=expected,
                    found=repr(found))


def check(temperature, top_p, top_k, threshold_single, threshold_acc, *, names: dict = FIELDS,
          file: str | None = None) -> None:
    """SGLang's SamplingParams.verify and the threshold range, with diag's field names.
    Example: check(0.0, 1.0, -1, 1.0, 1.0) fails on temperature (say greedy instead)."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool)
    if temperature is not None and (not number(temperature) or not math.isfinite(temperature)
                                    or temperature <= 0):
        _fail("temperature must be > 0 for sampling (use greedy for argmax decoding)", "temperature",
              "a finite number > 0", temperature, names, file)
    if not number(top_p) or not 0.0 < top_p <= 1.0:
        _fail("top_p outside (0, 1]", "top_p", "0 < top_p <= 1", top_p, names, file)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or (top_k < 1 and top_k != -1):
        _fail("top_k must be -1 (whole vocabulary) or >= 1", "top_k", "-1 or an integer >= 1", top_k,
              names, file)
    for key, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if not number(value) or not 0.0 < value <= 1.0:
            _fail(f"{key} outside (0, 1]", key, "0 < threshold <= 1 (1.0: lossless)", value, names, file)


def sampled(temperature, top_p=1.0, top_k=-1, threshold_single=1.0, threshold_acc=1.0, *,
            names: dict = FIELDS, file: str | None = None) -> Decoding:
    """A sampled decoding, checked with the caller's field names (flags or case keys)."""
    check(temperature, top_p, top_k, threshold_single, threshold_acc, names=names, file=file)
    return Decoding(float(temperature), float(top_p), int(top_k), float(threshold_single),
                    float(threshold_acc))


GREEDY = Decoding()

_NAME = re.compile(r"^t([0-9.e+-]+)-p([0-9.e+-]+)-k(-1|[0-9]+)(?:-ts([0-9.e+-]+)-ta([0-9.e+-]+))?$")


def parse_decoding(text: str | Decoding, *, field: str = "decoding") -> Decoding:
    """"greedy" or a name as Decoding.name writes it -> Decoding."""
    if isinstance(text, Decoding):
        return text
    t = str(text).strip()
    if t == "greedy":
        return GREEDY
    m = _NAME.match(t)
    if not m:
        raise DiagError("not a decoding name", field=field,
                        expected="greedy or tT-pP-kK[-tsS-taA], e.g. t1.0-p0.95-k-1", found=repr(text))
    try:
        ts, ta = (float(m[4]), float(m[5])) if m[4] else (1.0, 1.0)
        return sampled(float(m[1]), float(m[2]), int(m[3]), ts, ta, names={k: field for k in FIELDS})
    except ValueError as err:
        raise DiagError("not a decoding name", field=field, expected="numbers in tT-pP-kK",
                        found=repr(text)) from err


def from_values(values: dict, threshold_single: float = 1.0, threshold_acc: float = 1.0, *,
                names: dict = FIELDS, file: str | None = None) -> Decoding:
    """temperature / top_p / top_k as a server resolves them -> Decoding; temperature 0 is greedy."""
    t = values.get("temperature", 1.0)
    if isinstance(t, (int, float)) and not isinstance(t, bool) and t == 0:
        return GREEDY
    return sampled(t, values.get("top_p", 1.0), values.get("top_k", -1), threshold_single, threshold_acc,
                   names=names, file=file)
