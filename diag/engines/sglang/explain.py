"""Reconcile a server log's "accept len" and "accept rate" (DESIGN.md §1.5, §6).

SGLang logs both numbers with 2 decimals. With L = accept length (bonus
included) = 1 + mean(a), the two rate formulas (accept_rate.py says which version
logs which) reduce to
    sglang_accept_rate (0.5.11–0.5.23)          R = Σa / (rounds·(D-1)) = (L - 1) / (D - 1)
    sglang_accept_rate_legacy (0.5.6–0.5.10.post1) R = Σ(a+1) / (rounds·D) = L / D
so each (D, formula) pair predicts R from L. A pair is consistent when some
true (L, R) inside the printed rounding intervals satisfies it, with the
physical bound 1 <= L <= D (at most D-1 drafts accepted). Each consistent formula
names the SGLang releases the log can come from.

Seed example: L 1.68, R 0.84. Legacy: 1.68 / D ∈ [0.835, 0.845] only for D = 2.
New: 0.68 / (D-1) = 0.84 needs D-1 ≈ 0.81, no integer. So D = 2, legacy: a depth-1
chain on a server at 0.5.10.post1 or older. With flags S=1, K=1, D=16, SGLang's topk=1
rule made D = S+1 = 2.

This module knows arithmetic on logged numbers and SGLang's flag rules (tree_rules.py);
it knows nothing about models or log files.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.errors import DiagError
from diag.engines.sglang.accept_rate import FORMULAS, formula_for, versions_of
from diag.engines.sglang.tree_rules import ResolvedShape, resolve_sglang_shape
from diag.engines.sglang.versions import DEFAULT_ENGINE, engine


@dataclass(frozen=True)
class Explanation:
    accept_len: float
    accept_rate: float
    consistent: tuple[tuple[int, str], ...]   # every (D, formula) that fits the log
    flags: tuple | None                       # (S, K, D) as launched, None if unknown
    resolved: ResolvedShape | None            # what SGLang ran for those flags
    implied: tuple[tuple[int, str], ...]      # consistent pairs at the resolved D
    sentences: tuple[str, ...]
    versions: tuple[str, ...] = ()            # release ranges whose formula fits, e.g. "0.5.6–0.5.10.post1"
    engine: str | None = None                 # the version the user named, if any
    engine_fits: bool | None = None           # whether that version's formula fits

    def to_json(self) -> dict:
        """What `diag explain --json` prints."""
        shape = self.resolved.shape if self.resolved is not None else None
        return {
            "accept_len": self.accept_len, "accept_rate": self.accept_rate,
            "consistent": [{"num_draft_tokens": d, "formula": f} for d, f in self.consistent],
            "flags": None if self.flags is None else dict(zip(
                ("num_steps", "topk", "num_draft_tokens"), self.flags)),
            "runs": None if shape is None else {"num_steps": shape.num_steps, "topk": shape.topk,
                                                "num_draft_tokens": shape.num_draft_tokens},
            "crash": None if self.resolved is None else self.resolved.crash,
            "implied": [{"num_draft_tokens": d, "formula": f} for d, f in self.implied],
            "versions": list(self.versions), "engine": self.engine, "engine_fits": self.engine_fits,
            "sentences": list(self.sentences),
        }


def predicted_rate(accept_len: float, num_draft_tokens: int, formula: str) -> float:
    """R that a formula gives for accept length L and D. L 1.68, D 2 -> legacy 0.84."""
    if formula == "sglang_accept_rate":
        return (accept_len - 1.0) / (num_draft_tokens - 1)
    if formula == "sglang_accept_rate_legacy":
        return accept_len / num_draft_tokens
    raise DiagError("unknown accept-rate formula", field="formula", expected=list(FORMULAS),
                    found=formula)


def _fits(accept_len: float, accept_rate: float, d: int, formula: str, half: float) -> bool:
    """Some L in [L±half] ∩ [1, D] maps into [R±half] (R is monotone in L)."""
    lo_l, hi_l = max(accept_len - half, 1.0), min(accept_len + half, float(d))
    if lo_l > hi_l:
        return False
    lo_r, hi_r = predicted_rate(lo_l, d, formula), predicted_rate(hi_l, d, formula)
    eps = 1e-12
    return lo_r <= accept_rate + half + eps and hi_r >= accept_rate - half - eps


def consistent_pairs(accept_len: float, accept_rate: float, *, decimals: int = 2,
                     max_draft_tokens: int = 64) -> tuple[tuple[int, str], ...]:
    """Every (D, formula), D in 2..max_draft_tokens, that fits the printed numbers."""
    half = 0.5 * 10.0 ** (-decimals)
    return tuple((d, f) for d in range(2, max_draft_tokens + 1) for f in FORMULAS
                 if _fits(accept_len, accept_rate, d, f, half))


def _check_inputs(accept_len: float, accept_rate: float) -> None:
    if accept_len < 1.0:
        raise DiagError("accept len below 1 cannot come from SGLang (the bonus token alone is 1)",
                        field="accept len", expected=">= 1.00", found=accept_len)
    if not 0.0 <= accept_rate <= 1.0:
        raise DiagError("accept rate out of range", field="accept rate",
                        expected="0.00 .. 1.00", found=accept_rate)


def _flag_sentences(flags, resolved: ResolvedShape, implied, accept_len, label: str) -> list[str]:
    d = flags[2]
    names = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    shown = " ".join(f"{n} {v}" for n, v in zip(names, flags) if v is not None)
    out = [f"Launched with {shown}."]
    if resolved.crash:
        return out + [f"{label} would not run with these flags: {resolved.crash}."]
    out += [f"SGLang: {n}." for n in resolved.notes]
    rd = resolved.shape.num_draft_tokens
    if resolved.shape.topk == 1 and d is not None and d != rd:
        out.append(f"So each round verified D = {rd} tokens ({rd - 1} drafted): the {d} "
                   f"draft tokens asked for never happened.")
    if implied:
        names = " and ".join(f"{f} ({FORMULAS[f]})" for _, f in implied)
        out.append(f"At D = {rd} the logged numbers fit {names}.")
    else:
        rates = ", ".join(f"{f} = {predicted_rate(accept_len, rd, f):.2f}" for f in FORMULAS)
        out.append(f"At D = {rd} the logged accept len would give {rates}; neither matches the "
                   f"logged rate, so the server did not run these flags as given.")
    return out


def _pair_sentences(pairs, accept_len, accept_rate) -> list[str]:
    if not pairs:
        return [f"No D in range and no known formula turns accept len {accept_len:.2f} into "
                f"accept rate {accept_rate:.2f}; check the numbers come from the same log line."]
    listed = "; ".join(f"D = {d} under {f}" for d, f in pairs)
    first = [f"Accept len {accept_len:.2f} and accept rate {accept_rate:.2f} are consistent with: "
             f"{listed}."]
    if len(pairs) == 1:
        d, f = pairs[0]
        first.append(f"That is {d - 1} draft slot(s) per round, rate formula {FORMULAS[f]}.")
    return first


def _range_sentences(fitting) -> list[str]:
    """Which releases the log can come from. `fitting`: the consistent (D, formula) pairs
    (at the launched D when flags are known)."""
    ranges = _ranges(fitting)
    return [f"The logged numbers fit a server running SGLang {' or '.join(ranges)}."] if ranges else []


def _engine_sentences(fitting, eng: str | None, resolved_d: int | None) -> tuple[list[str], bool | None]:
    """Whether the version the user named logs a formula that fits."""
    if eng is None:
        return [], None
    e = engine(eng)
    mine = formula_for(e)
    fits = any(f == mine for _, f in fitting)
    at = f" at D = {resolved_d}" if resolved_d is not None else ""
    if fits:
        return [f"{e.label} logs {mine} ({FORMULAS[mine]}): consistent{at}."], True
    ranges = _ranges(fitting)
    return [f"{e.label} logs {mine} ({FORMULAS[mine]}), which does not fit these numbers{at}: "
            f"the log did not come from {e.label}"
            + (f" (it fits SGLang {' or '.join(ranges)})" if ranges else "") + "."], False


def explain(accept_len: float, accept_rate: float, *, num_steps: int | None = None,
            topk: int | None = None, num_draft_tokens: int | None = None,
            architecture: str = "LlamaForCausalLM", decimals: int = 2,
            max_draft_tokens: int = 64, engine_name: str | None = None) -> Explanation:
    """Which D and which formula make the logged pair consistent, which SGLang releases log
    that formula, and what the flags imply. Flags count as known when at least one is given
    (all None = flags unknown). engine_name: the version the user believes the server runs
    (None: unknown; the flag rules then use the newest release)."""
    _check_inputs(accept_len, accept_rate)
    pairs = consistent_pairs(accept_len, accept_rate, decimals=decimals,
                             max_draft_tokens=max_draft_tokens)
    sentences = _pair_sentences(pairs, accept_len, accept_rate)
    name = engine(engine_name).name if engine_name is not None else None
    flags = (num_steps, topk, num_draft_tokens)
    if flags == (None, None, None):
        more, fits = _engine_sentences(pairs, name, None)
        return Explanation(accept_len, accept_rate, pairs, None, None, (),
                           tuple(sentences + _range_sentences(pairs) + more), _ranges(pairs), name, fits)
    e = engine(name or DEFAULT_ENGINE)
    resolved = resolve_sglang_shape(*flags, architecture=architecture, eng=e)
    implied: tuple[tuple[int, str], ...] = ()
    rd = None
    if resolved.shape is not None and not resolved.crash:
        rd = resolved.shape.num_draft_tokens
        implied = tuple(p for p in pairs if p[0] == rd)
    fitting = implied if rd is not None else pairs
    sentences += _range_sentences(fitting)
    sentences += _flag_sentences(flags, resolved, implied, accept_len, e.label)
    more, fits = _engine_sentences(fitting, name, rd)
    return Explanation(accept_len, accept_rate, pairs, flags, resolved, implied,
                       tuple(sentences + more), _ranges(fitting), name, fits)


def _ranges(pairs) -> tuple[str, ...]:
    return tuple(dict.fromkeys(versions_of(f) for _, f in pairs))
