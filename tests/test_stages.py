"""The GPipe schedule on its own; the staged teacher-forced pass against the one-stage pass,
and the generation in microbatches through the stages against its parts in turn, on real zoo
targets (llama-tiny, deepseek-tiny, its INT4 twin) with stages emulated on the CPU: bit for bit."""

import threading

import pytest
import torch

from diag.layouts import CapturePoint
from diag.target.generate import greedy_continuations
from diag.target.load import load_target
from diag.target.passes import Sequence, budget_batches, capture_microbatches, run_capture
from diag.target.stage_gates import run_in_stages, split_rows
from diag.target.schedule import Step, bubble_fraction, gpipe_order, gpipe_ticks, pipelined_seconds
from diag.target.stages import Stage, even_stages, stages_of
from diag.zoo import zoo_path


# ---- the schedule --------------------------------------------------------------------------

def test_ticks_of_three_stages_and_four_microbatches():
    ticks = [[(s.stage, s.microbatch) for s in tick] for tick in gpipe_ticks(3, 4)]
    assert ticks == [[(0, 0)], [(0, 1), (1, 0)], [(0, 2), (1, 1), (2, 0)], [(0, 3), (1, 2), (2, 1)],
                     [(1, 3), (2, 2)], [(2, 3)]]


@pytest.mark.parametrize("stages, microbatches", [(1, 1), (1, 5), (2, 1), (3, 2), (4, 3), (8, 5), (5, 9)])
def test_every_step_once_after_what_it_needs(stages, microbatches):
    order = gpipe_order(stages, microbatches)
    assert sorted((s.stage, s.microbatch) for s in order) == [(s, m) for s in range(stages)
                                                                for m in range(microbatches)]
    at = {step: i for i, step in enumerate(order)}
    for step, i in at.items():
        if step.stage > 0:                                 # the microbatch left the stage before
            assert at[Step(step.stage - 1, step.microbatch)] < i
        if step.microbatch > 0:                            # the stage took the microbatch before
            assert at[Step(step.stage, step.microbatch - 1)] < i
    ticks = gpipe_ticks(stages, microbatches)
    assert len(ticks) == microbatches + stages - 1
    assert all(len({s.stage for s in tick}) == len(tick) for tick in ticks)   # a stage works once a tick
    busy = stages * microbatches / (stages * len(ticks))
    assert bubble_fraction(stages, microbatches) == pytest.approx(1 - busy)


def test_bubble_fraction_and_pipelined_seconds():
    assert bubble_fraction(1, 7) == 0.0
    assert bubble_fraction(3, 4) == pytest.approx(2 / 6)
    assert bubble_fraction(8, 5) == pytest.approx(7 / 12)
    assert pipelined_seconds(100.0, 8, 5) == pytest.approx(30.0)
    assert pipelined_seconds(100.0, 1, 5) == pytest.approx(100.0)
    assert pipelined_seconds(100.0, 8, 1) == pytest.approx(100.0)        # one microbatch: no overlap
    with pytest.raises(ValueError, match="microbatch"):
        gpipe_ticks(2, 0)
    with pytest.raises(ValueError, match="stage"):
        bubble_fraction(0, 3)


def test_even_stages():
    assert [list(s.layers) for s in even_stages(6, 4)] == [[0, 1], [2, 3], [4], [5]]
    assert [list(s.layers) for s in even_stages(4, 1)] == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="5 stages for 4 layers"):
        even_stages(4, 5)


# ---- the staged pass on real targets ---------------------------------------------------------

LENGTHS = [9, 23, 14, 17, 5, 20]
BUDGETS = {1: 138, 2: 69, 3: 46}           # token budget -> that many token-budget batches of LENGTHS


@pytest.fixture(scope="module", params=["llama-tiny", "deepseek-tiny", "deepseek-tiny-int4"])
def zoo_target(request):
    return request.param, zoo_path(request.param)


def _sequences(vocab: int) -> list[Sequence]:
    gen = torch.Generator().manual_seed(7)
    return [Sequence(f"p{i}", "c", max(1, n // 2), torch.randint(3, vocab, (n,), generator=gen))
            for i, n in enumerate(LENGTHS)]


def test_budgets_give_one_two_three_microbatches():
    seqs = _sequences(100)
    assert {m: capture_microbatches(seqs, b) for m, b in BUDGETS.items()} == {1: 1, 2: 2, 3: 3}
    assert budget_batches(LENGTHS, 69) == [[1, 5, 3], [2, 0, 4]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_pass_equals_the_one_stage_pass_bit_for_bit(zoo_target, dtype):
    name, path = zoo_target
    model, info = load_target(path, dtype=dtype)
    n = info.num_layers
    assert [s.layers for s in stages_of(model)] == [range(n)]            # all on the CPU: one stage
    points = tuple(CapturePoint(p) for p in ("embed", "L1", f"L{n // 2}", f"L{n}", "final"))
    seqs = _sequences(info.vocab_size)
    for microbatches, budget in BUDGETS.items():
        ref = run_capture(model, seqs, points, regime="r", token_budget=budget, progress=False)
        for count in range(2, min(4, n) + 1):
            got = run_capture(model, seqs, points, regime="r", token_budget=budget, progress=False,
                              stages=even_stages(n, count))
            where = f"{name} {dtype} {count} stages {microbatches} microbatches"
            for p in points:
                for i, (a, b) in enumerate(zip(ref.states[p.name], got.states[p.name])):
                    assert a.dtype == b.dtype == dtype and torch.equal(a, b), f"{where}: {p} of sequence {i}"
            assert all(torch.equal(a, b) for a, b in zip(ref.argmax, got.argmax)), f"{where}: argmax"
            logits = [model.lm_head(s) for s in got.states["final"]]
            assert all(torch.equal(model.lm_head(a), b) for a, b in zip(ref.states["final"], logits)), where


def test_staged_pass_runs_the_steps_in_pipeline_order():
    """2 stages over 6 layers, 3 microbatches (T 23, 17, 9): layer calls come tick by tick,
    stage 0 on microbatch m + 1 before stage 1 on microbatch m."""
    model, info = load_target(zoo_path("llama-tiny"), dtype=torch.float32)
    calls = []
    hooks = [layer.register_forward_hook(lambda _m, args, _out, i=i: calls.append((i, args[0].shape[1])))
             for i, layer in enumerate(model.model.layers)]
    try:
        run_capture(model, _sequences(info.vocab_size), (CapturePoint("L2"),), regime="r", token_budget=46,
                    progress=False, stages=even_stages(6, 2))
    finally:
        for h in hooks:
            h.remove()
    widths = [23, 17, 9]
    expected = [(i, widths[step.microbatch]) for step in gpipe_order(2, 3)
                for i in range(3 * step.stage, 3 * step.stage + 3)]
    assert calls == expected


def test_stages_follow_where_the_layers_are():
    model, _ = load_target(zoo_path("llama-tiny"), dtype=torch.float32)
    for layer in model.model.layers[4:]:
        layer.to("meta")
    assert stages_of(model) == [Stage(range(0, 4), torch.device("cpu")), Stage(range(4, 6), torch.device("meta"))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_pass_on_cuda_equals_the_one_stage_pass(zoo_target, dtype):
    """One GPU: 2-3 stages emulated on cuda:0 (its stream and events, no copies). Two GPUs: the
    layers split over cuda:0 and cuda:1 by a device map, so run_capture pipelines on its own,
    with a copy between devices at each hand-off. Both bit for bit against the whole model on
    cuda:0, one batch after another."""
    name, path = zoo_target
    model, info = load_target(path, dtype=dtype, device_map={"": 0})
    n = info.num_layers
    points = tuple(CapturePoint(p) for p in ("embed", "L1", f"L{n // 2 + 1}", "final"))
    seqs = _sequences(info.vocab_size)
    kw = dict(regime="r", token_budget=BUDGETS[3], progress=False)
    ref = run_capture(model, seqs, points, **kw)
    runs = {f"{k} stages on cuda:0": run_capture(model, seqs, points, stages=even_stages(n, k, "cuda:0"), **kw)
            for k in (2, min(3, n))}
    if torch.cuda.device_count() >= 2:
        split = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1,
                 **{f"model.layers.{i}": int(i >= n // 2) for i in range(n)}}
        placed, _ = load_target(path, dtype=dtype, device_map=split)
        assert [s.device.index for s in stages_of(placed)] == [0, 1]
        runs["cuda:0 + cuda:1"] = run_capture(placed, seqs, points, **kw)
    for where, got in runs.items():
        for p in points:
            assert all(torch.equal(a, b) for a, b in zip(ref.states[p.name], got.states[p.name])), f"{name} {where} {p}"
        assert all(torch.equal(a, b) for a, b in zip(ref.argmax, got.argmax)), f"{name} {where}: argmax"


# ---- the greedy generation in microbatches through the stages -------------------------------

def test_split_rows():
    assert split_rows(list(range(5)), 3) == [[0, 1], [2, 3], [4]]
    assert split_rows([7, 8], 4) == [[7], [8]]
    assert split_rows(list(range(48)), 8) == [list(range(k, k + 6)) for k in range(0, 48, 6)]
    assert split_rows([1, 2, 3], 1) == [[1, 2, 3]]


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (5, 12, 8, 3, 10, 7, 6)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_generation_through_stages_equals_the_parts_in_turn(zoo_target, dtype):
    """Microbatches on their own threads through 2 or 3 emulated stages give the tokens the same
    parts give generated one after another, bit for bit; one microbatch is today's generation."""
    name, path = zoo_target
    model, info = load_target(path, dtype=dtype)
    prompts, one = _prompts(info.vocab_size), [Stage(range(info.num_layers), torch.device("cpu"))]
    kw = dict(pad_id=2, eos_ids={1}, batch_size=4, progress=False)      # 7 prompts: batches of 4 and 3
    for microbatches in (1, 2, 3):
        in_turn = greedy_continuations(model, prompts, 10, microbatches=microbatches, stages=one, **kw)
        for count in (2, 3):
            staged = greedy_continuations(model, prompts, 10, microbatches=microbatches,
                                          stages=even_stages(info.num_layers, count), **kw)
            assert staged == in_turn, f"{name} {dtype} {count} stages, {microbatches} microbatches"
    assert greedy_continuations(model, prompts, 10, **kw) == greedy_continuations(model, prompts, 10, stages=one, **kw)


def test_stage_gates_admit_one_microbatch_per_stage():
    """The layers' outputs of each stage come in whole runs of one microbatch: no other
    microbatch enters a stage while one is in it."""
    model, info = load_target(zoo_path("llama-tiny"), dtype=torch.float32)
    stages, events = even_stages(6, 3), []
    hooks = [layer.register_forward_hook(lambda _m, _a, _o, i=i: events.append((i, threading.current_thread().name)))
             for i, layer in enumerate(model.model.layers)]
    try:
        greedy_continuations(model, _prompts(info.vocab_size), 6, pad_id=2, eos_ids=set(), batch_size=7,
                             progress=False, microbatches=3, stages=stages)
    finally:
        for h in hooks:
            h.remove()
    for stage in stages:
        seen = [who for i, who in events if i in stage.layers]
        runs = [seen[k:k + len(stage.layers)] for k in range(0, len(seen), len(stage.layers))]
        assert all(len(set(r)) == 1 for r in runs), f"stage {list(stage.layers)}: microbatches interleaved"
        assert {r[0] for r in runs} == {f"microbatch-{k}" for k in range(3)}
        assert len(runs) == 3 * 6                                    # 3 microbatches x 6 tokens


def test_a_microbatch_that_fails_raises_and_frees_its_stage():
    model, _ = load_target(zoo_path("llama-tiny"), dtype=torch.float32)
    stages = even_stages(6, 2)

    def boom():
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7]]))
        raise RuntimeError("microbatch 1 failed")

    ok = lambda: model(input_ids=torch.tensor([[5, 6]])).logits.shape  # noqa: E731
    with pytest.raises(RuntimeError, match="microbatch 1 failed"):
        run_in_stages(model, stages, [ok, boom, ok])
    assert run_in_stages(model, stages, [ok, ok]) == [torch.Size([1, 2, 2048])] * 2   # no gate left taken


def test_the_case_knob_is_checked():
    from diag.errors import DiagError
    from diag.run.case import check_case, parse_case

    base = {"version": 1, "name": "m", "target": {"path": "zoo:llama-tiny"}, "drafter": {"path": "zoo:x"},
            "prompts": {"file": "p.jsonl"}, "evaluate": {"layouts": ["embed+L2+L4"]}}
    case = check_case(parse_case({**base, "placement": {"gpus": 0, "microbatches": 4}}, "c.toml"))
    assert case.placement.microbatches == 4
    with pytest.raises(DiagError) as err:
        check_case(parse_case({**base, "placement": {"microbatches": 0}}, "c.toml"))
    assert err.value.field == "placement.microbatches" and err.value.file == "c.toml"
    assert "as many as the GPUs" in err.value.expected and err.value.found == 0


@pytest.mark.gpu
def test_generation_through_two_gpus_equals_the_parts_in_turn(zoo_target):
    """Microbatches on their own threads through the layers split over cuda:0 and cuda:1 (or 3
    stages emulated on cuda:0 with one GPU) against the parts generated in turn on cuda:0."""
    name, path = zoo_target
    model, info = load_target(path, dtype=torch.bfloat16, device_map={"": 0})
    n, prompts = info.num_layers, _prompts(info.vocab_size)
    kw = dict(pad_id=2, eos_ids={1}, batch_size=7, progress=False, microbatches=3)
    in_turn = greedy_continuations(model, prompts, 12, stages=[Stage(range(n), torch.device("cuda:0"))], **kw)
    assert greedy_continuations(model, prompts, 12, stages=even_stages(n, 3, "cuda:0"), **kw) == in_turn, name
    if torch.cuda.device_count() >= 2:
        split = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1,
                 **{f"model.layers.{i}": int(i >= n // 2) for i in range(n)}}
        placed, _ = load_target(path, dtype=torch.bfloat16, device_map=split)
        assert greedy_continuations(placed, prompts, 12, **kw) == in_turn, f"{name} over 2 GPUs"


def test_generation_in_parts_keys_the_pass_cache():
    """microbatches > 1 generates in other batches (another rounding in a near-tie): its pass
    is cached under another key; 1 keeps the keys every earlier run wrote."""
    from dataclasses import replace
    from types import SimpleNamespace

    from diag.layouts import layout
    from diag.run.case import parse_case
    from diag.run.target_passes import pass_key
    from diag.trees import tree_shape

    case = parse_case({"version": 1, "name": "m", "target": {"path": "zoo:llama-tiny"}, "drafter": {"path": "zoo:x"},
                       "prompts": {"file": "p.jsonl"}, "evaluate": {"layouts": ["embed+L2+L4"]}}, "c.toml")

    def key(microbatches: int):
        c = replace(case, placement=replace(case.placement, microbatches=microbatches))
        inp = SimpleNamespace(case=c, target_path=zoo_path("llama-tiny"), points=layout("embed+L2+L4").points,
                              shapes=[tree_shape("chain-3")])
        return dict(pass_key(inp, "as-loaded", "tokens", "torch.float32").fields)["placement"]

    assert (key(1), key(3)) == ("cpu", "cpu,microbatches=3")


def test_the_generation_leaves_cudnns_attention_out_on_cuda_only():
    """target.sdpa.attention_without_cudnn (the generation's and the verify's): on a CUDA device cuDNN's attention is off inside
    (flash, memory-efficient and math stay on) and back on after; on the CPU nothing changes."""
    from diag.target.sdpa import attention_without_cudnn
    cuda = torch.backends.cuda
    before = (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
              cuda.math_sdp_enabled())
    with attention_without_cudnn(torch.device("cuda", 0)):
        assert not cuda.cudnn_sdp_enabled()
        assert cuda.flash_sdp_enabled() and cuda.mem_efficient_sdp_enabled() and cuda.math_sdp_enabled()
    assert (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
            cuda.math_sdp_enabled()) == before
    with attention_without_cudnn(torch.device("cpu")):
        assert cuda.cudnn_sdp_enabled() == before[0]
