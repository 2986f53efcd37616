"""Settings that make a server benchmark run at a chosen acceptance, so its tokens/s can be
measured at diag's predicted accept length before the drafter is fixed or retrained.

SGLang (speculative/spec_utils.py, `generate_simulated_accept_index`; every covered release):
  SGLANG_SIMULATE_ACC_LEN=L    accept length INCLUDING the bonus token (the log's "accept len"),
                               read once at import: set it in the server's environment at launch.
                               Each verify step draws one length for the whole batch, clamped to
                               [1, num_steps + 1], and forces it on the chain of first children.
  SGLANG_SIMULATE_ACC_METHOD   "match-expected" draws floor(L) or floor(L)+1 with the weights
                               that give mean L exactly; "multinomial" rounds a normal(L, 1) after
                               clamping, whose mean drifts toward the middle of [1, S+1]. The
                               default is "multinomial" up to 0.5.10.post1, "match-expected" since
                               0.5.11, so diag always sets it.
  SGLANG_SIMULATE_ACC_TOKEN_MODE (0.5.15+) "fixed" (default) emits a placeholder token id; the
                               throughput is what matters, the text is garbage either way.
  Worked example: L = 2.47 on s3-k4-d8 -> 47% of verify steps emit 3 tokens, 53% emit 2.
vLLM (vllm/config/speculative.py, v1 rejection sampler): in --speculative-config,
  "rejection_sample_method": "synthetic" with "synthetic_acceptance_rates": [p1..pK], the
  per-position UNCONDITIONAL rates p_i = P(a >= i) (non-increasing, K = num_speculative_tokens),
  or "synthetic_acceptance_length": L in [1, K+1] (vLLM then uses the minimum-variance schedule
  [1, .., 1, frac, 0, ..]). diag gives the rates: they keep the per-depth profile, not only its mean.

This module knows environment variables and config keys; it reads nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from diag.engines.sglang.server_releases import Release
from diag.trees import TreeShape

FLAG = "vllm_flag"                       # the row's key for the other engine's launch flag
MATCH_EXPECTED_DEFAULT_SINCE: Release = (0, 5, 11, 0)
TOKEN_MODE_SINCE: Release = (0, 5, 15, 0)


@dataclass(frozen=True)
class SimulatedAcceptance:
    accept_length: float                 # the value exported, clamped to [1, S+1]
    sglang_env: tuple[tuple[str, str], ...]
    vllm_speculative_config: dict
    notes: tuple[str, ...]

    @property
    def sglang_command_prefix(self) -> str:
        """"SGLANG_SIMULATE_ACC_LEN=2.47 SGLANG_SIMULATE_ACC_METHOD=match-expected" (before the launch)."""
        return " ".join(f"{k}={v}" for k, v in self.sglang_env)

    def to_json(self) -> dict:
        return {"accept_length": self.accept_length, "sglang_env": dict(self.sglang_env),
                "sglang_command_prefix": self.sglang_command_prefix,
                "vllm_speculative_config": self.vllm_speculative_config,
                FLAG: "--speculative-config '" + json.dumps(self.vllm_speculative_config) + "'",
                "notes": list(self.notes)}


def markdown(layout: str, rows: list[dict]) -> list[str]:
    """report.md's lines for the live server's `simulate` rows (SimulatedAcceptance.to_json beside
    "key" and "tree"), e.g. "- chain-3 (accept length 3.09): `SGLANG_SIMULATE_ACC_LEN=3.09 ...`"."""
    out = [f"Benchmark the server at diag's predicted acceptance of `{layout}` "
           "(SGLang: environment of the launch; vLLM: the speculative config):", ""]
    for s in rows:
        al = "–" if s["accept_length"] is None else f"{s['accept_length']:.2f}"
        out.append(f"- {s['tree']} (accept length {al}): `{s['sglang_command_prefix']} "
                   f"python -m sglang.launch_server ...`; vLLM `{s[FLAG]}`"
                   + (f" ({'; '.join(s['notes'])})" if s["notes"] else ""))
    return out + [""]


def simulated_acceptance(accept_length: float, acceptance_at_depth: tuple[float, ...], shape: TreeShape,
                         release: Release) -> SimulatedAcceptance:
    """The SGLang environment and the vLLM speculative-config keys for a benchmark at this
    acceptance on this shape. acceptance_at_depth: P(a >= i), i = 1..S (diag's trajectory counts)."""
    top = shape.num_steps + 1.0
    value = round(min(max(accept_length, 1.0), top), 2)
    env = [("SGLANG_SIMULATE_ACC_LEN", f"{value:.2f}"), ("SGLANG_SIMULATE_ACC_METHOD", "match-expected")]
    notes = []
    if release < MATCH_EXPECTED_DEFAULT_SINCE:
        notes.append("this release defaults to SGLANG_SIMULATE_ACC_METHOD=multinomial, whose mean is not the "
                     "value given: keep match-expected")
    if shape.topk > 1:
        notes.append(f"SGLang forces the simulated length on one path of the {shape.name} tree: the verify cost "
                     f"is the tree's (D = {shape.num_draft_tokens}), the accepted path a chain")
    rates = [round(min(1.0, max(0.0, p)), 4) for p in acceptance_at_depth]
    rates = [min(rates[: i + 1]) for i in range(len(rates))]          # non-increasing, as vLLM requires
    synthetic = {"num_speculative_tokens": shape.num_steps, "rejection_sample_method": "synthetic",
                 "synthetic_acceptance_rates": rates}
    if shape.topk > 1:
        notes.append(f"vLLM drafts chains: num_speculative_tokens = num_steps = {shape.num_steps} at the tree's "
                     "per-depth acceptance")
    return SimulatedAcceptance(value, tuple(env), synthetic, tuple(notes))
