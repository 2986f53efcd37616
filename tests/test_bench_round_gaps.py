"""bench/round_gaps: the device's idle time in an unsynchronised round, charged to the phase and
call of the launch that ended each gap, and the host's own time during it (the module's worked
example, as a chrome trace); on the CPU the loop's phases without device figures."""

import pytest

from diag.bench.round_gaps import WINDOW_END, gaps
from diag.bench.sampled import bench_prompts
from diag.bench.cpu import SMALL


def _x(cat, name, ts, dur, corr=None, tid=1):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def worked_example() -> dict:
    """One 1,000 us round: verify_forward's linear launches a kernel at 90-95 us that runs
    100-300 us; accept sorts on the host 610-900 us, then launches a kernel (900-905 us) that
    runs 910-990 us. A second stream's copy inside the first kernel changes nothing, nor do the
    ranges' echoes on the GPU's timeline."""
    return {"traceEvents": [
        _x("user_annotation", "ProfilerStep#8", 0, 1000),
        _x("user_annotation", "diag.verify_forward", 0, 600),
        _x("cpu_op", "aten::linear", 10, 90),
        _x("cuda_runtime", "cudaLaunchKernel", 90, 5, corr=1),
        _x("user_annotation", "diag.accept", 600, 400),
        _x("cpu_op", "aten::sort", 610, 290),
        _x("cuda_driver", "cuLaunchKernel", 900, 5, corr=2),
        _x("kernel", "gemm", 100, 200, corr=1, tid=7),
        _x("gpu_memcpy", "Memcpy DtoD", 150, 20, corr=3, tid=8),
        _x("kernel", "accept_walk", 910, 80, corr=2, tid=7),
        _x("gpu_user_annotation", "ProfilerStep#8", 100, 890, tid=7),         # the ranges' echo on the GPU
        _x("gpu_user_annotation", "diag.accept", 910, 80, tid=7),
        {"ph": "M", "name": "process_name", "pid": 1},
    ]}


def test_the_worked_example_charges_each_gap_to_the_launch_that_ended_it():
    g = gaps(worked_example())
    assert g["rounds"] == 1 and g["wall_ms_per_round"] == pytest.approx(1.0)
    assert g["device_busy_ms_per_round"] == pytest.approx(0.28)
    assert g["device_idle_ms_per_round"] == pytest.approx(0.72)
    assert g["idle_ms_per_round_by_phase"] == {"accept": 0.61, "verify_forward": 0.1, WINDOW_END: 0.01}
    assert g["idle_ms_per_round_by_call"] == {"cuLaunchKernel": 0.61, "cudaLaunchKernel": 0.1, WINDOW_END: 0.01}
    own = g["host_ms_during_idle_per_round"]
    # the sort's 290 us all idle; the linear's 90 less its launch's 5 (100-300 is busy: none of it)
    assert own["accept: aten::sort"] == 0.29 and own["verify_forward: aten::linear"] == 0.085
    assert own["verify_forward: cudaLaunchKernel"] == 0.005 and own["accept: cuLaunchKernel"] == 0.005
    # accept's own Python: 600-610 (10 us) and 905-1000 less the kernel's 910-990 busy (15 us)
    assert own["accept: (own Python)"] == pytest.approx(0.025)
    # verify_forward's own Python: 0-10 idle (10 us) and 300-600 idle (300 us)
    assert own["verify_forward: (own Python)"] == pytest.approx(0.31)
    assert sum(own.values()) == pytest.approx(g["device_idle_ms_per_round"])       # every idle us, once
    assert g["device_ms_per_round_by_phase"] == {"verify_forward": 0.2, "accept": 0.08, "(launch not traced)": 0.02}
    assert g["device_kernels_by_phase"] == {"verify_forward": [["gemm", 0.2, 1]], "accept": [["accept_walk", 0.08, 1]],
                                            "(launch not traced)": [["Memcpy DtoD", 0.02, 1]]}
    assert [x["gap_us"] for x in g["largest_gaps"]] == [610.0, 100.0, 10.0]
    assert g["largest_gaps"][0]["kernel"] == "accept_walk" and g["gaps_over_20us_per_round"] == 2


def test_a_trace_without_device_events_keeps_the_phases_and_names_no_device_figure():
    trace = worked_example()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy")]
    g = gaps(trace)
    assert g["phase_host_ms_per_round"] == {"verify_forward": 0.6, "accept": 0.4}
    assert g["device_busy_ms_per_round"] is None and g["largest_gaps"] == []
    with pytest.raises(ValueError, match="no ProfilerStep"):
        gaps({"traceEvents": trace["traceEvents"][1:]})


def test_round_gaps_runs_the_loop_unsynchronised_on_the_cpu(kimi_cpu):
    """The same loop profiled with ranges only: its phases' host time lies within the window's
    wall and the prefill is not among them; a window longer than the loop says so."""
    from diag.bench.round_gaps import round_gaps
    ks, model, drafter = kimi_cpu
    prompts = bench_prompts(4, 10, SMALL["vocab_size"])
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    res = round_gaps(model, drafter, embed, head, [ks.layout, "L1+L2+final"], prompts, "chain-1",
                     max_new_tokens=16, skip=2, rounds=3)
    assert res["rounds"] == 3 and res["rows"] == 8 and res["unprofiled_wall_ms_per_round"] > 0
    assert set(res["phase_host_ms_per_round"]) == {"draft", "verify_forward", "accept", "commit", "retire"}
    assert sum(res["phase_host_ms_per_round"].values()) <= res["wall_ms_per_round"] * 1.02
    assert res["device_busy_ms_per_round"] is None
    with pytest.raises(ValueError, match="fewer than"):
        round_gaps(model, drafter, embed, head, [ks.layout], prompts, "chain-1", max_new_tokens=4, skip=2, rounds=3)
