"""The engine's round accounting (diag/replay/round_accounting.py) against a step-by-step model of
vLLM's scheduler loop, and its plumbing: sequences with a lookahead, replay's roots, dtypes."""

import random

import pytest
import torch

from diag.errors import DiagError
from diag.replay.replay import seq_roots
from diag.replay.round_accounting import ACCOUNTINGS, accounting_for
from diag.replay.verify import trajectory
from diag.target.passes import Sequence

VLLM, WINDOW = ACCOUNTINGS["to-end"], ACCOUNTINGS["window"]


def engine_rounds(prompt_len: int, end: int, acc: dict[int, int]) -> list[int]:
    """vLLM v1's loop, one request: the prefill emits t_P; every step of an unfinished request
    verifies a chain rooted at j and counts a = acc[j] (before the max_tokens / stop cut); the
    request has finished once its last emitted token is t_{end-1}."""
    j, emitted_to, counted = prompt_len - 1, prompt_len, []       # emitted_to: last emitted index
    while emitted_to < end - 1:
        a = acc[j]
        counted.append(a)
        emitted_to = min(end - 1, j + a + 2)
        j += a + 1
    return counted


@pytest.mark.parametrize("seed", range(20))
def test_vllm_accounting_visits_the_rounds_the_engine_counts(seed):
    rnd = random.Random(seed)
    S = rnd.choice([1, 3, 5])
    P, new = rnd.randint(2, 9), rnd.randint(1, 30)
    end = P + new
    acc = {j: rnd.randint(0, S) for j in range(P - 1, end + S)}
    roots = VLLM.roots(P, end, S)
    a = torch.tensor([acc[j] for j in roots])
    visited = a[trajectory(a)].tolist() if len(roots) else []
    assert visited == engine_rounds(P, end, acc)


def test_worked_examples():
    assert list(VLLM.roots(5, 11, 3)) == [4, 5, 6, 7, 8]
    assert list(WINDOW.roots(5, 11, 3)) == [4, 5, 6]
    assert VLLM.lookahead(5) == 5 and WINDOW.lookahead(5) == 0
    assert list(VLLM.roots(5, 6, 3)) == []           # max_tokens 1: the prefill's token only


def test_roots_never_pass_what_the_ids_can_verify():
    lookahead = Sequence("p", "c", 5, torch.arange(14), end=11)       # 5 + 6 emitted + 3 lookahead
    recorded = Sequence("p", "c", 5, torch.arange(11))                 # no lookahead
    assert list(seq_roots(lookahead, 3, VLLM)) == [4, 5, 6, 7, 8]
    assert list(seq_roots(recorded, 3, VLLM)) == [4, 5, 6]            # falls back to full windows
    assert list(seq_roots(lookahead, 3, WINDOW)) == [4, 5, 6]


def test_accounting_is_the_engines_rule():
    from diag.engines import engine, rules
    for name, want in (("vllm-0.32.0", VLLM), ("vllm-0.8.5", VLLM), ("sglang-0.5.23", VLLM), ("sglang-0.5.6", VLLM)):
        assert accounting_for(rules(name).round_accounting(engine(name))) is want, name
    with pytest.raises(DiagError, match="no such round accounting"):
        accounting_for("tensorrt-llm")


class _Greedy(torch.nn.Module):
    """A 'model' whose greedy next token is (last + 1) % 8, with generate() as transformers'."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def generate(self, input_ids, max_new_tokens, **_):
        out = input_ids
        for _ in range(max_new_tokens):
            out = torch.cat([out, (out[:, -1:] + 1) % 8], dim=1)
        return out


def test_build_sequences_keeps_a_lookahead_past_the_end_and_past_eos():
    from diag.target.passes import build_sequences
    seqs = build_sequences(_Greedy(), [("a", "c", [2, 3]), ("b", "c", [6])], 4, pad_id=0, eos_ids={7},
                           progress=False, lookahead=2)
    assert seqs[0].ids.tolist() == [2, 3, 4, 5, 6, 7, 0, 1] and seqs[0].emitted == 6   # 4 new, eos at the 4th
    assert seqs[1].ids.tolist() == [6, 7, 0, 1] and seqs[1].emitted == 2               # eos first: 1 emitted
    plain = build_sequences(_Greedy(), [("a", "c", [2, 3])], 4, pad_id=0, eos_ids={7}, progress=False)
    assert plain[0].ids.tolist() == [2, 3, 4, 5, 6, 7] and plain[0].end is None


def test_the_drafter_runs_in_the_targets_dtype_unless_told():
    from dataclasses import replace
    from pathlib import Path
    from diag.run.case import ModelSpec, read_case
    from diag.run.inputs import served_dtypes
    demo = read_case(Path(__file__).resolve().parents[1] / "cases" / "demo.toml")
    case = replace(demo, target=ModelSpec("t"), drafter=ModelSpec("d"))
    assert served_dtypes(case, {"dtype": "bfloat16"}) == (None, torch.bfloat16)
    assert served_dtypes(case, {"torch_dtype": "float32"}) == (None, torch.float32)
    told = replace(case, drafter=ModelSpec("d", dtype="float32"), target=ModelSpec("t", dtype="bfloat16"))
    assert served_dtypes(told, {"dtype": "float32"}) == (torch.bfloat16, torch.float32)
    assert served_dtypes(replace(case, target=ModelSpec("t", dtype="bfloat16")), {}) == \
        (torch.bfloat16, torch.bfloat16)


def test_served_counters_are_vllms_sums():
    from diag.run.served import ServedCounters
    c = ServedCounters.from_rounds([[3, 1], [0]], 3)     # the module docstring's example
    assert c.counts() == {"num_drafts": 3, "num_draft_tokens": 9, "num_accepted_tokens": 4,
                          "accepted_per_pos": [2, 1, 1]}
    assert c.accept_length == 1 + 4 / 3


def test_a_request_ends_at_every_eos_of_the_generation_config(tmp_path):
    import json
    from types import SimpleNamespace
    from diag.run.target_passes import special_ids
    tok = SimpleNamespace(eos_token_id=1, pad_token_id=2)
    assert special_ids(tok) == ({1}, 2)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 6]}))
    assert special_ids(tok, tmp_path) == ({1, 6}, 2)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert special_ids(tok, tmp_path) == ({1, 7}, 2)


# ---- the engine's accounting in the sampled loop and in coverage ------------------------------

def _decoded(roots, accepted, length):
    from diag.replay.decode_rows import Decoded, Lane
    from diag.replay.replay import Variant
    from diag.trees import tree_shape
    v = Variant("embed+L2+L4", "eagle3", tree_shape("chain-3"), decoding="t1.0")
    return Decoded(Lane(v, 0), 0, roots=list(roots), accepted=list(accepted),
                   expected=[[1.0 if d < a else 0.0 for d in range(3)] for a in accepted], length=length), v


def test_the_sampled_loop_counts_the_round_max_tokens_cuts_by_the_engines_rule():
    """Prompt 5, max_tokens 6 (T 11), a chain of 3: the loop ran rounds rooted at 4 (a = 3: emits
    t_6..t_9) and 8 (a = 2: emits t_10, t_11, t_12; t_11 and t_12 lie past max_tokens and are cut).
    vLLM's scheduler counts both rounds and both accepted drafts of the cut one: num_drafts 2,
    num_accepted 5, accept length 3.5; the old window kept root 4 only (8 > 11 - 2 - 3): 4.0."""
    from diag.replay.sampled_summary import summarize_sampled
    o, v = _decoded([4, 8], [3, 2], 11)
    assert engine_rounds(5, 11, {4: 3, 8: 2}) == [3, 2]                 # the scheduler's model above
    assert o.rounds_counted(5, 3, VLLM) == [0, 1] and o.rounds_counted(5, 3, WINDOW) == [0]
    assert o.rounds_in_window(5, 3) == [0]
    kw = dict(window_steps=3, buckets=(0, 4096), seed=0, n_boot=50)
    to_end = summarize_sampled(v, [o], ["p0"], [5], accounting=VLLM, **kw)
    assert (to_end.trajectory.rounds, sum(to_end.per_prompt[0].accepted)) == (2, 5)
    assert to_end.accept_length == pytest.approx(3.5) and to_end.expected_accept_length == pytest.approx(3.5)
    window = summarize_sampled(v, [o], ["p0"], [5], accounting=WINDOW, **kw)
    assert (window.trajectory.rounds, window.accept_length) == (1, pytest.approx(4.0))
    assert summarize_sampled(v, [o], ["p0"], [5], **kw).accept_length == window.accept_length   # default


def test_the_sampled_run_and_coverage_use_the_served_engines_accounting():
    """diag.run.sampled and the coverage section read the served release's rule, as replay does."""
    import inspect
    from diag.diagnoses import coverage
    from diag.run import sampled
    for mod in (sampled, coverage):
        assert "accounting_for(round_accounting(" in inspect.getsource(mod), mod.__name__


def test_coverage_scores_the_last_rounds_on_the_lookahead():
    """A perfect drafter with every token covered accepts S at every root; P 5, end 11 with a
    lookahead of 3 (ids 14): to-end visits roots 4 and 8 (a = 3 each), the window only 4."""
    from types import SimpleNamespace
    from diag.diagnoses.coverage import perfect_rounds
    seq = Sequence("p", "c", 5, torch.arange(14), end=11)
    tp = SimpleNamespace(sequences=[seq], argmax=[torch.arange(1, 15)])
    covered = torch.ones(20, dtype=torch.bool)
    assert perfect_rounds(tp, 0, covered, 3, 3, VLLM) == [3, 3]
    assert perfect_rounds(tp, 0, covered, 3, 3, WINDOW) == [3]
    covered[12] = False          # t_12 = argmax[11], the third guess of the root-8 round (t_10..t_12): a = 2
    assert perfect_rounds(tp, 0, covered, 3, 3, VLLM) == [3, 2]
