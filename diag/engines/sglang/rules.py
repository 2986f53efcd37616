"""SGLang's answers to the EngineRules protocol (diag/engines/protocol.py), one method each,
delegating to the modules beside this one; the registry (diag/engines/__init__) finds RULES here.

Every rule lives in its own module (capture.py, conventions.py, serving.py, tree_rules.py,
accept_rate.py, server_log.py, server_responses.py, launch.py, flag_parser.py); this module
only adapts their signatures to the protocol's. Worked example (SGLang 0.5.23, a 6-layer Llama
target): RULES.serving_ids(embed+L2+L4, cfg, release=RULES.release("0.5.23")) -> [-1, 1, 3];
RULES.resolve_tree(1, 1, 16, cfg, ...) -> chain-1 (D rewritten to S + 1 = 2).
This module knows no rule of its own.
"""

from __future__ import annotations

from dataclasses import replace

from diag.checkpoint.config import num_layers
from diag.engines.common import (BenchmarkSettings, DrafterSupport, DraftTables, EffectiveConfig, FlagProblem, Fix,
                                 LaunchFlags, RequestDefaults, ResolvedShape, ServingError, ServingPlan)
from diag.engines.protocol import Release, Verification
from diag.engines import conventions
from diag.engines.sanity import EngineSanity, Sampled, limit_check
from diag.engines.sglang import (accept_rate, explain, flag_parser, launch, round_accounting, server_log,
                                 server_releases, server_responses, serving, simulate)
from diag.engines.sglang.explain import consistent_pairs
from diag.engines.sglang import conventions as _sglang_conventions  # noqa: F401  (registers them)
from diag.engines.sglang.algorithms import ALIASES, MODES, mode_of
from diag.engines.sglang.architectures import auto_defaults_key, capture_model
from diag.engines.sglang.capture import NoCapture, capture_rule
from diag.engines.sglang.decoding import request_defaults
from diag.engines.sglang import drafter_keys
from diag.engines.sglang.draft_tables import SOURCE as TABLES_SOURCE, draft_tables_for
from diag.engines.sglang.drafter_models import builds_drafter, class_fix, drafter_classes
from diag.engines.sglang.serving import IDS_FIELD
from diag.engines.sglang.tree_rules import resolve_sglang_shape
from diag.engines.sglang.versions import RELEASES, engine
from diag.errors import DiagError
from diag.layouts import Layout
from diag.trees import TreeShape

VERIFICATION = Verification(
    "tree-argmax", "tree-target-only",
    "greedy: verify_tree_greedy, the deepest path equal to the target's argmax continuation; sampled: "
    "TreeSpeculativeSamplingTargetOnly, each child accepted with its target probability (draft "
    "probabilities never read), thresholds --speculative-accept-threshold-single / -acc")


class SglangEngine:
    """The EngineRules of SGLang 0.5.6-0.5.23 (see the module docstring)."""

    family = "sglang"
    display = "SGLang"
    ids_field = IDS_FIELD
    report_rates = accept_rate.REPORT_RATES
    report_rates_text = "SGLang's accept rate as 0.5.11+ and as ≤ 0.5.10 log it"

    def releases(self) -> tuple[str, ...]:
        return RELEASES

    def release(self, version: str) -> Release:
        return engine(version)

    def algorithms(self) -> tuple[str, ...]:
        return (*MODES, *ALIASES)

    def mode_of(self, algorithm: str) -> str:
        return mode_of(algorithm)

    def serving_plan(self, drafter_config: dict, target_config: dict, *, release: Release,
                     algorithm: str = "EAGLE3", cuda_graph: bool = True) -> ServingPlan | ServingError:
        try:
            return serving.serving_plan(drafter_config, target_config, engine_name=release.name,
                                        algorithm=algorithm, cuda_graph=cuda_graph)
        except DiagError as err:
            return ServingError(err.message, err.field, err.expected, err.found)

    def capture_convention(self, target_config: dict, *, release: Release) -> str:
        return serving.capture_convention(target_config, engine_name=release.name)

    def default_aux_layers(self, target_config: dict, *, release: Release) -> Layout | None:
        rule = capture_rule(release, capture_model(target_config))
        if isinstance(rule, NoCapture):
            return None
        return conventions.resolve(None, rule, num_layers(target_config)).layout

    def serving_ids(self, layout: Layout, target_config: dict, *, release: Release) -> list[int] | None:
        return serving.serving_ids(layout, target_config, engine_name=release.name)

    def fix_for(self, layout: Layout, target_config: dict, *, release: Release) -> Fix:
        return serving.fix_for(layout, target_config, engine_name=release.name)

    def draft_tables(self, drafter_config: dict, mode: str, *, release: Release) -> DraftTables:
        return replace(draft_tables_for(drafter_config, mode), source=TABLES_SOURCE)

    def drafter_support(self, drafter_config: dict, *, release: Release) -> DrafterSupport:
        arch = drafter_keys.drafter_class(drafter_config)
        aux, note = drafter_keys.uses_aux_hidden_state(drafter_config, release.name)
        classes = drafter_classes(engine_name=release.name)
        return DrafterSupport(builds_drafter(arch, engine_name=release.name), tuple(sorted(classes)),
                              drafter_keys.draft_vocab_crash(drafter_config, release.name), aux, note,
                              class_fix(arch, classes))

    def resolve_tree(self, num_steps: int | None, topk: int | None, num_draft_tokens: int | None,
                     target_config: dict | None, *, release: Release,
                     algorithm: str = "EAGLE3") -> ResolvedShape:
        return resolve_sglang_shape(num_steps, topk, num_draft_tokens, auto_defaults_key(target_config),
                                    eng=release, algorithm=algorithm)

    def verification(self, release: Release) -> Verification:
        return VERIFICATION

    def round_accounting(self, release: Release) -> str:
        """Every verify round of an unfinished request, the one max_new_tokens cuts counted whole
        (round_accounting.py, read in each release's scheduler)."""
        return round_accounting.accounting_for(release)

    def numerics(self, release: Release) -> str:
        return "transformers"    # SGLang's kernels (sgl_kernel, flashinfer) are not modelled

    def request_defaults(self, generation_config: dict | None, sampling_defaults: str = "model", *,
                         release: Release) -> RequestDefaults:
        return request_defaults(generation_config, sampling_defaults)

    def accept_rate_formula(self, release: Release) -> str:
        return accept_rate.formula_for(release)

    def formula_label(self, formula: str) -> str:
        return accept_rate.label(formula)

    def explain_logged(self, accept_len: float, accept_rate: float, *, num_steps: int | None, topk: int | None,
                       num_draft_tokens: int | None, architecture: str, decimals: int,
                       release: Release | None) -> explain.Explanation:
        return explain.explain(accept_len, accept_rate, num_steps=num_steps, topk=topk,
                               num_draft_tokens=num_draft_tokens, architecture=architecture, decimals=decimals,
                               engine_name=release.name if release is not None else None)

    def simulated_acceptance(self, accept_length: float, acceptance_at_depth: tuple[float, ...], shape: TreeShape,
                             *, release: Release | None) -> BenchmarkSettings:
        return simulate.simulated_acceptance_env(accept_length, shape, release)

    def read_log(self, text: str, *, source: str, release: Release) -> server_log.ServerLog:
        return server_log.read_server_log(text, source=source, release=release.release)

    def read_responses(self, text: str, *, source: str,
                       release: Release) -> server_responses.GenerateResponses:
        return server_responses.read_generate_responses(text, source=source, release=release.release)

    def read_server_info(self, text: str, *, source: str) -> server_responses.ServerInfo:
        return server_responses.read_server_info(text, source=source)

    def read_metrics(self, text: str, *, source: str):
        raise DiagError("diag reads no SGLang /metrics scrape", file=source, field="metrics",
                        expected="the server log, /generate responses or /server_info",
                        found="a metrics scrape named for SGLang")

    def read_baseline_log(self, text: str, *, source: str) -> tuple[server_log.DecodeLine, ...]:
        return server_log.read_baseline_log(text, source=source)

    def output_release(self, version: str, *, field: str, file: str | None) -> Release:
        rel = server_releases.server_release(version, field=field, file=file)
        return Release("sglang", server_releases.show(rel), "SGLang")

    def spec_max_running_requests(self, release: Release) -> int:
        return launch.SPEC_MAX_RUNNING_REQUESTS

    def log_draft_tokens(self, accept_len: float, accept_rate: float) -> tuple[tuple[int, str], ...]:
        return consistent_pairs(accept_len, accept_rate)

    def read_sampled(self, text: str, *, source: str, temperature: float, release: Release) -> Sampled:
        """Saved /generate responses at that temperature, pooled: 1 + Σa / Σrounds over requests."""
        reqs = [r for r in self.read_responses(text, source=source, release=release).requests if r.rounds]
        if not reqs:
            raise DiagError("the sampled responses hold no verify round", file=source, field="meta_info.spec_verify_ct",
                            expected="> 0 in some response", found="0 everywhere")
        rounds = sum(r.rounds for r in reqs)
        ds = {r.num_draft_tokens for r in reqs if r.num_draft_tokens is not None}
        return Sampled(temperature, 1.0 + sum(r.accepted_sum for r in reqs) / rounds, rounds,
                       max(ds) - 1 if ds else None, source)

    def sampled_sanity(self, sampled: list[Sampled], greedy: float, k: int, *, release: Release,
                       greedy_source: str, platform: str | None = None) -> EngineSanity:
        why = ("SGLang's sampled rule (TreeSpeculativeSamplingTargetOnly) accepts each child with its target "
               "probability, which tends to the greedy rule (verify_tree_greedy) as T -> 0; no layout explains "
               "a discontinuity, so diag fits none to these sampled numbers. Check the server's sampling path "
               "(the release, its sampling and attention backends) against the same engine at T=0.")
        return limit_check(sampled, greedy, k, release.label, greedy_source=greedy_source, why=why)

    def simulation_legend(self) -> str:
        return "SGLang: environment of the launch"

    def simulation_cell(self, row: dict) -> str:
        return f"`{row['sglang_command_prefix']} python -m sglang.launch_server ...`"

    def simulation_schema(self) -> dict:
        return {"sglang_env": {"type": "object", "required": ["SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD"],
                               "propertyNames": {"pattern": "^SGLANG_SIMULATE_ACC_[A-Z_]+$"},
                               "additionalProperties": {"type": "string"}},
                "sglang_command_prefix": {"type": "string"}}

    def launch_argv(self, command: str | list[str]) -> list[str]:
        return launch.server_argv(command)

    def parse_launch(self, command: str | list[str], *, release: Release) -> LaunchFlags:
        return launch.parse_launch(command, release.name)

    def effective_config(self, flags: LaunchFlags, target_config: dict | None, *,
                         release: Release) -> EffectiveConfig:
        return launch.effective_config(flags, target_config, engine_name=release.name)

    def flag_problems(self, argv: list[str], *, release: Release) -> list[FlagProblem]:
        """The parser's problems, each with `parser` set; FLAG_TABLE notes (severity "info")
        when no table is at or below the release, or the nearest one is older."""
        table = flag_parser.table_for(release.version)
        regen = "regenerate diag/engines/sglang/server_flags.json with this release"
        if table is None:
            return [FlagProblem("FLAG_TABLE", "info", "", f"no flag table for {release.label}: launch flags not "
                                "checked", "n/a", regen)]
        parser = f"SGLang {table.version}"
        out = [replace(x, parser=parser) for x in flag_parser.flag_problems(list(argv), table)]
        if not table.exact:
            out.append(FlagProblem("FLAG_TABLE", "info", "", f"launch flags checked against {parser}'s "
                                   f"parser, the nearest generated release at or below {release.version}",
                                   "flags added after that release are reported as warnings, not errors",
                                   regen, parser))
        return out

    def cross_check(self, effective: EffectiveConfig, argv: list[str]) -> list[FlagProblem]:
        """sglang's own ServerArgs, when sglang is importable (cross_check.py)."""
        from diag.engines.sglang.cross_check import ask_server_args
        return ask_server_args(effective, argv)

    # ---- live server -------------------------------------------------------------------
    def live_server(self):
        from diag.engines.sglang.live import LIVE
        return LIVE


RULES = SglangEngine()
