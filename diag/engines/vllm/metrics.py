"""vLLM's speculative-decoding counters, from a saved GET /metrics (Prometheus text format).

vLLM v1 (vllm/v1/spec_decode/metrics.py, SpecDecodingProm) keeps four counters, exposed by
prometheus_client with the `_total` suffix, one series per engine (label `engine`):
  vllm:spec_decode_num_drafts_total                       verify rounds with drafts
  vllm:spec_decode_num_draft_tokens_total                 drafted tokens (K per round)
  vllm:spec_decode_num_accepted_tokens_total              accepted drafts, Σa
  vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}   rounds with a > i
"Mean acceptance length includes the bonus token": 1 + Σa / drafts; per position,
P(a ≥ i+1) = per_pos[i] / drafts (unconditional, diag's acceptance_at_depth).
Worked example: drafts 1000, draft tokens 3000, accepted 1200, per_pos [600, 400, 200] ->
K = 3 (D = 4), accept length 2.20, acceptance at depth [0.6, 0.4, 0.2].

This module parses text into a record; it opens no file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.errors import DiagError

_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
PREFIX = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@dataclass(frozen=True)
class VllmSpecCounters:
    source: str
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: tuple[int, ...]      # rounds with a > i, i = 0..K-1

    @property
    def num_speculative_tokens(self) -> int:
        return self.num_draft_tokens // self.num_drafts

    @property
    def accept_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def acceptance_at_depth(self) -> tuple[float, ...]:
        return tuple(n / self.num_drafts for n in self.accepted_per_pos)


def _samples(text: str, source: str) -> dict[str, dict[int, float]]:
    """{counter name: {position (or -1): summed value over engines}}."""
    out: dict[str, dict[int, float]] = {}
    for no, line in enumerate(text.splitlines(), start=1):
        m = _SAMPLE.match(line.strip())
        if not m or not m.group("name").startswith(PREFIX) or not m.group("name").endswith("_total"):
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        try:
            value = float(m.group("value"))
        except ValueError:
            raise DiagError("a metrics sample has no number", file=source, field=f"line {no}",
                            expected="NAME{labels} VALUE", found=line[:120]) from None
        name = m.group("name")[len(PREFIX):-len("_total")]
        pos = int(labels["position"]) if "position" in labels else -1
        out.setdefault(name, {}).setdefault(pos, 0.0)
        out[name][pos] += value
    return out


def read_vllm_metrics(text: str, *, source: str) -> VllmSpecCounters:
    """Parse vLLM's /metrics. Errors: no spec-decode counters, no drafts, counts that do not add up."""
    s = _samples(text, source)
    missing = [c for c in COUNTERS if -1 not in s.get(c, {})]
    if missing:
        raise DiagError("the metrics have no vLLM speculative-decoding counters", file=source,
                        field=f"{PREFIX}{missing[0]}_total", expected="vLLM v1 /metrics of a server launched "
                        "with --speculative-config", found="absent")
    drafts, tokens, accepted = (int(s[c][-1]) for c in COUNTERS)
    per_pos = s.get("num_accepted_tokens_per_pos", {})
    positions = tuple(int(per_pos[i]) for i in sorted(per_pos))
    if drafts <= 0:
        raise DiagError("the vLLM server has not verified any draft yet", file=source,
                        field=f"{PREFIX}num_drafts_total", expected="> 0", found=drafts)
    if tokens % drafts or accepted > tokens or (positions and sum(positions) != accepted):
        raise DiagError("vLLM's speculative counters do not add up", file=source, field=f"{PREFIX}*_total",
                        expected="draft tokens a multiple of drafts; accepted = Σ per-position accepted <= draft tokens",
                        found={"drafts": drafts, "draft_tokens": tokens, "accepted": accepted,
                               "per_pos": list(positions)})
    return VllmSpecCounters(source, drafts, tokens, accepted, positions)
