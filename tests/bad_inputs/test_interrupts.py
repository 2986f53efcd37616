"""SIGINT at any point of `diag run` leaves the previous report intact or the complete new one,
never a half report, and no corrupt or half-written cache entry (issue 16). The interrupt is a
real SIGINT sent to the process at a chosen step: in-process by wrapping the step function,
and from outside a `diag run` subprocess paused at a step."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import signals
from diag.cli.main import main

pytestmark = pytest.mark.usefixtures("sigint_delivered")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def previous(pair, tmp_path_factory):
    """A finished report of the tiny pair (the state an interrupted run must not damage)."""
    root = tmp_path_factory.mktemp("prev")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIAG_CACHE_DIR", str(root / "cache"))
        assert main(_argv(pair, root / "report") + ["--no-cache"]) == 0
    return root / "report"


def _argv(pair, out) -> list[str]:
    return ["run", "--target", str(pair["target"]), "--drafter", str(pair["drafter"]), "--prompts",
            str(pair["prompts"]), "--out", str(out), "--max-new-tokens", "8", "--layout", "embed+L2+L3",
            "--tree", "chain-2", "--quiet"]


def _sigint(fn):
    """fn, preceded by a real SIGINT to this process (Python raises KeyboardInterrupt there)."""
    def wrapped(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return fn(*a, **k)
    return wrapped


def _check_cache(cache: Path) -> int:
    """Every entry under passes/ passes its integrity check; no temporary file is left.
    Returns the number of entries."""
    from safetensors import safe_open
    from diag.target.pass_cache import content_digest
    folder = cache / "passes"
    entries = sorted(folder.glob("*")) if folder.is_dir() else []
    assert not [e for e in entries if ".tmp" in e.name], entries
    for e in entries:
        with safe_open(str(e), framework="pt") as fh:
            meta = fh.metadata()
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        assert content_digest(tensors, meta["diag"]) == meta["sha256"], e
    return len(entries)


def _check_report(out: Path, before: dict[str, bytes]) -> str:
    """'previous' when out is byte for byte the previous report, 'new' when it is a complete
    new one (every file its manifest lists, report.json readable); nothing else passes."""
    assert not list(out.parent.glob(f".{out.name}.partial-*")) and not list(out.parent.glob(f".{out.name}.old-*"))
    now = _files(out)
    if now == before:
        return "previous"
    manifest = json.loads(now[".diag-report.json"])
    assert set(manifest["files"]) | {".diag-report.json"} == set(now)
    json.loads(now["report.json"])
    return "new"


def _wrap(target: str):
    """Interrupt just before `module.function` runs."""
    def patch(mp):
        module, _, name = target.rpartition(".")
        mod = __import__(module, fromlist=[name])
        mp.setattr(mod, name, _sigint(getattr(mod, name)))
    return patch


def _inside_cache_write(mp):
    """Interrupt once the entry's temporary file is written, before it is renamed into place."""
    real = os.replace

    def replace(a, b):
        if Path(b).parent.name == "passes":
            os.kill(os.getpid(), signal.SIGINT)
        return real(a, b)
    mp.setattr(os, "replace", replace)


# (step to interrupt, how, the report expected after it, cache entries expected)
POINTS = [
    ("prepare", _wrap("diag.run.pipeline.prepare"), "previous", 0),
    ("drafter load", _wrap("diag.run.pipeline.load_drafter"), "previous", 0),
    ("content digests", _wrap("diag.checkpoint.identity.file_digest"), "previous", 0),
    ("before the cache write", _wrap("diag.run.target_passes.save_pass"), "previous", 0),
    ("inside the cache write", _inside_cache_write, "previous", 0),
    ("drafter replay", _wrap("diag.run.pipeline.evaluate"), "previous", 1),
    ("verdicts", _wrap("diag.run.pipeline.verdicts"), "previous", 1),
    ("report files written, before the swap", _wrap("diag.report.writer.swap_into_place"), "previous", 1),
    ("inside the swap (exchange)", _wrap("diag.report.outdir._exchange"), "new", 1),
    ("after the swap", _wrap("diag.report.terminal.summary_table"), "new", 1),
]


@pytest.mark.parametrize("step,patch,report,entries", POINTS, ids=[p[0] for p in POINTS])
def test_sigint_at_a_step(step, patch, report, entries, pair, previous, tmp_path, monkeypatch, capsys):
    out, cache = tmp_path / "report", tmp_path / "cache"
    shutil.copytree(previous, out)
    before = _files(out)
    monkeypatch.setenv("DIAG_CACHE_DIR", str(cache))
    patch(monkeypatch)
    code = main(_argv(pair, out))
    err = capsys.readouterr().err
    assert code == 130 and "interrupted" in err and "Traceback" not in err, err
    assert _check_report(out, before) == report
    assert _check_cache(cache) == entries


def test_sigint_between_the_two_renames_of_the_fallback_swap(pair, previous, tmp_path, monkeypatch, capsys):
    """Where the file system cannot exchange: old -> .old, then new -> out. SIGINT between the
    two is held until the second is done."""
    import diag.report.outdir as outdir
    out = tmp_path / "report"
    shutil.copytree(previous, out)
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(outdir, "_exchange", lambda a, b: False)
    real, calls = os.rename, []

    def rename(a, b):
        real(a, b)
        calls.append(b)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
    monkeypatch.setattr(outdir.os, "rename", rename)
    code = main(_argv(pair, out))
    assert code == 130 and len(calls) == 2
    assert _check_report(out, _files(previous)) == "new"


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import {module} as m
    real = m.{name}
    def paused(*a, **k):
        Path(sys.argv[1]).write_text("paused")
        time.sleep(120)
        return real(*a, **k)
    m.{name} = paused
    from diag.cli.main import main
    sys.exit(main(sys.argv[2:]))
""")


@pytest.mark.parametrize("target,entries", [("diag.run.target_passes.save_pass", 0),
                                            ("diag.report.writer.swap_into_place", 1)],
                         ids=["target pass", "before the swap"])
def test_sigint_from_outside_a_diag_run_subprocess(target, entries, pair, previous, tmp_path):
    """A real `diag run` process, paused at a step, interrupted from outside with SIGINT."""
    out, cache, marker = tmp_path / "report", tmp_path / "cache", tmp_path / "paused"
    shutil.copytree(previous, out)
    module, _, name = target.rpartition(".")
    env = {**os.environ, "DIAG_CACHE_DIR": str(cache)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(module=module, name=name), str(marker),
                             *_argv(pair, out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=signals.default_in_child)
    try:
        deadline = time.time() + 600
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "the child never reached the step"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert _check_report(out, _files(previous)) == "previous"
    assert _check_cache(cache) == entries
