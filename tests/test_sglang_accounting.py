"""SGLang's round accounting (diag/engines/sglang/round_accounting.py) against SGLang's own code:
the scheduler's per-request counting (batch_result_processor.py, the function that adds a verify
round to spec_verify_ct and its accepted drafts) and Req.update_finish_state with the finish
checks it calls (schedule_batch.py), both executed from the wheels (tests/sglang_wheels.py).

A request is driven as process_batch_result_decode drives it: the prefill emits t_P and checks
the finish; then, while the request is unfinished, a verify round rooted at j accepts a[j]
drafts, the wheel's function counts it and returns the run (drafts + bonus), the run is
appended to output_ids and the wheel's update_finish_state decides. Token ids are 10 + index,
so a stop token sits at a chosen index. diag's rule must give the same spec_verify_ct and
accepted drafts, and the output the wheel keeps is the emitted sequence diag scores up to.
CI executes the newest release and 0.5.14, the first whose only counting site is
_resolve_spec_v2_tokens (earlier ones count in eagle_info.py's verify: read, not executed).
"""

from __future__ import annotations

import logging
import random
import re
from http import HTTPStatus
from types import SimpleNamespace

import pytest
import torch

import sglang_wheels as wheels
from diag.engines import engine, rules
from diag.engines.sglang.round_accounting import ACCOUNTING, COUNTED_IN, source
from diag.engines.sglang.versions import RELEASES
from diag.replay.round_accounting import accounting_for
from diag.replay.verify import trajectory

pytestmark = pytest.mark.sglang

EXECUTED = ("0.5.14", RELEASES[-1])
SCHEDULE = "srt/managers/schedule_batch.py"
PROCESSOR = "srt/managers/scheduler_components/batch_result_processor.py"
FINISH = ("BaseFinishReason", "FINISH_MATCHED_TOKEN", "FINISH_MATCHED_STR", "FINISHED_MATCHED_REGEX",
          "FINISH_LENGTH", "FINISH_ABORT")
REQ = ("finished", "update_finish_state", "_check_vocab_boundary_finish", "_check_str_based_finish",
       "_check_token_based_finish", "_cap_finished_len_at_max_new_tokens", "output_ids_through_stop",
       "update_spec_correct_drafts_histogram")


def tok(i: int) -> int:
    return 10 + i


def _wheel_code(version: str):
    """(a Req class built from the wheel's methods, the wheel's counting function)."""
    ns = wheels.load(version, SCHEDULE, FINISH, {"HTTPStatus": HTTPStatus, "re": re,
                                                  "logger": logging.getLogger("sglang")})
    methods = {}
    for name in REQ:
        if wheels.definition_source(version, SCHEDULE, f"Req.{name}") is None:
            continue                       # e.g. no _cap_finished_len_at_max_new_tokens in older releases
        methods[name] = wheels.load(version, SCHEDULE, [f"Req.{name}"], dict(ns))[name]
    req_cls = type("Req", (), methods)
    fn = next(n for n in ("_resolve_spec_v2_tokens", "_resolve_spec_overlap_token_ids")
              if wheels.definition_source(version, PROCESSOR, f"SchedulerBatchResultProcessor.{n}"))
    helpers = [h for h in ("_get_speculative_output_stride",) if wheels.definition_source(version, PROCESSOR, h)]
    pns = wheels.load(version, PROCESSOR, helpers + [f"SchedulerBatchResultProcessor.{fn}"], {})
    return req_cls, pns[fn]


def sglang_request(version: str, prompt_len: int, max_new: int, acc: dict[int, int], steps: int,
                   eos_at: int | None = None) -> SimpleNamespace:
    """One request through the wheel's code; returns the Req (spec_verify_ct, accepted drafts,
    output_ids_through_stop)."""
    req_cls, count = _wheel_code(version)
    req = req_cls()
    req.__dict__.update(
        output_ids=[], finished_reason=None, finished_len=None, to_finish=None, grammar=None, vocab_size=1000,
        tokenizer=None, eos_token_ids={tok(eos_at)} if eos_at is not None else set(), is_retracted=False,
        sampling_params=SimpleNamespace(max_new_tokens=max_new, ignore_eos=False, stop_token_ids=set(),
                                        stop_strs=[], stop_regex_strs=[]),
        kv=SimpleNamespace(kv_committed_len=0), kv_committed_len=0, spec_verify_ct=0, spec_num_correct_drafts=0,
        spec_accepted_drafts=0, spec_correct_drafts_histogram=[], spec_num_block_accept_tokens=0,
        spec_num_cap_tokens=0)
    noop = lambda *a, **k: None                                               # noqa: E731
    processor = SimpleNamespace(metrics_reporter=SimpleNamespace(snapshot_spec_decode_metrics=noop),
                                model_worker=SimpleNamespace(on_verify_complete_cpu=noop),
                                advance_grammar_fsm=noop,
                                draft_worker=SimpleNamespace(speculative_num_draft_tokens=steps + 1))
    batch = SimpleNamespace(reqs=[req], has_grammar=False, spec_algorithm=SimpleNamespace(is_dflash=lambda: False))
    req.output_ids.append(tok(prompt_len))               # the prefill's token t_P
    req.update_finish_state()
    j = prompt_len - 1
    while not req.finished():
        a = acc[j]
        run = [tok(j + 2 + i) for i in range(a + 1)]      # drafts t_{j+2}.., then the bonus
        result = SimpleNamespace(
            next_token_ids=torch.tensor(run + [0] * (steps - a)), accept_lens=torch.tensor([a + 1]),
            speculative_output_stride=steps + 1, speculative_num_draft_tokens=steps + 1,
            num_non_draft_tokens_per_req=1, block_accept_lens=None, cap_lens=None, grammar_retained_tokens=None,
            num_correct_drafts=None, num_accepted_tokens=None)
        counted = count(processor, result, batch)[0]
        req.output_ids.extend(counted)                  # process_batch_result_decode
        req.update_finish_state(len(counted))
        j += a + 1
    return req


def diag_rounds(version: str, prompt_len: int, end: int, acc: dict[int, int], steps: int) -> list[int]:
    """The accepted drafts of the rounds diag's rule for this release counts: its roots, the
    greedy trajectory through them."""
    rule = accounting_for(rules(f"sglang-{version}").round_accounting(engine(f"sglang-{version}")))
    roots = rule.roots(prompt_len, end, steps)
    a = torch.tensor([acc.get(j, 0) for j in roots], dtype=torch.long)       # roots off the trajectory: any a
    return a[trajectory(a)].tolist() if len(roots) else []


def _accepted(req) -> int:
    return req.spec_num_correct_drafts or req.spec_accepted_drafts


@pytest.mark.parametrize("version", EXECUTED)
def test_the_worked_example(version):
    """Prompt 5, max_new_tokens 6, a chain of 3: rounds at 4 (a = 3) and 8 (a = 2, two drafts past
    the cut) -> spec_verify_ct 2, accepted 5, completion 6 (module docstring of the rule)."""
    req = sglang_request(version, 5, 6, {4: 3, 8: 2}, 3)
    assert (req.spec_verify_ct, _accepted(req), len(req.output_ids_through_stop)) == (2, 5, 6)
    assert diag_rounds(version, 5, 11, {4: 3, 8: 2}, 3) == [3, 2]


@pytest.mark.parametrize("version", EXECUTED)
@pytest.mark.parametrize("seed", range(12))
def test_sglangs_counters_are_diags_rounds(version, seed):
    rnd = random.Random(seed)
    steps = rnd.choice([1, 3, 5])
    prompt_len, max_new = rnd.randint(2, 9), rnd.randint(1, 30)
    eos_at = rnd.choice([None, prompt_len + rnd.randint(0, max_new + steps)])
    acc = {j: rnd.randint(0, steps) for j in range(prompt_len - 1, prompt_len + max_new + steps + 2)}
    req = sglang_request(version, prompt_len, max_new, acc, steps, eos_at)
    emitted = max_new if eos_at is None or eos_at >= prompt_len + max_new else eos_at - prompt_len + 1
    out = list(req.output_ids_through_stop)
    assert out == [tok(prompt_len + i) for i in range(emitted)], "the wheel kept another output"
    want = diag_rounds(version, prompt_len, prompt_len + emitted, acc, steps)
    assert (req.spec_verify_ct, _accepted(req)) == (len(want), sum(want)), (prompt_len, max_new, eos_at, steps)


def test_every_release_has_a_rule_and_a_source():
    for v in RELEASES:
        assert rules(f"sglang-{v}").round_accounting(engine(f"sglang-{v}")) == "to-end"
    assert [first for first, _ in ACCOUNTING] == ["0.5.6"]
    assert source("sglang-0.5.23").startswith("sglang 0.5.14–0.5.23: managers/scheduler_components/")
    assert [first for first, _ in COUNTED_IN] == ["0.5.6", "0.5.13", "0.5.14"]


@pytest.mark.parametrize("version", ["0.5.6", "0.5.13", "0.5.14", RELEASES[-1]])
def test_the_counting_sites_are_where_the_rule_says(version):
    """Each release's spec_verify_ct += 1 sits in the files COUNTED_IN names (and only there,
    besides n-gram / dflash speculation); spec v1 counts from the list copied before its cut."""
    import zipfile
    with zipfile.ZipFile(wheels._wheel(version)) as zf:
        sites = sorted(n[len("sglang/srt/"):] for n in zf.namelist()
                       if n.startswith("sglang/srt/") and n.endswith(".py")
                       and "spec_verify_ct += 1" in zf.read(n).decode(errors="replace"))
        eagle = zf.read("sglang/srt/speculative/eagle_info.py").decode() if version < "0.5.14" else ""
    named = {part.strip().split(" ")[0] for part in source(f"sglang-{version}").split(": ", 1)[1].split(";")}
    assert {s for s in sites if "ngram" not in s and "dflash" not in s} == named
    if eagle:
        assert "accept_index_cpu = accept_index.tolist()" in eagle
        assert re.search(r"sum\(1 for idx in accept_index_row if idx != -1\) - 1", eagle)
