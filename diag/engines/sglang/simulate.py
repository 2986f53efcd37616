"""SGLang's settings for a server benchmark at a chosen acceptance (diag/engines/simulate.py
merges every engine's).

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

This module knows environment variables; it reads nothing.
"""

from __future__ import annotations

from diag.engines.common import BenchmarkSettings
from diag.engines.protocol import Release
from diag.trees import TreeShape

MATCH_EXPECTED_DEFAULT_SINCE = (0, 5, 11, 0)
TOKEN_MODE_SINCE = (0, 5, 15, 0)


def simulated_acceptance_env(accept_length: float, shape: TreeShape, release: Release | None) -> BenchmarkSettings:
    """The environment for a benchmark at this (clamped) accept length on this shape; the notes
    name what `release` (the observed server's, None: another family's) would do otherwise."""
    env = {"SGLANG_SIMULATE_ACC_LEN": f"{accept_length:.2f}", "SGLANG_SIMULATE_ACC_METHOD": "match-expected"}
    notes = []
    if release is not None and release.release < MATCH_EXPECTED_DEFAULT_SINCE:
        notes.append("this release defaults to SGLANG_SIMULATE_ACC_METHOD=multinomial, whose mean is not the "
                     "value given: keep match-expected")
    if shape.topk > 1:
        notes.append(f"SGLang forces the simulated length on one path of the {shape.name} tree: the verify cost "
                     f"is the tree's (D = {shape.num_draft_tokens}), the accepted path a chain")
    # "SGLANG_SIMULATE_ACC_LEN=2.47 SGLANG_SIMULATE_ACC_METHOD=match-expected" (before the launch)
    prefix = " ".join(f"{k}={v}" for k, v in env.items())
    return BenchmarkSettings({"sglang_env": env, "sglang_command_prefix": prefix}, tuple(notes))

