"""The teacher-forced capture pass through the placement's layer stages, GPipe-style: while
stage s runs microbatch m, stage s - 1 runs microbatch m + 1 (schedule.py has the order).

A stage is a run of consecutive decoder layers on one device; accelerate's placement
(placement.py) puts layers in order, so N GPUs give N stages. Stage 0 also embeds, the last
stage also applies the final norm and the chunked argmax. A microbatch is one token-budget
batch of the existing pass (passes.budget_batches, right padded), so each microbatch computes
exactly what the one-stage pass computes for it: the same tensors through the same modules,
only the order of the (stage, microbatch) steps differs. Worked example: 48 sequences of at
most 1,422 tokens, budget 16384 -> 5 batches of <= 11 rows = 5 microbatches; over 8 stages
the pass takes 5 + 7 = 12 ticks of one stage's share, not 5 * 8 = 40.

Each batch's entry into the layers (the embedding, the attention mask, the rotary
embeddings) is the model's own code: the base model runs until its first decoder layer is
called, and that call's arguments are kept (_prologue). The stages then call the decoder
layers with them, as the model's own loop does.

On CUDA every device gets its own stream, made current for the whole pass; a stage's output
is handed on through an event the next stage's stream waits for, then copied to its device
(PyTorch's cross-device copy also orders both streams). Captured states go to pinned host
memory without blocking the host; the devices are synchronised once at the end. A device
read inside a layer (an MoE router's counts read on the host) still stalls the host, and
with it the issue of later steps: the overlap is then partial. On the CPU the same code runs
with no streams, which is how the tests emulate stages (even_stages on "cpu").

This module knows decoder layers, devices and the schedule; it knows nothing about
sequences, drafters, files or reports.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from diag.layouts import CapturePoint
from diag.target.capture import Captured, chunked_argmax, decoder_parts
from diag.target.schedule import Step, gpipe_ticks


@dataclass(frozen=True)
class Stage:
    layers: range              # decoder layer indices, e.g. range(0, 31)
    device: torch.device


def stages_of(model: nn.Module) -> list[Stage]:
    """Runs of consecutive decoder layers on one device, by where each layer's weights are.
    61 layers placed [0-7 on cuda:0, 8-15 on cuda:1, ...] -> 8 stages; all on the CPU -> 1."""
    _, _, layers, _, _ = decoder_parts(model)
    devices = [_device_of(layer) for layer in _used(model, layers)]
    out: list[Stage] = []
    start = 0
    for i in range(1, len(devices) + 1):
        if i == len(devices) or devices[i] != devices[start]:
            out.append(Stage(range(start, i), devices[start]))
            start = i
    return out


def even_stages(num_layers: int, count: int, device: str | torch.device = "cpu") -> list[Stage]:
    """`count` stages of consecutive layers on one device, the first ones one layer longer
    when they do not divide: 6 layers, 4 stages -> [0, 1] [2, 3] [4] [5]."""
    if not 1 <= count <= num_layers:
        raise ValueError(f"{count} stages for {num_layers} layers: expected 1 <= stages <= layers")
    size, extra = divmod(num_layers, count)
    bounds = [k * size + min(k, extra) for k in range(count + 1)]
    return [Stage(range(bounds[k], bounds[k + 1]), torch.device(device)) for k in range(count)]


@torch.no_grad()
def staged_captures(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
                    points: tuple[CapturePoint, ...], stages: list[Stage], *, vocab_chunk: int = 32768,
                    store: torch.device | str = "cpu", desc: str = "target pass",
                    progress: bool = True) -> list[Captured]:
    """batches: (input_ids, attention_mask) [B, T] each, right padded: one microbatch each.
    Returns one Captured per batch, equal to capture_pass(model, ids, mask, points) on it."""
    ticks = gpipe_ticks(len(stages), len(batches)) if batches else []
    with _Streams(model) as streams:
        run = _Run(model, batches, tuple(points), stages, vocab_chunk, torch.device(store), streams)
        for tick in tqdm(ticks, desc=f"{desc} ({len(stages)} stages)", disable=not progress, leave=False):
            for step in tick:
                run.step(step)
    return [Captured({p.name: run.sinks[m][p.name] for p in points}, run.argmax[m]) for m in range(len(batches))]


class _Run:
    """The state of one staged pass: per microbatch the hidden state handed between stages,
    the layer arguments, what was captured and the argmax."""

    def __init__(self, model, batches, points, stages, vocab_chunk, store, streams: _Streams):
        self.batches, self.stages, self.chunk, self.store, self.streams = batches, stages, vocab_chunk, store, streams
        self.base, self.embed, self.layers, self.norm, self.head = decoder_parts(model)
        self.at_layer = {p.index - 1: p.name for p in points if not p.is_final and p.index > 0}   # L3 -> layers[2]
        self.embed_name = next((p.name for p in points if not p.is_final and p.index == 0), None)
        self.final_name = next((p.name for p in points if p.is_final), None)
        n = len(batches)
        self.hidden: list = [None] * n
        self.kwargs: list = [None] * n
        self.ready: list = [None] * n          # the event after hidden[m] was written
        self.entered: list = [None] * n        # the event after kwargs[m] was written (stage 0)
        self.sinks: list[dict] = [{} for _ in range(n)]
        self.argmax: list = [None] * n

    def step(self, step: Step) -> None:
        stage, m = self.stages[step.stage], step.microbatch
        if step.stage == 0:
            x, self.kwargs[m], embedded = _prologue(self.base, self.layers[0], self.embed, *self.batches[m])
            self.entered[m] = self.streams.record(x.device)
            if self.embed_name is not None:
                self.sinks[m][self.embed_name] = _to_store(embedded, self.store)
        else:
            x = self.hidden[m]
        x = self.streams.fetch(x, self.ready[m], stage.device)
        kw = self.streams.fetch(self.kwargs[m], self.entered[m], stage.device)
        for i in stage.layers:
            out = self.layers[i](x, **kw)
            x = out[0] if isinstance(out, (tuple, list)) else out
            if i in self.at_layer:
                self.sinks[m][self.at_layer[i]] = _to_store(x, self.store)
        if step.stage == len(self.stages) - 1:
            self._finish(m, x)
        else:
            self.hidden[m], self.ready[m] = x, self.streams.record(stage.device)

    def _finish(self, m: int, x: torch.Tensor) -> None:
        final = self.norm(self.streams.fetch(x, self.streams.record(x.device), _device_of(self.norm)))
        if self.final_name is not None:
            self.sinks[m][self.final_name] = _to_store(final, self.store)
        self.argmax[m] = chunked_argmax(final, self.head, self.chunk)
        self.hidden[m] = self.kwargs[m] = None


class _Entered(Exception):
    """Raised by the first decoder layer's pre-hook: the prologue has what it came for."""


def _prologue(base: nn.Module, first: nn.Module, embed: nn.Module, ids: torch.Tensor, mask: torch.Tensor):
    """(hidden [B, T, H] entering layer 0, the keyword arguments the model's loop passes every
    decoder layer (attention mask, rotary embeddings, positions, cache), the embedding's output)."""
    got: dict = {}

    def enter(_mod, args, kwargs):
        kwargs = dict(kwargs)
        got["hidden"] = args[0] if args else kwargs.pop("hidden_states")
        got["kwargs"] = kwargs
        raise _Entered

    def embedded(_mod, _inp, out):
        got["embed"] = (out[0] if isinstance(out, (tuple, list)) else out).detach()

    dev = _device_of(embed)
    handles = [first.register_forward_pre_hook(enter, with_kwargs=True), embed.register_forward_hook(embedded)]
    try:
        base(input_ids=ids.to(dev), attention_mask=mask.to(dev), use_cache=False)
    except _Entered:
        pass
    finally:
        for h in handles:
            h.remove()
    if "hidden" not in got:
        raise TypeError(f"{type(base).__name__}: the forward never called its first decoder layer")
    return got["hidden"], got["kwargs"], got["embed"]


def _to_store(t: torch.Tensor, store: torch.device) -> torch.Tensor:
    """A captured state on `store`: from a GPU to the host through pinned memory, without
    blocking the host (valid once the pass has synchronised)."""
    t = t.detach()
    if t.is_cuda and store.type == "cpu":
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return out.copy_(t, non_blocking=True)
    return t.to(store)


def _device_of(module: nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _used(model: nn.Module, layers: nn.ModuleList) -> nn.ModuleList:
    """The layers the model's loop runs: layers[: num_hidden_layers]."""
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    return layers[:n] if isinstance(n, int) else layers


# ---- CUDA streams and events (no-ops on the CPU) ----------------------------------------------

class _Streams:
    """Per CUDA device the model sits on (its stages, and the embedding, norm and head
    wherever placement put them): a compute stream, current on its device while the pass
    runs, and a copy stream for what leaves the device. A hand-off of microbatch m from
    stage s - 1 to stage s: stage s's stream waits for the event stage s - 1 recorded after m;
    the copy then runs on the source's copy stream (PyTorch copies across devices on the
    source's current stream, after the destination's current stream, and makes the
    destination wait for it), so stage s - 1's compute stream, already busy with m + 1,
    never waits for stage s."""

    def __init__(self, model: nn.Module):
        self.devices = sorted({p.device for p in model.parameters() if p.is_cuda}, key=lambda d: d.index)
        self.compute = {d: torch.cuda.Stream(device=d) for d in self.devices}
        self.copy = {d: torch.cuda.Stream(device=d) for d in self.devices}
        self._stack = ExitStack()

    def __enter__(self) -> "_Streams":
        if self.devices:
            current = torch.cuda.current_device()
            for stream in self.compute.values():
                self._stack.enter_context(torch.cuda.stream(stream))
            torch.cuda.set_device(current)     # making a stream current also makes its device current
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        for dev in self.devices:
            torch.cuda.synchronize(dev)

    def record(self, device: torch.device):
        """An event after the work issued so far on the device (None on the CPU)."""
        if device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    def fetch(self, value, event, device: torch.device):
        """`value` (tensors, also in tuples, lists, dicts) on `device`, once `event` has passed."""
        if device.type == "cuda" and event is not None:
            torch.cuda.current_stream(device).wait_event(event)
        if isinstance(value, torch.Tensor):
            return self._copy(value, device)
        if isinstance(value, (tuple, list)):
            return type(value)(self.fetch(v, None, device) for v in value)
        if isinstance(value, dict):
            return {k: self.fetch(v, None, device) for k, v in value.items()}
        return value

    def _copy(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        if t.device == device or not (t.is_cuda and device.type == "cuda"):
            return t.to(device)
        side = self.copy[t.device]
        with torch.cuda.stream(side):
            out = t.to(device)
        t.record_stream(side)              # t's memory stays its own until the side stream has read it
        return out
