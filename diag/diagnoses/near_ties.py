"""Near ties: the share of the target's continuation positions where its top-1 and top-2
probabilities are within MARGIN of each other, where a bf16 and an fp32 server (or two GPU
kernels) may pick different greedy tokens; the section, its note and its Markdown.

Each continuation position is one greedy decision of the target: the state at sequence index
j (final-normed, the pass's "final" capture point) predicts token j + 1, so a sequence with
prompt_len p and e emitted tokens has decisions at j = p-1 .. e-2 (its e - p continuation
tokens). Worked example, probabilities after softmax:

    [0.50, 0.46, 0.04]  top-1 - top-2 = 0.04 < 0.05   near tie
    [0.70, 0.20, 0.10]  top-1 - top-2 = 0.50          not

The probabilities are computed in float32 from the pass's states and the target's lm_head.
Share: pooled Σ near ties / Σ positions, with a bootstrap interval over prompts (weighted by
positions). Also reported: near ties per continuation (share x mean continuation length).

Note (info), when a continuation holds on average at least NOTE_PER_CONTINUATION = 1 near tie:
then a server in another dtype is expected to part from this greedy continuation at least once
per request, so its accept length describes slightly different text, and diag's numbers should
be compared with the server's at the interval's width, not at the digit. Below that, no
verdict: most continuations hold no near tie and dtype does not move them.
This module knows probabilities and the report's words; no files.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diag.diagnoses.protocol import Context, Diagnosis
from diag.diagnoses.typed import CI95, COUNT, RATE, from_json, meta, to_json
from diag.report.sections.cells import f
from diag.report.views import quoted
from diag.run.eval_cache import cached_pass_json
from diag.run.verdicts.record import Verdict
from diag.stats import bootstrap_ci

MARGIN = 0.05                 # |p(top-1) - p(top-2)| below this is a near tie
NOTE_PER_CONTINUATION = 1.0   # near ties per continuation from which the note is given
EXAMPLES = 3
_CHUNK = 256                  # rows of [CHUNK, V] logits at a time (Kimi: V = 163840)


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] logits -> [...] p(top-1) - p(top-2) in float32. log([0.5, 0.46, 0.04]) -> 0.04."""
    top = torch.softmax(logits.float(), dim=-1).topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def near_tie_mask(logits: torch.Tensor, margin: float = MARGIN) -> torch.Tensor:
    """[..., V] -> [...] bool: the two most probable tokens within `margin`."""
    return top2_gap(logits) < margin


@torch.no_grad()
def gaps(states: torch.Tensor, head) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, H] final-normed states -> ([N] top-1 - top-2 gap, [N, 2] the two token ids)."""
    w = head.weight
    gap, ids = [], []
    for i in range(0, states.shape[0], _CHUNK):
        logits = (states[i:i + _CHUNK].to(w.device, w.dtype) @ w.T).float()          # [c, V]
        gap.append(top2_gap(logits).cpu())
        ids.append(logits.topk(2, dim=-1).indices.cpu())
    if not gap:
        return torch.zeros(0), torch.zeros(0, 2, dtype=torch.long)
    return torch.cat(gap), torch.cat(ids)


# ---- the section ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Example:
    prompt: str
    position: int = meta(schema=COUNT)      # sequence index j; the target is choosing token j + 1
    gap: float = meta(schema=RATE)          # p(top-1) - p(top-2)
    first: str = meta()                     # top-1 token, decoded
    second: str = meta()                    # top-2 token, decoded


@dataclass(frozen=True)
class NearTiesSection:
    margin: float
    positions: int = meta(schema=COUNT)      # continuation positions (greedy decisions) checked
    near_ties: int = meta(schema=COUNT)
    share: float | None = meta(schema=RATE)
    ci95: tuple[float | None, float | None] = meta(schema=CI95)
    continuations: int = meta(schema=COUNT)
    per_continuation: float | None = meta(schema={"minimum": 0})
    examples: tuple[Example, ...] = meta()


def _text(decode, token: int) -> str:
    """The token's text, or "<id N>" for an id the tokenizer does not have: the runner-up may be
    a row of the target's padded vocabulary (a tokenizer of 279 ids, an lm_head of 300 rows)."""
    try:
        return decode([token])
    except (KeyError, IndexError, ValueError, TypeError, OverflowError):
        return f"<id {token}>"


def near_ties_section(sequences, final_states, head, decode, *, margin: float = MARGIN, seed: int,
                      n_boot: int) -> NearTiesSection:
    """`sequences`, `final_states`: the reference pass's records and its "final" point [T_i, H]."""
    pairs, found = [], []
    for s, st in zip(sequences, final_states):
        gap, ids = gaps(st[s.prompt_len - 1:s.emitted - 1], head)
        tie = gap < margin
        pairs.append((int(tie.sum()), int(gap.numel())))
        found += [(s.prompt_id, s.prompt_len - 1 + k, float(gap[k]), ids[k].tolist())
                  for k in tie.nonzero().flatten().tolist()]
    ties, total = sum(t for t, _ in pairs), sum(n for _, n in pairs)
    share, lo, hi = None, None, None
    if total:
        keep = [(t, n) for t, n in pairs if n]
        share = ties / total
        lo, hi = bootstrap_ci([t / n for t, n in keep], seed=seed, n=n_boot, weights=[n for _, n in keep])
    examples = tuple(Example(p, j, g, _text(decode, a), _text(decode, b)) for p, j, g, (a, b) in found[:EXAMPLES])
    per = ties / len(sequences) if sequences else None
    return NearTiesSection(margin, total, ties, share, (lo, hi), len(sequences), per, examples)


# ---- the diagnosis --------------------------------------------------------------------------

class NearTies(Diagnosis):
    name = "near_ties"
    Section = NearTiesSection

    def compute(self, ctx: Context) -> NearTiesSection | None:
        tp = ctx.reference_pass
        final = tp.states.get("final")
        if final is None or ctx.head is None or not tp.sequences:
            return None
        ev = ctx.inp.case.evaluate
        params = {"margin": MARGIN, "seed": ev.seed, "n_boot": ev.bootstrap}     # a repeat run reads no lm_head
        found = cached_pass_json(ctx.cache, ctx.inp.regimes[0], self.name, params, lambda: to_json(near_ties_section(
            tp.sequences, final, ctx.head, ctx.inp.tokenizer.decode, seed=ev.seed, n_boot=ev.bootstrap)))
        return from_json(NearTiesSection, found)

    def verdicts(self, sec: NearTiesSection, others=None) -> list[Verdict]:
        if sec.per_continuation is None or sec.per_continuation < NOTE_PER_CONTINUATION:
            return []
        return [Verdict("near-ties", "info",
                        f"NEAR TIES: at {sec.near_ties} of the target's {sec.positions} greedy decisions "
                        f"({100 * sec.share:.1f}%, 95% CI {100 * sec.ci95[0]:.1f}-{100 * sec.ci95[1]:.1f}%) its top two "
                        f"tokens are within {sec.margin:g} in probability, {sec.per_continuation:.1f} per continuation: "
                        "a server in another dtype (bf16 against fp32) may part from these continuations at any of "
                        "them, so compare its accept length with diag's at the interval, not the digit.",
                        to_json(sec))]

    def markdown(self, sec: NearTiesSection, rep: dict) -> list[str]:
        share = "–" if sec.share is None else f"{100 * sec.share:.1f}%"
        lo, hi = ("–" if x is None else f"{100 * x:.1f}%" for x in sec.ci95)
        out = ["## Near ties", "",
               f"Target decisions whose top-1 and top-2 probabilities are within {sec.margin:g} (where a bf16 "
               f"and an fp32 server may choose differently): {sec.near_ties} of {sec.positions} continuation "
               f"positions, {share} [{lo}, {hi}], {f(sec.per_continuation)} per continuation over "
               f"{sec.continuations} continuations."]
        if sec.examples:
            out += ["", "Examples: " + "; ".join(f"{x.prompt} at {x.position}: {quoted(x.first)} / {quoted(x.second)} "
                                                 f"(gap {x.gap:.3f})" for x in sec.examples)]
        return out + [""]
