"""`--speculative-algorithm`: the names SGLang accepts, its aliases, and what diag emulates.

SGLang's server_args rewrites NEXTN to EAGLE before anything else reads it; EAGLE, EAGLE3 and
STANDALONE run the EAGLE worker family (tree flags, max_running_requests rules). diag
emulates two drafter modes: "eagle3" (auxiliary hidden states through fc) and "eagle" (the
final-normed last hidden state: what an EAGLE-3 drafter gets under EAGLE or NEXTN).
Worked example: "nextn" -> canonical "EAGLE" -> mode "eagle".

This module is the one home of these names; it knows nothing about configs.
"""

from __future__ import annotations

from diag.errors import DiagError

ALIASES: dict[str, str] = {"NEXTN": "EAGLE"}
EAGLE_WORKERS = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})
MODES: dict[str, str] = {"EAGLE3": "eagle3", "EAGLE": "eagle"}


def canonical(algorithm: str) -> str:
    """Upper-cased, aliases applied: "nextn" -> "EAGLE"; unknown names pass through."""
    key = algorithm.strip().upper()
    return ALIASES.get(key, key)


def is_alias(algorithm: str) -> bool:
    return algorithm.strip().upper() in ALIASES


def mode_of(algorithm: str) -> str:
    """EAGLE3 -> "eagle3"; EAGLE, NEXTN -> "eagle" (case-insensitive); else a DiagError."""
    key = canonical(algorithm)
    if key not in MODES:
        raise DiagError("speculative algorithm diag cannot emulate", field="--speculative-algorithm",
                        expected=", ".join([*MODES, *ALIASES]), found=repr(algorithm))
    return MODES[key]
