"""SGLang's round accounting: which verify rounds of a request its per-request counters count,
the last one of a request that hits max_new_tokens included (diag/replay/round_accounting.py
names the rules; this module says which one each release runs, and where it was read).

Read in every release's wheel, 0.5.6 to 0.5.23. A request's counters (`/generate` meta_info:
spec_verify_ct, and the accepted drafts under the release's key, server_responses.py) grow in
one place per verify round of an unfinished request:
  0.5.6 - 0.5.12.post1  speculative/eagle_info.py EagleVerifyInput.verify (spec v1) and
                        managers/scheduler_output_processor_mixin.py _resolve_spec_overlap_token_ids
                        (spec v2 / overlap)
  0.5.13 - 0.5.13.post1 eagle_info.py verify and managers/scheduler_components/
                        batch_result_processor.py _resolve_spec_v2_tokens
  0.5.14 - 0.5.23       batch_result_processor.py _resolve_spec_v2_tokens only
Each adds 1 to spec_verify_ct and the round's whole accepted run minus the bonus to the
accepted drafts: spec v1 reads `accept_index_row` from the list copied before it cuts the
tensor at the finishing token; spec v2 reads accept_lens, the verify's own output. Only then
does the scheduler append the run to output_ids and call Req.update_finish_state
(managers/schedule_batch.py), which finishes the request once len(output_ids) >= max_new_tokens
or at a stop token and cuts the output there (finished_len). So the round that crosses
max_new_tokens is counted whole, with its drafts past the cut: the "to-end" accounting, as
vLLM's. completion_tokens is the cut output (output_ids_through_stop), so SGLang's own
spec_accept_length = completion_tokens / spec_verify_ct counts fewer tokens than the rounds
accepted when the last round was cut.
Worked example (0.5.23, prompt 5, max_new_tokens 6, a chain of 3): the prefill emits t_5; the
round rooted at 4 accepts 3 (t_6..t_9), the one rooted at 8 accepts 2 (t_10, t_11, t_12: two
past the cut) -> spec_verify_ct 2, spec_num_correct_drafts 5 (diag's 1 + 5/2 = 3.5),
completion_tokens 6 (SGLang's spec_accept_length 6/2 = 3.0).
Not modelled: the batch-level counters behind the log line (metrics_reporter.update_spec_metrics):
under spec v1 they take the accepted counts after the cut, and under overlap scheduling a
request that just finished rides one more batch whose verify they count; the per-request
counters never see that round (its response was already sent, and 0.5.14+ skips finished
requests). tests/test_sglang_accounting.py runs the wheels' own Req.update_finish_state and
_resolve_spec_v2_tokens against this rule.

This module knows releases and where their counters grow; nothing about tensors or files.
"""

from __future__ import annotations

from diag.engines.sglang.versions import Engine, Since, since, span_of

ACCOUNTING: Since = (("0.5.6", "to-end"),)

# where each release counts a round, as read (module docstring)
COUNTED_IN: Since = (
    ("0.5.6", "speculative/eagle_info.py EagleVerifyInput.verify; "
              "managers/scheduler_output_processor_mixin.py _resolve_spec_overlap_token_ids"),
    ("0.5.13", "speculative/eagle_info.py EagleVerifyInput.verify; "
               "managers/scheduler_components/batch_result_processor.py _resolve_spec_v2_tokens"),
    ("0.5.14", "managers/scheduler_components/batch_result_processor.py _resolve_spec_v2_tokens"),
)


def accounting_for(eng: Engine | str | None) -> str:
    """The round accounting this release's per-request counters run: "to-end" for 0.5.6-0.5.23."""
    return since(ACCOUNTING, eng)


def source(eng: Engine | str | None) -> str:
    """Where the release counts a round, with the range that shares it:
    "sglang 0.5.14–0.5.23: managers/scheduler_components/batch_result_processor.py ..."."""
    return f"sglang {span_of(COUNTED_IN, eng)}: {since(COUNTED_IN, eng)}"
