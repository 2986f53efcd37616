"""The ranks of one distributed run talking to each other: a TCPStore for control (who joined,
who is alive, who failed and why, small payloads every rank needs) and a gloo process group
for the large ones (a shard's target passes, sent to rank 0 once rank 0 asks for them).

No wait here is unbounded. Every wait polls the store and gives up, with a DiagError naming
the rank, when a rank posted a failure (its message), when a local child process exited
(`diag run --nproc`: rank 0 holds the children), or when a rank's heartbeat (a counter its
background thread bumps every second) has not moved for `stale_s` seconds (torchrun, other
nodes). A transfer starts only after both ends are ready, so the process group's own timeout
bounds the transfer alone, never a slow rank's pass.

Worked example: 2 ranks, rank 1 killed during its target pass -> rank 0, waiting for
"ready/1/1", sees the child's exit code -9 (or, under torchrun, rank 1's heartbeat frozen for
stale_s) and raises "rank 1 of 2 stopped before it sent its results", found "exit code -9".

Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the store is the agent's, at
MASTER_ADDR:MASTER_PORT, used under this restart's prefix as torch's env:// rendezvous does.
This module knows processes, stores and sockets; nothing about cases, passes or reports.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from diag.errors import DiagError

POLL_S = 0.2
BEAT_S = 1.0
TRANSFER_TIMEOUT_S = 3600          # one shard's passes over the network, once both ends are ready
CHUNK = 1 << 30                    # bytes per gloo message: a [N] uint8 tensor of at most 1 GiB


class PeerFailed(DiagError):
    """Another rank posted a failure: its message is the news, this rank only stops."""


def _connect(host: str, port: int, rank: int, size: int, timeout_s: float, agent_store: bool):
    """(the shared store under diag's prefix, the TCPStore itself): rank 0 hosts it (--nproc; port 0
    picks a free one), or torchrun's agent does."""
    master = rank == 0 and not agent_store
    base = dist.TCPStore(host, port, None, master, timedelta(seconds=timeout_s),
                         wait_for_workers=False)
    store = base
    if agent_store:
        store = dist.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)
    return dist.PrefixStore("diag", store), base


class Group:
    """This rank's view of the run; `children`: rank -> multiprocessing.Process (rank 0 of --nproc)."""

    def __init__(self, rank: int, size: int, host: str, port: int, *, stale_s: float, agent_store: bool = False,
                 children: dict | None = None):
        self.rank, self.size, self.stale_s = rank, size, stale_s
        self.children = children if children is not None else {}   # filled after the children start
        self.store, base = _connect(host, port, rank, size, stale_s, agent_store)
        self.host, self.port = host, base.port       # the port rank 0 bound when asked for port 0
        self._beat_store = _connect(host, self.port, 1, size, stale_s, agent_store)[0] if size > 1 else None
        self._stop = threading.Event()
        self._seen: dict[int, tuple[int, float]] = {}
        self._calls, self._sent, self._received = 0, 0, {}
        if self._beat_store is not None:
            threading.Thread(target=self._beat, daemon=True, name=f"diag-heartbeat-{rank}").start()

    # ---- liveness -------------------------------------------------------------------------
    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self._beat_store.add(f"alive/{self.rank}", 1)
            except Exception:         # the store is gone: the waits say so
                return
            self._stop.wait(BEAT_S)

    def stop_heartbeat(self) -> None:
        self._stop.set()

    def fail(self, message: str) -> None:
        """Tell the other ranks why this one stops (best effort: the store may be gone)."""
        try:
            self.store.set(f"failed/{self.rank}", message)
            self.store.add("failures", 1)
        except Exception:
            pass

    def _check_others(self, waiting_for: str) -> None:
        if self.store.add("failures", 0):
            for r in range(self.size):
                if r != self.rank and self.store.check([f"failed/{r}"]):
                    raise PeerFailed(f"rank {r} of {self.size} failed; this rank ({self.rank}) stops too",
                                    field=waiting_for, found=self.store.get(f"failed/{r}").decode())
        for r, proc in self.children.items():
            if proc.exitcode is not None and proc.exitcode != 0:
                raise DiagError(f"rank {r} of {self.size} stopped before {waiting_for}", field="diag run --nproc",
                                found=f"exit code {proc.exitcode} (pid {proc.pid})")
        now = time.monotonic()
        for r in range(self.size):
            if r == self.rank:
                continue
            count = self.store.add(f"alive/{r}", 0)
            last = self._seen.get(r)
            if last is None or last[0] != count:
                self._seen[r] = (count, now)
            elif now - last[1] > self.stale_s:
                raise DiagError(f"rank {r} of {self.size} stopped answering before {waiting_for}",
                                found=f"no heartbeat for {self.stale_s:g} s",
                                hint="a rank that died or hangs; raise --rank-timeout if its node is merely busy")

    def wait(self, keys: list[str], waiting_for: str) -> None:
        """Until every key exists; a failed, exited or silent rank ends the wait with a DiagError."""
        while not self.store.check(keys):
            self._check_others(waiting_for)
            time.sleep(POLL_S)

    # ---- exchange -------------------------------------------------------------------------
    def all_objects(self, obj, what: str = "it shared its results") -> list:
        """Every rank's obj, in rank order, on every rank (small objects: they go through the store).
        `what` names the step in the message when a rank stops first."""
        self._calls += 1
        tag = f"all/{self._calls}"
        self.store.set(f"{tag}/{self.rank}", pickle.dumps(obj))
        keys = [f"{tag}/{r}" for r in range(self.size)]
        self.wait(keys, what)
        return [pickle.loads(self.store.get(k)) for k in keys]

    def join(self, what: str, value: str) -> None:
        """Every rank runs the same thing (`value`, e.g. the case's hash, its prompts' digest and
        the world size, must agree with rank 0's), then the gloo group for the large payloads
        is formed (every rank is known alive by then, so forming it cannot hang on a dead one)."""
        seen = self.all_objects(value, "it joined the run (the case read, the prompts tokenized)")
        for r, v in enumerate(seen):
            if v != seen[0]:
                raise DiagError(f"rank {r} runs another {what} than rank 0", field="the ranks' commands",
                                expected=seen[0], found=v,
                                hint="every node must run the same case, prompt set and world size")
        dist.init_process_group("gloo", store=dist.PrefixStore("pg", self.store), rank=self.rank,
                                world_size=self.size, timeout=timedelta(seconds=TRANSFER_TIMEOUT_S))

    def send_to_root(self, obj) -> None:
        """Rank > 0: announce, wait for rank 0 to ask, then send torch.save(obj) in chunks. The
        n-th send of a rank meets rank 0's n-th receive from it (keys ready/n/r, go/n/r)."""
        self._sent += 1
        tag = f"{self._sent}/{self.rank}"
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)
        self.store.set(f"ready/{tag}", str(data.numel()))
        self.wait([f"go/{tag}"], "it asked for this rank's results")
        for i in range(0, data.numel(), CHUNK):
            dist.send(data[i:i + CHUNK], dst=0)

    def receive(self, r: int):
        """Rank 0: rank r's next object, once it is ready."""
        self._received[r] = self._received.get(r, 0) + 1
        tag = f"{self._received[r]}/{r}"
        self.wait([f"ready/{tag}"], "it sent its results")
        n = int(self.store.get(f"ready/{tag}"))
        self.store.set(f"go/{tag}", "1")
        data = torch.empty(n, dtype=torch.uint8)
        try:
            for i in range(0, n, CHUNK):
                dist.recv(data[i:i + CHUNK], src=r)
        except RuntimeError as err:
            raise DiagError(f"rank {r} of {self.size} stopped while sending its results", found=str(err)) from err
        return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)

    def close(self) -> None:
        self.stop_heartbeat()
        if dist.is_initialized():
            dist.destroy_process_group()
