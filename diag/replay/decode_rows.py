"""What the decode loop (replay/decode_loop.py) carries between rounds, and how it hands tensors
between the host and the device: the lanes and each (lane, prompt)'s record (`Lane`, `Decoded`),
the rows still decoding (`Rows`), what the next round starts from before the host has read the
round back (`Ahead`), the round's one read of the device (`ReadBack`), when finished rows leave
the batch (`retiring`), the loop's threads on the CPU (`cpu_threads`), and the copies between
host and device (`to_device`, `to_host`). This module knows rows and tensors; nothing about models,
trees or files.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch

from diag.drafter.incremental import DraftKV
from diag.replay.replay import Variant
from diag.replay.round_accounting import ACCOUNTINGS, RoundAccounting
from diag.target.generate import cut_at_eos

RETIRE_FRACTION = 0.1                # finished rows leave the batch once they are a tenth of it
RETIRE_FRACTION_GRAPHED = 0.5        # ... half of it on fixed shapes, where rounds replay graphs: a retire
                                     # takes the caches' rows (new buffers), so every step is captured again
RETIRE_MIN_TOKENS_GRAPHED = 64       # ... and only when they take this many tree nodes out of every verify
CPU_THREADS = 1                      # torch's intra-op threads while the loop runs on the CPU (`cpu_threads`)


@dataclass(frozen=True)
class Lane:
    variant: Variant
    seed: int


@dataclass
class Decoded:
    """One (lane, prompt): every round's root j, accepted drafts a, exact P(a >= d) [S]; the
    ids decoded; `length` the sequence length T a replay of them would have (prompt +
    max_new_tokens, or up to and including the first end-of-sequence token)."""
    lane: Lane
    prompt: int
    roots: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    expected: list[list[float]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    length: int = 0

    def rounds_in_window(self, prompt_len: int, window_steps: int) -> list[int]:
        """Indices of the rounds a replay scores: prompt_len - 1 <= j <= T - 2 - window_steps."""
        return self.rounds_counted(prompt_len, window_steps, ACCOUNTINGS["window"])

    def rounds_counted(self, prompt_len: int, window_steps: int, accounting: RoundAccounting) -> list[int]:
        """Indices of the rounds the engine's accounting counts: roots in accounting.roots(prompt_len,
        T, window_steps). Roots [4, 8], prompt 5, T 11, 3 steps: to-end -> [0, 1]; window -> [0]."""
        counted = accounting.roots(prompt_len, self.length, window_steps)
        return [i for i, j in enumerate(self.roots) if j in counted]


@dataclass
class Rows:
    """Loop state of the B active rows. seq [B, cap] committed ids (CPU), n [B] how many (the
    last is the root token, not yet seen by the target), r_root [B, H] the drafter's step-1
    output at the root pair, dkv its cache, lane_of [B], active [B] indices into `out`, coin_row
    [B] each row's (seed, prompt) part of its coins' hash (sampling.coin_rows), on the device."""
    seq: torch.Tensor
    n: torch.Tensor
    r_root: torch.Tensor | None
    dkv: DraftKV | None
    lane_of: torch.Tensor
    active: torch.Tensor
    out: list[Decoded]
    coin_row: torch.Tensor
    done: torch.Tensor | None = None                  # [B] finished, still in the batch
    drafted: dict | None = None                       # the next round's trees, drafted ahead (`_round`)
    verified: tuple | None = None                     # their verify queued ahead: (Scored, placed) (`_round`)
    on_dev: dict = field(default_factory=dict)        # name -> (the host tensor, its copy on the device)

    @property
    def root(self) -> torch.Tensor:
        return self.n - 2

    def root_on(self, dev) -> torch.Tensor:
        """`root` on the device: copied once for each n (a round's draft, verify, accept and
        commit all read it), or the commit's own sums (`roots_known`), with no copy at all."""
        return self._mirror("root", self.n, lambda: self.root, dev)

    def done_on(self, dev) -> torch.Tensor:
        """`done` on the device, copied once for each done (it changes only at a retire check)."""
        return self._mirror("done", self.done, lambda: self.done, dev)

    def roots_known(self, root: torch.Tensor) -> None:
        """The device's own roots for the current n (the commit's root + count, which the host's
        apply() also adds): the next round reads them instead of copying n - 2 over again."""
        self.on_dev["root"] = (self.n, root)

    def _mirror(self, name: str, host: torch.Tensor, value, dev) -> torch.Tensor:
        got = self.on_dev.get(name)
        if got is None or got[0] is not host or got[1].device != torch.device(dev):
            got = (host, to_device(value(), dev))
            self.on_dev[name] = got
        return got[1]

    def keep(self, rows: torch.Tensor, dev) -> "Rows":
        return Rows(self.seq[rows], self.n[rows], self.r_root[rows.to(dev)], self.dkv.select(rows.to(dev)),
                     self.lane_of[rows], self.active[rows], self.out, self.coin_row[rows.to(dev)], self.done[rows])

    def finish(self, b: int, plen: int, max_new_tokens: int, eos) -> None:
        """Row b is finished: its record's ids, the prompt and its continuation up to
        max_new_tokens or its first end-of-sequence id (`eos`), and their length."""
        o = self.out[int(self.active[b])]
        ids = self.seq[b, :int(self.n[b])].tolist()
        o.ids = ids[:plen] + cut_at_eos(ids[plen:plen + max_new_tokens], set(eos))
        o.length = len(o.ids)


@dataclass(frozen=True)
class Ahead:
    """What the next round starts from, on the device before the host has read the round back
    (`DecodeLoop._commit`): each row's root and root token [B] (a finished row keeps its own),
    and the target cache's new lengths [B] on fixed shapes with a cache of buffers (else None)."""
    root: torch.Tensor
    root_tokens: torch.Tensor
    length: torch.Tensor | None


@dataclass(frozen=True)
class ReadBack:
    """A round's one read of the device (`DecodeLoop._commit`): each row's accepted drafts and
    P(a >= d) [B][S], whether the accept was the rule's (ok), and apply(), the commit's host part."""
    accepted: list[int]
    expected: list[list[float]]
    ok: bool
    apply: Callable[[], None]


@contextmanager
def cpu_threads(dev: torch.device):
    """On the CPU the loop runs with CPU_THREADS intra-op threads, then the caller's count is
    restored. A round is thousands of small ops (rows x D tokens at the pair's widths: a
    [1152, 128] x [128, 384] matmul on the demo pair), too small to gain from a second thread,
    and OpenMP's waiting threads spin: on 2 shared cores demo-sampled's loop took 173 s with 2
    threads against 28 s with 1 (load 3, issue 36's 8.1 min with CI beside it). One thread also
    makes a row's floats independent of the machine's core count."""
    if dev.type != "cpu" or torch.get_num_threads() <= CPU_THREADS:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(CPU_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def to_device(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """A host tensor's copy to `dev` queued behind the device's work: a plain .to() waits for the
    device to finish everything queued (a sync, the host idle meanwhile); from pageable memory the
    bytes are staged at once, so the source may change after."""
    return t.to(dev, non_blocking=True)


def to_host(t: torch.Tensor) -> tuple[torch.Tensor, "Callable[[], None]"]:
    """t's copy to the host queued now: (host tensor, wait), its bytes readable once wait() has
    returned. From CUDA into pinned memory behind an event, so work queued after the copy (the
    next round's draft) runs on while the host waits for the copy alone; a .cpu() would wait for
    all of it. Elsewhere the copy itself."""
    if t.device.type != "cuda":
        return t.cpu(), lambda: None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(t.device))           # t's device's stream: the copy's
    return host, done.synchronize


def resident_on(module, dev: torch.device) -> bool:
    """A table whose weight is a parameter on `dev` (an nn.Embedding or Linear there); a lazy
    table (target/tables.py: no parameter, read on the host) or one elsewhere is not."""
    p = next(module.parameters(), None) if isinstance(module, torch.nn.Module) else None
    return p is not None and p.device == dev


def at_nodes(t: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """t [B, D, H], node [B, N] -> t at those nodes [B, N, H]."""
    return t.gather(1, node.to(t.device)[..., None].expand(*node.shape, t.shape[-1]))


def logits_part(logits, rows: slice, nodes: int):
    """The logits of rows `rows`, their first `nodes` nodes (NodeLogits or a tensor)."""
    if isinstance(logits, torch.Tensor):
        return logits[rows, :nodes]
    return logits.part(rows, nodes)


def retiring(done: torch.Tensor, dense: bool, D: int) -> bool:
    """Whether the finished rows `done` [B] leave the batch now (`DecodeLoop._retire`); dense: the
    loop runs on fixed shapes (`DecodeLoop._dense`), D its trees' nodes a row. On fixed shapes a
    retire costs a capture of every step (~40 ms at the 2-layer Kimi-shaped bench, H100), and a
    row riding along costs its D nodes in every round (~0.09 ms a chain-1 row, ~0.4 ms an
    s3-k8-d16 row there: the head and the vocabulary's work in the accept, the experts its
    tokens reach): so the finished rows must also carry RETIRE_MIN_TOKENS_GRAPHED nodes. A rule on
    counts, never on timings, so a run's batches, and with them its sums, are the same every
    time. Example, chain-1 (D 2) at 96 rows: 57 finished (114 nodes) leave; of 39 later, 24
    finished (48 nodes) ride along to the end; at s3-k8-d16 (D 16) 4 finished rows leave."""
    if dense:
        return (bool(done.float().mean() >= RETIRE_FRACTION_GRAPHED)
                and int(done.sum()) * D >= RETIRE_MIN_TOKENS_GRAPHED)
    return bool(done.float().mean() >= RETIRE_FRACTION)
