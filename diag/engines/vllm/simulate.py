"""vLLM's settings for a server benchmark at a chosen acceptance (diag/engines/simulate.py merges
every engine's).

vLLM (vllm/config/speculative.py, v1 rejection sampler): in --speculative-config,
  "rejection_sample_method": "synthetic" with "synthetic_acceptance_rates": [p1..pK], the
  per-position UNCONDITIONAL rates p_i = P(a >= i) (non-increasing, K = num_speculative_tokens),
  or "synthetic_acceptance_length": L in [1, K+1] (vLLM then uses the minimum-variance schedule
  [1, .., 1, frac, 0, ..]). diag gives the rates: they keep the per-depth profile, not only its mean.
  Worked example: P(a >= i) = (0.8, 0.45, 0.5) on s3-k4-d8 -> num_speculative_tokens 3, rates
  [0.8, 0.45, 0.45].

This module knows config keys; it reads nothing.
"""

from __future__ import annotations

import json

from diag.engines.common import BenchmarkSettings
from diag.trees import TreeShape


def simulated_acceptance(acceptance_at_depth: tuple[float, ...], shape: TreeShape) -> BenchmarkSettings:
    """The speculative-config keys (and the flag that carries them) for this per-depth acceptance."""
    rates = [round(min(1.0, max(0.0, p)), 4) for p in acceptance_at_depth]
    rates = [min(rates[: i + 1]) for i in range(len(rates))]          # non-increasing, as vLLM requires
    config = {"num_speculative_tokens": shape.num_steps, "rejection_sample_method": "synthetic",
              "synthetic_acceptance_rates": rates}
    notes = ()
    if shape.topk > 1:
        notes = (f"vLLM drafts chains: num_speculative_tokens = num_steps = {shape.num_steps} at the tree's "
                 "per-depth acceptance",)
    return BenchmarkSettings({"vllm_speculative_config": config,
                              "vllm_flag": "--speculative-config '" + json.dumps(config) + "'"}, notes)
