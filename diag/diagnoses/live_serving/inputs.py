"""A case's [server] section (or --server-* flags) -> one ServerObservation, before any weight
is loaded: reads the files, checks their release, pairs the responses with the case's prompts.

Pairing rule: every case prompt needs one response whose id is its prompt id. Responses for
prompts outside the case are an error, except when the case narrows its prompt set (`limit`,
`categories`): then they are left out and a note says how many. No id in common at all is an
error that says how SGLang names requests (rid).

Span rule: the server's accept length depends on how far into a generation it was measured, so
the replay must cover the spans the server generated. The responses' completion_tokens are
compared with the replay's max_new_tokens (give or take max(2, 10%): the prefill token, a last
round cut short): a replay shorter than the server's median completion is an error (512-token generations are not "the same prompts" as a 16-token replay); a replay
longer than the server's longest completion gets a note; both spans are always stated in a note.
Worked example: completions 512 x 6, max_new_tokens 16 -> DiagError prompts.max_new_tokens,
expected ">= 512", found 16.

This module reads the server's files (the I/O edge of the reconciliation); the combination
rules live in observation.py, the parsers in diag/engines.
"""

from __future__ import annotations

from pathlib import Path

from diag.engines import DEFAULT_FAMILY, engine, family_rules, rules
from diag.errors import DiagError
from diag.checkpoint.readable import require_readable
from diag.run.case import Case, resolve_path
from diag.run.prompts import read_prompt_set
from diag.diagnoses.live_serving.sampled import read_sampled
from diag.diagnoses.live_serving.text_match import match_by_text
from diag.diagnoses.live_serving.observation import (LogLoad, Observed, ServerObservation, agree_on_shape, log_draft_tokens,
                                         pooled_log, pooled_requests)
from diag.trees import TreeShape, tree_shape

METRICS = "vllm_metrics"        # [server]'s /metrics scrape, in the format of the family it is named for
FILES = ("log", "baseline_log", "responses", "server_info", METRICS)
COUNTERS_ONLY = ("log", "baseline_log", "responses", "server_info")   # files of the default family's shape


def given(case: Case) -> bool:
    sv = case.server
    return any(getattr(sv, f) is not None for f in (*FILES, "baseline_tokens_per_second", "tokens_per_second",
                                                     "accept_length", "sampled"))


def _text(case: Case, name: str) -> tuple[str, str] | None:
    spec = getattr(case.server, name)
    if spec is None:
        return None
    path = Path(resolve_path(spec, case, f"server.{name}"))
    if not path.is_file():
        raise DiagError("server file not found", file=str(path), field=f"server.{name}",
                        expected="a file saved from the server", found="no such file")
    require_readable(path, "server file", field=f"server.{name}")
    try:
        return str(path), path.read_text()
    except UnicodeDecodeError as err:
        raise DiagError("server file is not text", file=str(path), field=f"server.{name}", expected="UTF-8 text",
                        found=str(err)) from None


def _check_numbers(case: Case) -> None:
    sv, src = case.server, case.source
    for name in ("baseline_tokens_per_second", "tokens_per_second", "accept_length", "concurrency",
                 "max_running_requests"):
        v = getattr(sv, name)
        if v is not None and not v > 0:
            raise DiagError("server value must be positive", file=src, field=f"server.{name}", expected="> 0", found=v)
    if sv.accept_length is not None and sv.accept_length < 1:
        raise DiagError("an accept length includes the bonus token, so it is at least 1", file=src,
                        field="server.accept_length", expected=">= 1.00", found=sv.accept_length)


def pair(requests: tuple, prompt_ids: list[str], *, narrowed: bool,
         source: str, texts: dict[str, str | None] | None = None) -> tuple[tuple, list[str]]:
    """The responses in the case's prompt order, and notes (see the module docstring); with
    a request id that is no prompt id, by the prompt text saved with it (text_match.py)."""
    by_id, wanted, paired = {r.id: r for r in requests}, set(prompt_ids), []
    if texts and any(r.prompt is not None and r.id not in wanted for r in requests):
        requests, n = match_by_text(requests, texts, source)
        by_id, paired = {r.id: r for r in requests}, [f"{n} responses paired with prompts by their text (their "
                                                      "request ids match no prompt id)"] if n else []
    if not wanted & set(by_id):
        raise DiagError("the responses' request ids match none of the case's prompt ids", file=source,
                        field="meta_info.id", expected=f"prompt ids such as {prompt_ids[:3]}",
                        found=f"ids such as {list(by_id)[:3]}",
                        hint='send "rid": "<prompt id>" with each /generate request, or add a top-level "id"')
    missing = [i for i in prompt_ids if i not in by_id]
    if missing:
        raise DiagError("the responses do not cover the case's prompts", file=source, field="meta_info.id",
                        expected=f"one response for each of the {len(prompt_ids)} prompts",
                        found=f"{len(missing)} missing, e.g. {missing[:5]}")
    extra = [r.id or f"record {r.record}" for r in requests if r.id not in wanted]
    if extra and not narrowed:
        raise DiagError("the responses hold prompts the case does not replay", file=source, field="meta_info.id",
                        expected=f"only the case's {len(prompt_ids)} prompt ids", found=f"{len(extra)} others, "
                        f"e.g. {extra[:5]}", hint="replay the same prompt set the server answered")
    notes = paired + ([f"{len(extra)} responses are for prompts outside the case's narrowed prompt set and are "
                       "not used"] if extra else [])
    return tuple(by_id[i] for i in prompt_ids), notes


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


class _Sources:
    """Accumulates what each file says; `observation()` combines it."""

    def __init__(self, case: Case, target_config: dict | None):
        self.case, self.tcfg = case, target_config
        self.files: list[tuple[str, str]] = []
        self.aggregates: list[Observed] = []
        self.shapes: list[tuple[str, TreeShape]] = []
        self.draft_sets: list[tuple[str, tuple[int, ...]]] = []
        self.mrr: list[tuple[str, int]] = []
        self.notes: list[str] = []
        self.requests: tuple = ()              # the engine's per-request counts (EngineRules.read_responses)
        self.log = self.counters = None
        self.info_version: str | None = None

    def shape(self, src: str, tree: tuple) -> None:
        if None not in tree:
            self.shapes.append((src, TreeShape(*tree)))


def _release(case: Case, info_version: str | None, info_file: str | None, fam):
    """The release that wrote the files (EngineRules.output_release): [server] engine, else the
    server_info's version, else the case's serving engine; the two named must agree."""
    declared = case.server.engine
    if declared is None and info_version is not None:
        return fam.output_release(info_version, field="version", file=info_file)
    rel = fam.output_release(declared or case.serving.engine, field="server.engine", file=case.source)
    if info_version is not None and fam.output_release(info_version, field="version", file=info_file) != rel:
        raise DiagError(f"the server files come from different {rel.display} releases", file=info_file,
                        field="version", expected=f"{rel.version} (server.engine)", found=info_version)
    return rel


def read_server(case: Case, prompt_ids: list[str], target_config: dict | None, *, seed: int = 0,
                n_boot: int = 2000) -> ServerObservation | None:
    """Everything the case says about the live server, checked; None when it says nothing."""
    if not given(case):
        return None
    _check_numbers(case)
    sv, s = case.server, _Sources(case, target_config)
    eng = engine(sv.engine or case.serving.engine)
    if eng.family != DEFAULT_FAMILY:
        return _other_family(s, eng)
    info_text = _text(case, "server_info")
    info = rules(eng).read_server_info(info_text[1], source=info_text[0]) if info_text else None
    rel = _release(case, info.version if info else None, info_text[0] if info_text else None, rules(eng))
    if info is not None:
        s.files.append(("server_info", info.source))
        s.aggregates.append(Observed(info.accept_length, info.accept_length, info.accept_length,
                                     f"/server_info, {info.ranks} rank(s), lifetime average"))
        s.shape(f"{info.source} (speculative_*)", info.tree)
        if info.max_running_requests is not None:
            s.mrr.append((info.source, info.max_running_requests))
    _read_log(s, rel, seed, n_boot)
    _read_responses(s, rel, prompt_ids, seed, n_boot)
    _read_counters(s)
    if sv.tree is not None:
        s.shapes.insert(0, ("server.tree", tree_shape(sv.tree, field="server.tree")))
    _launch(s, eng.display)
    return _observation(s, rel, seed, n_boot)


def _read_log(s: _Sources, rel, seed: int, n_boot: int) -> None:
    got = _text(s.case, "log")
    if got is None:
        return
    eng = engine(rel.name)
    s.log = rules(eng).read_log(got[1], source=got[0], release=eng)
    s.files.append(("log", got[0]))
    if s.log.server_args is not None:
        s.shape(f"{got[0]} line {s.log.server_args.line_no} (server_args)", s.log.server_args.tree)
        if s.log.server_args.max_running_requests is not None:
            s.mrr.append((f"{got[0]} (server_args)", s.log.server_args.max_running_requests))
    s.draft_sets.append((f"{got[0]} (accept len / accept rate)",
                         log_draft_tokens(s.log.speculative, s.log.rate_formula, eng.label, got[0],
                                          rules(eng).log_draft_tokens)))
    s.aggregates.append(pooled_log(s.log.speculative, seed=seed, n_boot=n_boot))


def _read_responses(s: _Sources, rel, prompt_ids: list[str], seed: int, n_boot: int) -> None:
    got = _text(s.case, "responses")
    if got is None:
        return
    eng = engine(rel.name)
    resp = rules(eng).read_responses(got[1], source=got[0], release=eng)
    p = s.case.prompts
    texts = {q.id: q.text for q in read_prompt_set(resolve_path(p.file, s.case, "prompts.file")).prompts} \
        if any(r.prompt is not None for r in resp.requests) else None
    s.requests, notes = pair(resp.requests, prompt_ids, narrowed=p.limit is not None or bool(p.categories),
                             source=got[0], texts=texts)
    s.notes += list(resp.notes) + notes
    s.files.append(("responses", got[0]))
    ds = sorted({r.num_draft_tokens for r in s.requests if r.num_draft_tokens is not None})
    if len(ds) > 1:
        raise DiagError("the responses come from servers with different trees", file=got[0],
                        field="meta_info spec_*_proposed_drafts / spec_verify_ct",
                        expected="one num_draft_tokens", found=ds)
    if ds:
        s.draft_sets.append((f"{got[0]} (proposed drafts per round)", tuple(ds)))
    s.aggregates.insert(0, pooled_requests(s.requests, seed=seed, n_boot=n_boot))
    s.notes += check_spans([r.completion_tokens for r in s.requests], p.max_new_tokens, p.recorded, got[0])


def check_spans(completions: list[int], max_new_tokens: int, recorded: str | None, source: str) -> list[str]:
    """The span rule (module docstring): a DiagError, or the notes that state both spans."""
    if not completions:
        return []
    lo, hi, med = min(completions), max(completions), sorted(completions)[len(completions) // 2]
    replay = (f"the replay continues each prompt up to {max_new_tokens} tokens"
              + (f" of the recorded continuations ({recorded})" if recorded else ""))
    server = f"the server generated {lo}-{hi} tokens per request (median {med})"
    slack = max(2, max_new_tokens // 10)      # the prefill token, a last round cut short
    if med > max_new_tokens + slack:
        raise DiagError("the replay is shorter than the server's generations, so the two accept lengths "
                        "would be measured over different spans", file=source, field="prompts.max_new_tokens",
                        expected=f">= {med} (the median completion_tokens of the responses; {server})",
                        found=f"{max_new_tokens}",
                        hint=f"replay with --max-new-tokens {hi} (or max_new_tokens = {hi} in [prompts])")
    notes = [f"server spans: {server}; {replay}"]
    if max_new_tokens > hi + slack:
        notes.append(f"server spans: the replay runs {max_new_tokens - hi} tokens past the server's longest "
                     f"completion ({hi}); positions after {hi} are measured by the replay alone")
    return notes


def _metrics_family():
    """(the EngineRules, the display name) of the family whose /metrics format [server] METRICS holds."""
    fam = family_rules(METRICS.removesuffix("_metrics"))
    return fam, fam.release(fam.releases()[-1]).display


def _read_counters(s: _Sources) -> None:
    got = _text(s.case, METRICS)
    if got is None:
        return
    fam, display = _metrics_family()
    s.counters = fam.read_metrics(got[1], source=got[0])
    k = s.counters.num_speculative_tokens
    s.files.append((METRICS, got[0]))
    s.shapes.append((f"{got[0]} ({display} drafts {k} tokens per round, a chain)", TreeShape(k, 1, k + 1)))
    al = s.counters.accept_length
    s.aggregates.insert(1 if s.requests else 0, Observed(al, al, al, f"{display} counters, {s.counters.num_drafts} drafts"))


def _launch(s: _Sources, display: str) -> None:
    """The case's launch command, read with the default release's rules (as `diag lint` reads it): its
    tree, its max_running_requests."""
    if not s.case.serving.launch:
        return
    d = engine()
    eff = rules(d).effective_config(rules(d).parse_launch(s.case.serving.launch, release=d), s.tcfg, release=d)
    explicit = eff.flags.num_steps is not None and eff.flags.topk is not None   # auto defaults vary by release
    if explicit and eff.tree is not None and eff.tree.shape is not None and not eff.crash:
        s.shapes.append((f"serving.launch ({display}'s rules)", eff.tree.shape))
        s.notes += [f"launch command: {n}" for n in eff.tree.notes]
    if eff.max_running_requests is not None:
        s.mrr.append(("serving.launch", eff.max_running_requests))


def _other_family(s: _Sources, eng) -> ServerObservation:
    """A server of another family than the default: its /metrics counters, its sampled runs, the
    user's numbers and its launch command, each read with that engine's rules (the protocol)."""
    sv = s.case.server
    for name in COUNTERS_ONLY:
        if getattr(sv, name) is not None:
            raise DiagError(f"diag reconciles a {eng.label} server from its /metrics scrape", file=s.case.source,
                            field=f"server.{name}", expected=f"server.{METRICS} (GET /metrics), server.sampled",
                            found=f"a {name} file", hint="`diag explain` reads the server's log")
    if sv.concurrency is not None and sv.max_running_requests is None:
        raise DiagError(f"diag does not know how many requests {eng.label} runs at once", file=s.case.source,
                        field="server.max_running_requests", expected="the server's limit on running requests",
                        found="missing (server.concurrency is set)")
    eng_rules = rules(eng)
    _read_counters(s)
    if sv.tree is not None:
        s.shapes.insert(0, ("server.tree", tree_shape(sv.tree, field="server.tree")))
    if s.case.serving.launch:
        eff = eng_rules.effective_config(eng_rules.parse_launch(s.case.serving.launch, release=eng), s.tcfg,
                                         release=eng)
        if eff.tree is not None and eff.tree.shape is not None and not eff.crash:
            s.shapes.append((f"serving.launch ({eng.display}'s rules)", eff.tree.shape))
    shape, where, ds = agree_on_shape(s.shapes, s.draft_sets)
    aggregates = s.aggregates + ([Observed(sv.accept_length, sv.accept_length - 0.005, sv.accept_length + 0.005,
                                           "server.accept_length")] if sv.accept_length is not None else [])
    run_al = sv.accept_length if sv.accept_length is not None else (aggregates[0].value if aggregates else None)
    return ServerObservation(
        eng.version, tuple(s.files), aggregates[0] if aggregates else None, tuple(aggregates[1:]), (), shape, where,
        ds, None, s.counters.acceptance_at_depth if s.counters is not None else None, sv.tokens_per_second,
        "server.tokens_per_second" if sv.tokens_per_second is not None else None, run_al,
        sv.baseline_tokens_per_second,
        "server.baseline_tokens_per_second" if sv.baseline_tokens_per_second is not None else None,
        sv.concurrency, sv.max_running_requests,
        "server.max_running_requests" if sv.max_running_requests else f"not known for {eng.label}", None, tuple(s.notes),
        eng.name, eng.label, read_sampled(s.case, eng))


def _observation(s: _Sources, rel, seed: int, n_boot: int) -> ServerObservation:
    sv, eng = s.case.server, engine(rel.name)
    shape, where, ds = agree_on_shape(s.shapes, s.draft_sets)
    user = [Observed(sv.accept_length, sv.accept_length - 0.005, sv.accept_length + 0.005, "server.accept_length")] \
        if sv.accept_length is not None else []
    aggregates = s.aggregates + user
    tps, tps_src = sv.tokens_per_second, "server.tokens_per_second"
    if tps is None and s.log is not None:
        tps, tps_src = _mean(d.gen_throughput for d in s.log.speculative), \
            f"scheduler log, mean gen throughput of {len(s.log.speculative)} lines"
    run_al = sv.accept_length if sv.accept_length is not None else \
        (pooled_log(s.log.speculative, seed=seed, n_boot=n_boot).value if s.log is not None else
         (aggregates[0].value if aggregates else None))
    base, base_src = _baseline(s)
    mrr_src, mrr = (("server.max_running_requests", sv.max_running_requests) if sv.max_running_requests else
                    (s.mrr[0] if s.mrr else (f"{eng.display}'s speculative-mode default",
                                             rules(eng).spec_max_running_requests(eng))))
    return ServerObservation(
        rel.version, tuple(s.files), aggregates[0] if aggregates else None, tuple(aggregates[1:]), s.requests,
        shape, where, ds, rules(eng).accept_rate_formula(eng) if s.log is not None else None,
        s.counters.acceptance_at_depth if s.counters is not None else None,
        tps, tps_src if tps is not None else None, run_al, base, base_src, sv.concurrency, mrr, mrr_src,
        _load(s.log, mrr) if s.log is not None else None, tuple(s.notes),
        eng.name, eng.label, read_sampled(s.case, eng))


def _baseline(s: _Sources) -> tuple[float | None, str | None]:
    if s.case.server.baseline_tokens_per_second is not None:
        return s.case.server.baseline_tokens_per_second, "server.baseline_tokens_per_second"
    got = _text(s.case, "baseline_log")
    if got is None:
        return None, None
    lines = rules(s.case.server.engine or s.case.serving.engine).read_baseline_log(got[1], source=got[0])
    s.files.append(("baseline_log", got[0]))
    return _mean(d.gen_throughput for d in lines), f"baseline log, mean gen throughput of {len(lines)} lines"


def _load(log, mrr: int) -> LogLoad:
    lines = log.speculative
    return LogLoad(len(lines), max(d.running_req for d in lines), max(d.queue_req for d in lines),
                   sum(1 for d in lines if d.running_req >= mrr and d.queue_req > 0))
