"""A forward over several CUDA devices replayed as a program: one CUDA graph for each run of one
device's work, and the hand-off copies between devices issued by the host between them (issue 36:
a target over 8 GPUs ran its verify eagerly, 12 ms a layer-round of launches on the H100 where the
same layer replayed from a graph took 1.3 ms; reports/bench/NOTES.md, thirtieth stop).

A graph holds one device's work, and a copy between two devices inside a capture would tie the
capture to the other device's stream. So the forward is recorded with a capture open on every
device it touches (each device's own stream, made current), and every move of a tensor to
another device (`Tensor.to` / `.cuda` / `.copy_` across devices, the way accelerate's hooks and
diag.int4.sharded hand activations on) is a cut: the captures of both devices end there (each a
graph of the program, dropped when it recorded nothing), the copy becomes a step of its own, into
a buffer the program keeps, and both captures open again. Replay runs the steps in order: each
graph on its device's current stream, each copy as PyTorch's cross-device copy, which orders the
two devices' streams. Worked example, a layer on GPU 0 whose experts are split over GPUs 0 and 1:
  record: [GPU 0: attention, router] -> copy x to GPU 1 -> [GPU 1: shard 1] [GPU 0: shard 0]
          -> copy part 1 to GPU 0 -> [GPU 0: sum, rest of the layer]
  replay: graph, copy, graph, graph, copy, graph: 6 host calls where the eager layer issued ~60.
A tensor handed to a device once is not copied again while it is unchanged (its version): the
attention mask every layer of a stage receives crosses once per stage.

`hand_off(t, device, force=True)` cuts even on the same device: bench/expert_split.OneGpuOfN so
issues, on one GPU, the steps one GPU of a split target issues (the other shards' copies in and
partial sums back). Outside a recording `hand_off` is `Tensor.to` (a clone where forced).

The programs' numbers are the eager forward's: the same kernels on the same shapes (a GPU test
replays them against it). This module knows CUDA graphs, streams and devices; nothing about
models, caches or the decode loop (target/verify_graphs.py calls it).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

_RECORDING: list["_Recorder"] = []     # the recording in progress, if any (one at a time)
EMPTY = "The CUDA Graph is empty"      # torch's warning at capture_end for a graph with no node


@dataclass
class Program:
    """Steps in order: ("graph", CUDAGraph) or ("copy", (src, dst)); `keep` holds what the steps
    read and write (the copies' buffers, graphs that recorded nothing but own allocations)."""
    steps: list = field(default_factory=list)
    keep: list = field(default_factory=list)

    def replay(self) -> None:
        for kind, step in self.steps:
            if kind == "graph":
                step.replay()
            else:
                src, dst = step
                dst.copy_(src, non_blocking=True)

    def counts(self) -> dict[str, int]:
        """{"graphs": n, "copies": n}: the host calls a replay issues."""
        graphs = sum(kind == "graph" for kind, _ in self.steps)
        return {"graphs": graphs, "copies": len(self.steps) - graphs}


def _index(dev: torch.device) -> int:
    return torch.device(dev).index if torch.device(dev).index is not None else torch.cuda.current_device()


class _Recorder:
    """The captures open on each device, and the program they add to (module docstring)."""

    def __init__(self, devices: list[int], pools: dict[int, object]):
        self.program, self.pools = Program(), pools
        self.streams = {d: torch.cuda.Stream(device=d) for d in devices}
        self.before = {d: torch.cuda.current_stream(d) for d in devices}
        self.open: dict[int, torch.cuda.CUDAGraph] = {}
        self.handed: dict[tuple, torch.Tensor] = {}

    def start(self) -> None:
        self.device = torch.cuda.current_device()
        for d, s in self.streams.items():
            s.wait_stream(self.before[d])
            torch.cuda.set_stream(s)
        torch.cuda.set_device(self.device)
        for d in self.streams:
            self._open(d)

    def finish(self, quiet: bool = False) -> None:
        """Every open capture ended and the streams restored; the first capture that failed to end
        raised then, unless `quiet` (the forward already failed: its error is the one to tell)."""
        failed = None
        for d in list(self.open):
            try:
                self._close(d)
            except Exception as err:                  # noqa: BLE001 (an invalidated capture: raised below)
                failed = failed or err
        for s in self.before.values():
            torch.cuda.set_stream(s)
        torch.cuda.set_device(self.device)
        if failed is not None and not quiet:
            raise failed

    def _open(self, d: int) -> None:
        if d not in self.streams:                     # a device the forward reaches first now
            self.streams[d] = torch.cuda.Stream(device=d)
            self.before[d] = torch.cuda.current_stream(d)
            self.streams[d].wait_stream(self.before[d])
            with torch.cuda.device(d):
                torch.cuda.set_stream(self.streams[d])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(d):
            graph.capture_begin(pool=self.pools.get(d), capture_error_mode="relaxed")
        self.open[d] = graph

    def _close(self, d: int) -> None:
        graph = self.open.pop(d)
        with warnings.catch_warnings(record=True) as said, torch.cuda.device(d):
            warnings.simplefilter("always")
            graph.capture_end()
        self.pools[d] = graph.pool()
        empty = any(EMPTY in str(w.message) for w in said)
        (self.program.keep if empty else self.program.steps).append(graph if empty else ("graph", graph))

    def hand_off(self, src: torch.Tensor, dev: torch.device, force: bool = False) -> torch.Tensor:
        """src on `dev` at this point of the program: a copy step between the two devices' graphs."""
        d = _index(dev)
        key = (id(src), _version(src), d)
        if not force and key[1] is not None and key in self.handed:
            return self.handed[key]
        with self.cut(_index(src.device), d), torch.cuda.device(d):
            dst = torch.empty_like(src, device=torch.device("cuda", d))   # outside every pool: the program keeps it
            self.program.steps.append(("copy", (src, dst)))
            self.program.keep.extend((src, dst))
        if not force:
            self.handed[key] = dst
        return dst

    @contextmanager
    def cut(self, *devices: int):
        """The captures of `devices` ended (each a graph step) for the block, open again after it:
        what the block adds to the program falls between their graphs."""
        devices = tuple(dict.fromkeys(devices))
        for d in devices:
            if d in self.open:
                self._close(d)
        yield
        for d in devices:
            self._open(d)


def _version(t: torch.Tensor) -> int | None:
    """t's version counter (in-place writes raise it); None for an inference tensor (no counter)."""
    try:
        return t._version
    except RuntimeError:
        return None


class _HandOffs(TorchFunctionMode):
    """Routes every move of a CUDA tensor to another device through the recorder."""

    def __init__(self, recorder: _Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.to, torch.Tensor.cuda) and args and isinstance(args[0], torch.Tensor):
            moved = _moved(self.recorder, func, args, kwargs)
            if moved is not None:
                return moved
        if func is torch.Tensor.copy_ and len(args) >= 2 and _crosses(args[1], args[0].device):
            dst = args[0]
            dst.copy_(self.recorder.hand_off(args[1], dst.device))   # on dst's device, in its graph
            return dst
        return func(*args, **kwargs)


def target_of(func, args, kwargs) -> tuple[torch.device | None, torch.dtype | None]:
    """The device and dtype a `Tensor.to(...)` or `Tensor.cuda(...)` call asks for (None: kept).
    Examples: x.to("cuda:1") -> (cuda:1, None); x.to(torch.half) -> (None, float16);
    x.to(y) -> (y.device, y.dtype); x.cuda() -> (cuda, None)."""
    if func is torch.Tensor.cuda:
        dev = args[1] if len(args) > 1 else kwargs.get("device")
        return torch.device("cuda" if dev is None else (f"cuda:{dev}" if isinstance(dev, int) else dev)), None
    dev, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **{k: v for k, v in kwargs.items() if k != "copy"})
    return dev, dtype


def _crosses(t: torch.Tensor, dev) -> bool:
    """t is a CUDA tensor and `dev` another CUDA device (the index None: the current one)."""
    if not isinstance(t, torch.Tensor) or dev is None:
        return False
    dev = torch.device(dev)
    return t.device.type == "cuda" and dev.type == "cuda" and _index(t.device) != _index(dev)


def _moved(recorder, func, args, kwargs) -> torch.Tensor | None:
    dev, dtype = target_of(func, args, kwargs)
    src = args[0]
    if not _crosses(src, dev):
        return None
    out = recorder.hand_off(src, dev)
    return out if dtype is None or dtype == out.dtype else out.to(dtype)


def hand_off(t: torch.Tensor, device: torch.device | None = None, *, force: bool = False) -> torch.Tensor:
    """t on `device` (default: its own): inside a recording a copy step of the program (a cut even
    on the same device where `force`), outside it `t.to(device)`, a clone where `force`."""
    device = t.device if device is None else torch.device(device)
    if _RECORDING and t.device.type == "cuda" and (force or _crosses(t, device)):
        return _RECORDING[-1].hand_off(t, device, force=force)
    return t.to(device, copy=force)


def cut(device: torch.device | None = None) -> None:
    """Inside a recording, end the capture of `device` (default: the current one) and open another:
    a graph boundary of the program, where a step of another device would be replayed (bench/
    expert_split.OneGpuOfN stands in for another GPU's graph so). Outside a recording, nothing."""
    if _RECORDING:
        with _RECORDING[-1].cut(_index(torch.device("cuda") if device is None else device)):
            pass


def record(forward, inputs: dict[str, torch.Tensor], pools: dict[int, object],
           devices: list[int] | tuple = ()) -> tuple[Program, dict]:
    """forward(inputs) recorded as a Program (module docstring): (program, outputs), the outputs
    the tensors the program's replays rewrite. `devices`: every CUDA device the forward may run
    on (a capture is open on each from the start: work on a device no hand-off reached would
    otherwise run once, uncaptured), the inputs' among them. `pools`: each device's graph memory
    pool, updated (pass the same dict to later recordings replayed in turn with this one). Run
    the forward once eagerly before (its first calls: Triton's compiles, cuBLAS's workspaces)."""
    devices = sorted({*devices, *(_index(t.device) for t in inputs.values() if t.device.type == "cuda")})
    for d in devices:
        torch.cuda.synchronize(d)
    recorder = _Recorder(devices, pools)
    _RECORDING.append(recorder)
    recorder.start()
    try:
        with _HandOffs(recorder):
            out = forward(inputs)
    except BaseException:
        recorder.finish(quiet=True)
        raise
    finally:
        _RECORDING.pop()
    recorder.finish()
    return recorder.program, out
