"""Are the target's own continuations language at all? Checks over the replayed continuation
tokens and the target's predictions of its own prompts, so a damaged target is blamed as the
target (issue 35: a target with a mislabelled embedding produced garbage, the intact drafter
could not predict it, and the verdict told the user to re-export the drafter).

  repeated token   share of all continuation tokens taken by the most common one. Natural
                   text and code stay far below REPEAT_SHARE (the zoo's llama-tiny: 9%; a
                   random tiny target: 7%); a target stuck on one token is at 90-100%.
  prompt fit       the target's mean cross-entropy on the prompts' own next tokens (teacher
                   forcing over the prompt positions), as a share of log(vocab_size): 1.0 is
                   what a uniform guess scores. Measured on the mixed-48 prompts: the zoo's
                   llama-tiny 0.51 (large models score ~0.2-0.3); the same target with its
                   embedding rows permuted 1.03, with random decoder weights 1.11; a random
                   tiny target 1.00. At UNIFORM_SHARE or above the target predicts its own
                   prompts no better than a guess.
Worked example: 6 prompts x 24 tokens all id 17 -> repeated token 17 at 100% >= 50%: garbage.

Pure functions over token ids and final-normed states; no files, no report.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

REPEAT_SHARE = 0.5
UNIFORM_SHARE = 0.85
MIN_TOKENS = 16            # fewer continuation tokens say nothing either way
MAX_POSITIONS = 2048       # cross-entropy on at most this many positions, evenly spaced (Kimi: 163840-wide rows)
_CHUNK = 256


@dataclass(frozen=True)
class OutputHealth:
    tokens: int                    # continuation tokens looked at
    top_token: int                 # the most common one
    top_share: float               # its share of all of them
    prompt_ce_share: float | None  # mean cross-entropy on the prompts / log(vocab); None when not measured
    positions: int = 0             # prompt positions it was averaged over

    @property
    def repeated(self) -> bool:
        return self.tokens >= MIN_TOKENS and self.top_share >= REPEAT_SHARE

    @property
    def uniform(self) -> bool:
        return self.positions >= MIN_TOKENS and self.prompt_ce_share is not None and self.prompt_ce_share >= UNIFORM_SHARE

    def to_json(self) -> dict:
        return {**asdict(self), "repeat_share_limit": REPEAT_SHARE, "uniform_share_limit": UNIFORM_SHARE}


def top_token(continuations: list[torch.Tensor]) -> tuple[int, int, float]:
    """(tokens, most common id, its share) over every continuation: [5, 5, 5, 9] -> (4, 5, 0.75)."""
    ids = torch.cat([c.reshape(-1).long() for c in continuations]) if continuations else torch.zeros(0, dtype=torch.long)
    if ids.numel() == 0:
        return 0, -1, 0.0
    counts = torch.bincount(ids)
    top = int(counts.argmax())
    return int(ids.numel()), top, float(counts[top]) / ids.numel()


@torch.no_grad()
def cross_entropy_share(states: list[torch.Tensor], targets: list[torch.Tensor], head: torch.nn.Module,
                        vocab_size: int) -> tuple[float | None, int]:
    """Mean cross-entropy of softmax(head(state)) against the next token, over rows of the given
    final-normed states [T_i, H] and their next tokens [T_i], as a share of log(vocab_size), on
    at most MAX_POSITIONS rows evenly spaced; (None, 0) for none."""
    if not states or vocab_size < 2:
        return None, 0
    rows = torch.cat([s.reshape(-1, s.shape[-1]) for s in states])          # [N, H]
    want = torch.cat([t.reshape(-1).long() for t in targets])               # [N]
    if rows.shape[0] == 0:
        return None, 0
    if rows.shape[0] > MAX_POSITIONS:
        pick = torch.linspace(0, rows.shape[0] - 1, MAX_POSITIONS).long()
        rows, want = rows[pick], want[pick]
    w = head.weight
    total = 0.0
    for i in range(0, rows.shape[0], _CHUNK):
        logits = (rows[i:i + _CHUNK].to(w.device, w.dtype) @ w.T).float()      # [c, V]
        total += float(torch.nn.functional.cross_entropy(logits, want[i:i + _CHUNK].to(logits.device),
                                                         reduction="sum"))
    return total / rows.shape[0] / math.log(vocab_size), int(rows.shape[0])


def output_health(sequences, final_states: list[torch.Tensor] | None, head, vocab_size: int) -> OutputHealth:
    """`sequences`: the target pass's Sequence records (ids [T], prompt_len); `final_states`:
    the pass's "final" point per sequence [T, H], or None. The state at position t predicts
    token t + 1, so the prompt's own tokens 1 .. p-1 are predicted by rows 0 .. p-2.
    Example: prompt_len 5 -> rows [0, 4) against ids [1, 5)."""
    conts = [s.ids[s.prompt_len:] for s in sequences]
    n, top, share = top_token(conts)
    ce, pos = (None, 0)
    if final_states is not None and head is not None:
        ce, pos = cross_entropy_share([f[:s.prompt_len - 1] for s, f in zip(sequences, final_states)],
                                      [s.ids[1:s.prompt_len] for s in sequences], head, vocab_size)
    return OutputHealth(n, top, share, ce, pos)
