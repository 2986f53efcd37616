"""The engine-neutral records the EngineRules protocol (protocol.py) speaks in.

ServingPlan / ServingError / Fix (what a release feeds a drafter and how to change it),
ResolvedShape (the tree a release runs for its launch flags), ReportRate (an accept rate the
engine logs, as diag reports it), LaunchFlags / EffectiveConfig /
FlagProblem (a launch line read and linted), DraftTables (whose embedding and lm_head the draft
uses), RequestDefaults (what a request that sets no sampling parameter runs). Every family
fills these; none of them names a family. This module holds types; it computes nothing but
`refused`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from diag.engines import DEFAULT_ENGINE
from diag.errors import DiagError
from diag.layouts import Layout
from diag.metrics import AcceptCounts
from diag.trees import TreeShape

__all__ = ["BenchmarkSettings", "DeclaredLayout", "DraftTables", "DrafterSupport", "EffectiveConfig", "FlagProblem",
           "Fix", "LaunchFlags", "ReportRate", "RequestDefaults", "ResolvedShape", "ServingError", "ServingPlan",
           "refused"]


@dataclass(frozen=True)
class BenchmarkSettings:
    """What makes one engine's server benchmark run at a chosen acceptance (diag/engines/simulate.py):
    the report fields, in order (the environment, config keys and the flag or command prefix that
    carries them), and notes. Example (SGLang, L = 2.47): fields {"sglang_env": {...},
    "sglang_command_prefix": "SGLANG_SIMULATE_ACC_LEN=2.47 SGLANG_SIMULATE_ACC_METHOD=match-expected"}."""

    fields: dict
    notes: tuple[str, ...]


@dataclass(frozen=True)
class ReportRate:
    """One accept rate an engine logs, as diag reports it beside the accept length: its
    report.json field, the diag.metrics function that computes it and its report.md column.
    Example (SGLang 0.5.11+): ReportRate("sglang_accept_rate", draft_accept_rate, "sglang rate"):
    a = [0, 2, 2, 1], D = 4 -> 5 / 12 = 0.4167 under "sglang rate"."""

    field: str
    rate: Callable[[AcceptCounts], float | None]
    column: str


@dataclass(frozen=True)
class ServingPlan:
    """What the engine runs. mode "eagle3" or "eagle"; layout = what the fc input (or the
    bypassed hidden state) is made of in decode rounds; embed / lm_head "drafter" or
    "target"; vocab_limit: drafts limited to the first N ids (None: all); fc_inputs: how
    many states SGLang built fc for; prefill_layout: what prefill captures when it differs
    from `layout` (0.5.6-0.5.10.post1 under CUDA graphs); crash: why the engine would fail
    at startup or at the first draft step, or None."""

    mode: str
    layout: Layout
    rule: str
    convention: str | None
    uses_fc: bool
    lm_head: str
    uses_d2t: bool
    notes: tuple[str, ...]
    crash: str | None = None
    engine: str = DEFAULT_ENGINE
    embed: str = "target"
    vocab_limit: int | None = None
    fc_inputs: int | None = None
    prefill_layout: Layout | None = None
    warnings: tuple[str, ...] = ()     # version-specific behaviour a report must carry


@dataclass(frozen=True)
class ServingError:
    """The engine cannot serve the drafter as configured (ids it cannot capture, a shape
    that crashes the first draft forward). A value, not an exception: the run goes on to
    find what the drafter was trained on, and a verdict proposes the fix."""

    message: str
    field: str | None = None
    expected: object = None
    found: object = None

    def __str__(self) -> str:
        where = f" ({self.field}: {self.found}; expected {self.expected})" if self.field else ""
        return self.message + where


@dataclass(frozen=True)
class Fix:
    """How to make `engine` serve a layout: the ids (None when no ids can on this version),
    the first later release whose ids can (version, ids) or None, and the sentence."""

    ids: list[int] | None
    upgrade: tuple[str, list[int]] | None
    text: str


@dataclass(frozen=True)
class DeclaredLayout:
    """A layout a drafter config says it was trained on, and where it says so."""

    layout: Layout
    source: str
    rule: str


@dataclass(frozen=True)
class DraftTables:
    """embed, lm_head: "target" or "drafter"; vocab_limit: logits kept for the first N rows
    of lm_head (None: all); uses_d2t: draft ids map to target ids through d2t."""

    embed: str
    lm_head: str
    vocab_limit: int | None
    uses_d2t: bool
    why: str
    source: str = ""                   # the engine's files the rule was read from


@dataclass(frozen=True)
class DrafterSupport:
    """What a release does with a drafter config before any layout question: whether it has a
    model class for `architectures[0]` (`builds` None: diag has not read this engine's registry,
    so it is not checked), why building it fails on a missing draft_vocab_size (`head_crash`),
    whether it captures auxiliary states and a note when eagle_config.use_aux_hidden_state
    matters. Example (SGLang 0.5.11, Eagle3DeepseekV2ForCausalLM): builds False, classes
    ("LlamaForCausalLMEagle3",), class_fix "upgrade to SGLang 0.5.12 or newer (...)"."""

    builds: bool | None
    classes: tuple[str, ...]
    head_crash: str | None
    aux: bool
    aux_note: str | None
    class_fix: str = ""          # how to serve it when `builds` is False, in the engine's terms


@dataclass(frozen=True)
class ResolvedShape:
    """What SGLang runs for the given flags. `requested` = the flags as given
    (None = omitted). `crash` is the failure SGLang would hit (None if it runs);
    `shape` is None when no shape can be resolved at all."""

    shape: TreeShape | None
    requested: tuple
    notes: tuple[str, ...]
    crash: str | None


@dataclass(frozen=True)
class LaunchFlags:
    """The flags diag cares about; None = omitted. `other` keeps every other
    flag as (spelling, value or None) so a report can show the full line."""

    program: str
    model_path: str | None = None
    draft_model_path: str | None = None
    algorithm: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    max_running_requests: int | None = None
    tp_size: int | None = None
    dp_size: int | None = None
    enable_dp_attention: bool = False
    token_map: str | None = None
    disable_cuda_graph: bool = False
    accept_threshold_single: float | None = None     # verification thresholds (decoding.py)
    accept_threshold_acc: float | None = None
    use_rejection_sampling: bool = False
    sampling_defaults: str | None = None              # "model" (default) | "openai"
    other: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class EffectiveConfig:
    """What the server will actually run. `algorithm` after aliasing (None: no
    speculation); `tree` from diag.trees; `crash` the first failure SGLang hits."""

    flags: LaunchFlags
    algorithm: str | None
    architecture: str          # architectures[0]: what SGLang's auto tree defaults are keyed on
    engine: str                # the version whose rules were applied, e.g. "sglang-0.5.23"
    tree: ResolvedShape | None
    max_running_requests: int | None
    notes: tuple[str, ...]
    crash: str | None


@dataclass(frozen=True)
class FlagProblem:
    """Something in a launch line this release's parser refuses or reads differently from
    what is written. severity: "error" (the launch fails) | "warning" (it runs, but not
    necessarily as written)."""

    code: str
    severity: str
    flag: str
    message: str
    behaviour: str
    fix: str
    parser: str = ""                   # whose parser judged: "SGLang 0.5.14" (the nearest table)



@dataclass(frozen=True)
class RequestDefaults:
    """What a request that sets no sampling parameter runs on the server, and why."""

    values: dict                 # temperature, top_p, top_k after the engine's resolution
    source: str                  # "generation_config.json" or "<Engine> defaults"
    unmodelled: dict             # min_p / repetition_penalty the server applies and diag does not

    @property
    def from_generation_config(self) -> bool:
        return self.source == "generation_config.json"

def refused(plan: ServingPlan | ServingError) -> ServingPlan | ServingError:
    """A plan that crashes as the ServingError it is; anything else unchanged."""
    return ServingError(plan.crash) if isinstance(plan, ServingPlan) and plan.crash else plan


def find_key(value, key: str):
    """The first value of `key` anywhere in nested dicts, None when absent: a server's /server_info
    nests its arguments by group in some releases ({"spec": {"speculative_num_steps": 3}} -> 3)."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        for v in value.values():
            if (hit := find_key(v, key)) is not None:
                return hit
    return None


def json_object(reply) -> dict | None:
    """A live server's reply as a JSON object (a LiveServer's detection reads these); None for no
    reply (404) or a body that is no JSON object: '{"version": "0.32.0"}' -> {"version": "0.32.0"};
    '[1]' or 'Not Found' -> None."""
    if reply is None:
        return None
    try:
        value = reply.json()
    except DiagError:
        return None
    return value if isinstance(value, dict) else None
