"""target/verify_graphs.py off the GPU: what it does when it cannot capture (the CUDA side
runs in tests/test_gpu.py on the device)."""

import pytest
import torch

from diag.target.kv_buffer import BufferLayer, stamps
from diag.target.verify_graphs import VerifyGraphs


def _cache(rows: int = 2):
    from transformers.cache_utils import DynamicLayer
    layer = DynamicLayer()
    layer.keys, layer.values, layer.is_initialized = torch.ones(rows, 1, 3, 4), torch.ones(rows, 1, 3, 4), True

    class Cache:
        layers = [BufferLayer.of(layer, 8)]
    return Cache


def test_a_capture_that_fails_turns_the_graphs_off_names_why_and_leaves_the_forward_to_the_caller():
    graphs, cache, calls = VerifyGraphs(), _cache(), []
    inputs = {"ids": torch.zeros(2, 1, dtype=torch.long)}
    got = graphs.run(stamps(cache), inputs, (2, 1, 8), lambda x: calls.append(x) or {"final": torch.zeros(2, 1, 4)})
    assert got is None and graphs.failure and graphs.counts == {"captured": 0, "replayed": 0, "eager": 0, "capture_s": 0.0,
                                                                 "warm_s": 0.0, "record_s": 0.0}
    assert not graphs.usable(torch.nn.Linear(2, 2)) and graphs.graphs == {}


def test_graphs_are_usable_only_on_one_cuda_device_and_forget_the_buffers_they_were_made_on():
    assert not VerifyGraphs().usable(torch.nn.Linear(2, 2))                   # the CPU: never
    cache = _cache()
    before = stamps(cache)
    cache.layers[0].take_rows(torch.tensor([1, 0]), 3)                        # rows retired: new buffers
    assert stamps(cache) != before
    grown = stamps(cache)
    cache.layers[0].reserve(20)                                               # grown past its capacity
    assert stamps(cache) != grown and cache.layers[0].capacity == 40
    same = stamps(cache)
    cache.layers[0].crop_to(2)                                                # a crop keeps the buffers
    assert stamps(cache) == same


def test_a_models_placement_is_looked_up_once_per_graphs_object(monkeypatch):
    """usable() walks a model's parameters once per VerifyGraphs and model (a loop asks ~5 times a
    round); each model is looked up on its own, and a failed capture still turns every model off."""
    graphs, walks = VerifyGraphs(), []
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    real = torch.nn.Module.parameters
    monkeypatch.setattr(torch.nn.Module, "parameters", lambda self, *x, **k: walks.append(self) or real(self, *x, **k))
    assert [graphs.usable(m) for m in (a, a, b, a, b)] == [False] * 5
    assert walks == [a, b]
    graphs.placed[id(a)] = (a, True)                              # as a model on one CUDA device is recorded
    assert graphs.usable(a) and not graphs.usable(b)
    graphs.failure = "RuntimeError: capture"
    assert not graphs.usable(a)


def test_the_verify_graphs_switch(monkeypatch):
    """DIAG_VERIFY_GRAPHS=0 turns the loop's graphs off; unset or 1 leaves them on; anything else
    is an error naming it (tests/bad_inputs: before anything loads)."""
    from diag.target.verify_graphs import graphs_wanted as verify_graphs_wanted
    monkeypatch.delenv("DIAG_VERIFY_GRAPHS", raising=False)
    assert verify_graphs_wanted()
    monkeypatch.setenv("DIAG_VERIFY_GRAPHS", "0")
    assert not verify_graphs_wanted()
    monkeypatch.setenv("DIAG_VERIFY_GRAPHS", "1")
    assert verify_graphs_wanted()
    from diag.errors import DiagError
    monkeypatch.setenv("DIAG_VERIFY_GRAPHS", "no")
    with pytest.raises(DiagError, match="DIAG_VERIFY_GRAPHS"):
        verify_graphs_wanted()



def test_every_call_runs_its_forwards_effects_once(monkeypatch):
    """A bucket's first call runs eagerly and its outputs are the call's (the capture runs
    nothing); later calls replay. So a forward that moves data within its buffers (the decode
    loop's commit) takes effect once a call: here a counter the forward bumps in place reads 1, 2,
    3 after three calls, the first of them the capture's."""
    from graph_standin import stand_in
    stand_in(monkeypatch)
    graphs, counter = VerifyGraphs(), torch.zeros(1)

    def forward(x):
        counter.add_(x["by"])
        return {"seen": counter.clone()}
    seen = [graphs.run((), {"by": torch.ones(1)}, ("bucket",), forward)["seen"].item() for _ in range(3)]
    assert seen == [1.0, 2.0, 3.0] and counter.item() == 3.0
    assert graphs.counts["captured"] == 1 and graphs.counts["replayed"] == 2 and graphs.counts["eager"] == 1
