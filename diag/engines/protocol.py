"""The one interface every serving engine implements: what diag asks an engine's rules.

An engine family (SGLang, vLLM, ...) is one package under diag/engines/ holding its rules,
release by release, and one object implementing `EngineRules`. Code outside the engine
packages reaches an engine only through this protocol and the registry (diag/engines/__init__):
it never imports a family package and never names a family.

A release is named "<family>-<version>": "sglang-0.5.23", "vllm-0.32.0"; `Release` is that
name parsed. Every method that depends on the version takes the Release it answers for.

What the protocol covers, in the order a run needs it (worked examples are SGLang 0.5.23 on a
6-layer Llama target unless named):
  releases        releases() -> ("0.5.6", ..., "0.5.23"); release("0.5.23") -> Release
  algorithms      algorithms() -> names the engine's --speculative-algorithm accepts;
                  mode_of("NEXTN") -> "eagle" (diag's drafter modes: "eagle3" | "eagle")
  capture         serving_plan(drafter_config, target_config, ...) -> what the server feeds the
                  drafter (ServingPlan) or why it cannot (ServingError); capture_convention ->
                  the layer-id rule's name ("sglang-llama"); default_aux_layers -> the layout
                  fed when the drafter config names no ids (Kimi-K2.5, 61 layers: L2+L30+L58)
  the fix         serving_ids(embed+L2+L4) -> [-1, 1, 3]; fix_for -> Fix with the sentence in
                  the engine's own terms ("write eagle_config.eagle_aux_hidden_state_layer_ids
                  = [-1, 1, 3] (SGLang 0.5.23, sglang-llama)")
  drafter         drafter_support(drafter_config) -> DrafterSupport: its model class, a missing
                  draft_vocab_size, use_aux_hidden_state (lint's drafter checks)
  draft tables    draft_tables(drafter_config, "eagle") -> embed / lm_head "target", drafts among
                  the first draft_vocab_size target ids (DraftTables)
  trees           resolve_tree(num_steps, topk, num_draft_tokens, target_config) -> the tree the
                  server runs (auto defaults when all three are None; S=1, K=1, D=16 -> D=2)
  sampling        request_defaults(generation_config) -> what a request that sets nothing runs
  verification    verification(release) -> the greedy and sampled rules the decode loop applies,
                  by name (Verification: "tree-argmax", "tree-target-only")
  metrics         accept_rate_formula(release) -> the diag.metrics function name the engine's
                  log calls "accept rate" ("sglang_accept_rate": Σa / (rounds·(D-1)));
                  formula_label(name) -> its text; explain_logged(L, R, ...) -> which D and formula
                  fit a logged pair (`diag explain`); simulated_acceptance(L, P(a>=i), tree) -> the
                  settings that make a benchmark of its server run at that acceptance;
                  report_rates -> the rates reports carry beside the accept length (ReportRate:
                  report.json field, diag.metrics function, report.md column)
  readers         read_log / read_responses / read_server_info / read_metrics: the engine's saved
                  output parsed into its own frozen records (see each method)
  sanity          read_sampled(text, temperature=0.01) -> Sampled (a saved run at that temperature, in
                  the engine's own format); sampled_sanity(runs, greedy, k) -> EngineSanity, the
                  T -> 0 check worded in the engine's terms (diag/engines/sanity.py)
  launch lint     launch_argv(command) -> the words the server parses; parse_launch(command) ->
                  LaunchFlags; effective_config -> EffectiveConfig; flag_problems(argv, release)
                  -> what this release's parser refuses; cross_check(effective, argv) -> where
                  the engine's own installed parser disagrees with diag's mirror
  live server     live_server() -> LiveServer: how `diag probe` recognises a running server of
                  this family and what it sends and saves (the engine's request and response
                  shapes); the probe drives it through HttpClient and names no engine

A family that cannot answer a question (vLLM has no `/server_info` in SGLang's shape) raises a
DiagError naming the release and the input; it never answers with another family's rules.
This module declares; it computes nothing and imports no engine package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from diag.errors import DiagError

if TYPE_CHECKING:
    from diag.engines.common import (BenchmarkSettings, DrafterSupport, DraftTables, EffectiveConfig, FlagProblem, Fix,
                                     LaunchFlags, ReportRate, RequestDefaults, ResolvedShape, ServingError,
                                     ServingPlan)
    from diag.engines.sanity import EngineSanity, Sampled
    from diag.layouts import Layout
    from diag.trees import TreeShape

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+)|\.(\d+))?$")


def release_tuple(text: str) -> tuple[int, int, int, int]:
    """"0.5.10.post1" -> (0, 5, 10, 1); "0.32.0" -> (0, 32, 0, 0). Versions compare as these.
    vLLM's hotfix releases put a fourth number where SGLang writes .postN (no release has both):
    "0.9.0.1" -> (0, 9, 0, 1), after "0.9.0" and before "0.9.1"."""
    m = _VERSION.match(text)
    if not m:
        raise DiagError("not a release version", field="engine", expected="e.g. 0.5.23 or 0.5.10.post1",
                        found=repr(text))
    major, minor, patch, post, fourth = m.groups()
    return int(major), int(minor), int(patch), int(post or fourth or 0)


@dataclass(frozen=True)
class Release:
    """One engine release. Release("sglang", "0.5.23", "SGLang"): name "sglang-0.5.23",
    label "SGLang 0.5.23", release (0, 5, 23, 0)."""

    family: str
    version: str
    display: str

    @property
    def name(self) -> str:
        return f"{self.family}-{self.version}"

    @property
    def label(self) -> str:
        return f"{self.display} {self.version}"

    @property
    def release(self) -> tuple[int, int, int, int]:
        return release_tuple(self.version)


@dataclass(frozen=True)
class Verification:
    """How a release verifies drafts, by rule name. The rules are torch code in diag.replay
    (replay/verifiers.py maps each name to its function), because verification runs on the
    drafter's trees, which this layer may not import. Names say what the rule does, not whose
    it is: greedy "tree-argmax" (accept the deepest path whose tokens equal the target's
    argmax continuation); sampled "tree-target-only" (SGLang's walk of each node's children
    with one coin, the draft distribution never read), "chain-rejection" (accept depth d iff
    u_d < p(x_d), else resample from p without x_d). `text` is the sentence a report shows."""

    greedy: str
    sampled: str
    text: str


@dataclass(frozen=True)
class Server:
    """A live server as detection found it. Server("sglang", "0.5.23", "llama-tiny",
    "http://h:30000", '{"version": ...}', "/server_info")."""

    engine: str                 # the family
    version: str | None         # as the server reports it
    model: str | None           # the served model name (what a request names, where it names one)
    url: str
    info_text: str | None = None    # the self-description body as served, where the family has one
    info_path: str | None = None    # which route answered


class HttpClient(Protocol):
    """What a LiveServer asks of diag.probe's client: `base` URL; get(path, ok_missing=True)
    -> a reply (.text, .json()) or None on 404; post(path, body) -> a reply. Errors are
    DiagErrors naming the URL."""

    base: str

    def get(self, path: str, ok_missing: bool = False) -> Any: ...

    def post(self, path: str, body: dict) -> Any: ...


@runtime_checkable
class LiveServer(Protocol):
    """One family's live-server shapes, driven by diag.probe. A prompt `p` is any object with
    `id`, `text` (str | None) and `ids` (token ids | None: send the text). `signature` says
    what detection looks for (the error when no family answers lists them); the probe POSTs to
    `generate_path` and saves the records, one JSON line each, as `rows_file`; `run_flags` maps
    each ServerSpec field the saved files feed to its `diag run` flag ({"server_info":
    "--server-info"}); `requests_total` names the /metrics counter of finished requests
    ("sglang:num_requests_total")."""

    family: str
    display: str
    signature: str
    generate_path: str
    rows_file: str
    run_flags: dict[str, str]
    requests_total: str

    def detect(self, client: HttpClient) -> Server | None:
        """The server at client.base when it is this family's, else None (asks only routes the
        family's http server defines; a 404 is an answer, not an error)."""

    def served_model(self, client: HttpClient, server: Server, given: str | None) -> tuple[str | None, dict[str, str]]:
        """The model the requests name (`given` checked against what is served) and the files
        to keep of what was asked ({"models.json": ...})."""

    def request(self, p: Any, decoding: Any, max_new_tokens: int, model: str | None) -> dict:
        """The JSON body of one prompt's request, every sampling value sent."""

    def record(self, p: Any, answer: Any, url: str) -> dict:
        """The saved line for one answer (with "id" = the prompt id); a DiagError when it is
        not an answer to p in this family's shape."""

    def finish(self, client: HttpClient, server: Server, rows: list[dict]) -> tuple[dict, dict, list[str]]:
        """After every request: checks on the rows, then (other files to write, diag run's
        ServerSpec field -> file name, notes)."""

    def metrics_fields(self, delta: str | None, source: str) -> tuple[dict[str, str], list[str]]:
        """What the probe's /metrics difference (None: the server has no /metrics) feeds:
        (ServerSpec field -> file name, notes); a DiagError when this family needs it."""


@runtime_checkable
class EngineRules(Protocol):
    """One engine family's rules. `family` is the name prefix ("sglang"), `display` how reports
    write it ("SGLang"), `ids_field` the drafter config key whose layer ids the engine reads
    ("eagle_config.eagle_aux_hidden_state_layer_ids")."""

    family: str
    display: str
    ids_field: str
    # the accept rates the engine's logs print, each reported beside diag's accept length
    # (report.json's trajectory."sglang_accept_rate", report.md's "sglang rate" column), and the
    # sentence report.md says of them ("SGLang's accept rate as 0.5.11+ and as ≤ 0.5.10 log it");
    # () and "" when the engine logs no rate diag reports
    report_rates: tuple[ReportRate, ...]
    report_rates_text: str

    # ---- releases and algorithms -------------------------------------------------------
    def releases(self) -> tuple[str, ...]:
        """Every covered version, oldest first."""

    def release(self, version: str) -> Release:
        """The named version of this family, or a DiagError listing the covered ones."""

    def algorithms(self) -> tuple[str, ...]:
        """The speculative algorithm names this engine accepts for EAGLE drafters, canonical
        first: ("EAGLE3", "EAGLE", "NEXTN")."""

    def mode_of(self, algorithm: str) -> str:
        """diag's drafter mode for an algorithm name: "eagle3" or "eagle"; else a DiagError."""

    # ---- capture and the fix -------------------------------------------------------------
    def serving_plan(self, drafter_config: dict, target_config: dict, *, release: Release,
                     algorithm: str = "EAGLE3", cuda_graph: bool = True) -> ServingPlan | ServingError:
        """What `release` feeds this drafter on this target (ServingPlan; its `crash` says why a
        server that starts fails at the first draft), or ServingError when it cannot be served
        as configured at all (ids it cannot capture, a key its drafter class cannot build with).
        common.refused(plan) turns a plan that crashes into its ServingError."""

    def capture_convention(self, target_config: dict, *, release: Release) -> str:
        """The layer-id rule `release` applies to this target's drafter ids, by convention
        name ("sglang-llama"); "no-capture" when its model class captures nothing."""

    def default_aux_layers(self, target_config: dict, *, release: Release) -> Layout | None:
        """The layout fed when the drafter config names no ids (None: cannot capture)."""

    def serving_ids(self, layout: Layout, target_config: dict, *, release: Release) -> list[int] | None:
        """The ids that make `release` feed exactly `layout`, or None when no ids can."""

    def fix_for(self, layout: Layout, target_config: dict, *, release: Release) -> Fix:
        """How to make `release` serve `layout`, written in the engine's terms."""

    def draft_tables(self, drafter_config: dict, mode: str, *, release: Release) -> DraftTables:
        """Whose embedding and lm_head the served drafter uses in `mode` ("eagle3" | "eagle"),
        how many logits it scores, whether d2t maps its ids (the draft vocabulary rule)."""

    def drafter_support(self, drafter_config: dict, *, release: Release) -> DrafterSupport:
        """Whether `release` builds this drafter's class, crashes on a missing draft_vocab_size,
        and captures auxiliary states (DrafterSupport); what lint checks before the layout."""

    # ---- trees ---------------------------------------------------------------------------
    def resolve_tree(self, num_steps: int | None, topk: int | None, num_draft_tokens: int | None,
                     target_config: dict | None, *, release: Release,
                     algorithm: str = "EAGLE3") -> ResolvedShape:
        """The tree the server runs for these launch flags (None = omitted), auto defaults
        and rewrites applied; a flag set the server refuses resolves with `crash` set."""

    # ---- verification --------------------------------------------------------------------
    def verification(self, release: Release) -> Verification:
        """The greedy and sampled verification rules the decode loop applies (Verification)."""

    def round_accounting(self, release: Release) -> str:
        """Which verify rounds of a request the engine counts (replay/round_accounting.py names
        them): "to-end" (every step until the request ends, scored before the max_tokens cut)
        or "window" (only rounds whose draft window lies inside the emitted sequence)."""

    def numerics(self, release: Release) -> str:
        """Where the engine's reduced-precision forward rounds (target/engine_numerics.py names
        them): "transformers" (diag's reference, each op rounded as transformers rounds it) or
        "fp32-kernels" (fused add + RMSNorm, RoPE and attention in float32, one rounding each)."""

    def request_defaults(self, generation_config: dict | None, sampling_defaults: str = "model", *,
                         release: Release) -> RequestDefaults:
        """What a request that sets no sampling parameter runs: the target's generation_config.json
        values or the engine's own defaults (`sampling_defaults`: the launch line's setting)."""

    # ---- metric formulas -----------------------------------------------------------------
    def accept_rate_formula(self, release: Release) -> str:
        """The diag.metrics function name this release logs as its accept rate."""

    def formula_label(self, formula: str) -> str:
        """"SGLang 0.5.11–0.5.23: Σa / (rounds·(D-1)), draft slots only"."""

    def explain_logged(self, accept_len: float, accept_rate: float, *, num_steps: int | None, topk: int | None,
                       num_draft_tokens: int | None, architecture: str, decimals: int,
                       release: Release | None) -> Any:
        """`diag explain`: which num_draft_tokens and rate formula make a logged (accept len,
        accept rate) pair consistent, what the launch flags ran, whether `release` (None: not
        named) logs a formula that fits. The record has `sentences`, `consistent`, `engine_fits`
        and to_json(); a DiagError for an engine that logs no such pair."""

    # ---- readers (each returns the engine's own frozen record; DiagError when unsupported) --
    def read_log(self, text: str, *, source: str, release: Release) -> Any:
        """The server log's speculative decode lines and its printed server arguments."""

    def read_responses(self, text: str, *, source: str, release: Release) -> Any:
        """Per-request counts from saved generation responses (one JSON object a line)."""

    def read_server_info(self, text: str, *, source: str) -> Any:
        """The server's self-description: version, lifetime accept length, tree."""

    def read_metrics(self, text: str, *, source: str) -> Any:
        """The speculative counters of a saved GET /metrics (Prometheus text)."""

    def simulated_acceptance(self, accept_length: float, acceptance_at_depth: tuple[float, ...], shape: TreeShape,
                             *, release: Release | None) -> BenchmarkSettings:
        """What makes this engine's server benchmark run at this accept length (clamped to
        [1, S + 1]) and per-depth acceptance P(a >= i) on this tree (diag/engines/simulate.py
        merges every engine's); `release`: the observed server's when it is this family's, else
        None."""
    def read_baseline_log(self, text: str, *, source: str) -> Any:
        """The decode lines of a plain (non-speculative) run's log; their tokens/s are the baseline."""

    def output_release(self, version: str, *, field: str, file: str | None) -> Release:
        """The release whose saved server output diag is given ("0.5.8", "sglang-0.5.8"), checked
        against the releases whose output diag reads; a DiagError naming `field` and `file`."""

    def spec_max_running_requests(self, release: Release) -> int | None:
        """How many requests the speculative server runs at once when nothing says (SGLang: 48)."""

    def log_draft_tokens(self, accept_len: float, accept_rate: float) -> tuple[tuple[int, str], ...]:
        """Every (num_draft_tokens, accept-rate formula) that fits a log line's printed accept
        length and accept rate (SGLang 0.5.8: "accept len: 1.68, accept rate: 0.84" -> (2, legacy))."""

    # ---- engine sanity -------------------------------------------------------------------
    def read_sampled(self, text: str, *, source: str, temperature: float, release: Release) -> Sampled:
        """One saved sampled run (the format this engine's counters come in) as its accept length."""

    def sampled_sanity(self, sampled: list[Sampled], greedy: float, k: int, *, release: Release,
                       greedy_source: str, platform: str | None = None) -> EngineSanity:
        """Whether the sampled runs approach `greedy` as T -> 0 (diag/engines/sanity.py), worded
        in this engine's terms."""

    # ---- a benchmark at a chosen acceptance (diag/engines/simulate.py merges every engine's) ----
    def simulation_legend(self) -> str:
        """How report.md introduces this engine's benchmark settings ("SGLang: environment of the launch")."""

    def simulation_cell(self, row: dict) -> str:
        """This engine's settings in a report's `simulate` row, as report.md shows them."""

    def simulation_schema(self) -> dict:
        """The JSON Schema of each field this engine writes into a `simulate` row (BenchmarkSettings.fields),
        keyed by field in their order: the row's schema requires them and admits no other key."""

    # ---- launch-flag lint ----------------------------------------------------------------
    def launch_argv(self, command: str | list[str]) -> list[str]:
        """The words after the program, as the server's parser gets them ('python -m
        sglang.launch_server --tp 8' -> ['--tp', '8']); a DiagError when the command does not
        start this engine's server."""

    def parse_launch(self, command: str | list[str], *, release: Release) -> LaunchFlags:
        """The launch line's flags diag reads, by this release's spellings."""

    def effective_config(self, flags: LaunchFlags, target_config: dict | None, *,
                         release: Release) -> EffectiveConfig:
        """What the server will run for those flags: algorithm, tree, running requests, crash."""

    def flag_problems(self, argv: list[str], *, release: Release) -> list[FlagProblem]:
        """Every flag this release's parser refuses or reads differently from how it is written."""

    def cross_check(self, effective: EffectiveConfig, argv: list[str]) -> list[FlagProblem]:
        """What the engine's own installed launch parser resolves where it differs from
        `effective` (diag's mirror of its rules), or one "info" problem saying why it could not
        be asked; [] for an engine diag does not cross-check."""

    # ---- live server -------------------------------------------------------------------
    def live_server(self) -> LiveServer:
        """How diag.probe talks to a running server of this family (LiveServer)."""
