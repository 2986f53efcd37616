"""diag installed as users install it (issue 35): a wheel built from this checkout, installed
in a fresh virtual environment outside the checkout, runs its main jobs from another
directory. Before, the wheel carried no cases/ and no prompt sets: `diag run` stopped with
"case file not found ... site-packages/cases/demo.toml", and `--target/--drafter` with
"prompt file not found ... site-packages/cases/prompts/mixed-48.jsonl".

The fresh environment installs torch==2.13.0 first (as the README does: the CPU build) and
then the wheel with its dependencies; pip's cache makes that a copy, not a download, after
the suite's own install. The zoo cache is the suite's, so no checkpoint is trained here.
The wheel and the environment are built in a background thread from the end of collection
(`start_in_background`, called by tests/conftest.py), while the tests before this file run;
the fixture waits for them (a minute and a half of pip, no longer on the suite's clock).
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(argv, cwd, env=None, timeout=900):
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def build(tmp: Path, session_env: dict[str, str]):
    """(the venv's diag script, a working directory outside the checkout, the environment, the wheel).
    `session_env`: os.environ as it was when the build was asked for; the background build runs
    while other tests set DIAG_CACHE_DIR, HOME or HF_* for themselves and must not see them."""
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", ROOT], cwd=tmp, env=session_env)
    wheel = next((tmp / "dist").glob("diag-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp, env=session_env)
    pip = venv / "bin" / "pip"
    _run([pip, "install", "-q", "torch==2.13.0"], cwd=tmp, env=session_env)
    _run([pip, "install", "-q", wheel], cwd=tmp, env=session_env)
    work = tmp / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in session_env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["DIAG_CACHE_DIR"] = session_env.get("DIAG_CACHE_DIR",
                                            str(Path(session_env.get("HOME", str(Path.home()))) / ".cache" / "diag"))
    return venv / "bin" / "diag", work, env, wheel


class _Background:
    """build() in a thread, into `tmp` (pytest's own temporary directory, kept as its tmp_path
    folders are: removing a 3 GB venv took 56 s of the suite's clock under load)."""

    def __init__(self, tmp: Path):
        self.tmp, self.env = tmp, dict(os.environ)          # read now, in the main thread
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, name="installed-build", daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.result = build(self.tmp, self.env)
        except BaseException as e:                 # the fixture re-raises it in the test
            self.error = e

    def get(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result


_BACKGROUND: _Background | None = None


def start_in_background(session) -> None:
    """Start the build now (tests/conftest.py calls this once collection has selected a test here)."""
    global _BACKGROUND
    if _BACKGROUND is None:
        factory = getattr(session.config, "_tmp_path_factory", None)    # pytest's tmp_path_factory
        tmp = factory.mktemp("installed") if factory is not None else Path(tempfile.mkdtemp(prefix="diag-installed-"))
        _BACKGROUND = _Background(tmp)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the venv's diag script, a working directory outside the checkout, the environment, the wheel)."""
    if _BACKGROUND is not None:
        return _BACKGROUND.get()
    return build(tmp_path_factory.mktemp("installed"), dict(os.environ))


def test_the_wheel_carries_what_the_commands_read(installed):
    names = set(zipfile.ZipFile(installed[3]).namelist())
    for rel in ("diag/cases/demo.toml", "diag/cases/demo-sampled.toml", "diag/cases/prompts/mixed-48.jsonl",
                "diag/schema/report.schema.json"):
        assert rel in names, f"{rel} is not in {installed[3].name}"


def test_the_demo_runs_from_another_directory(installed):
    diag, work, env, _ = installed
    _run([diag, "run", "--out", work / "demo", "--quiet", "--limit", "8"], cwd=work, env=env)
    rep = json.loads((work / "demo" / "report.json").read_text())
    assert rep["case"]["name"] == "demo"
    assert "site-packages/diag/cases/demo.toml" in rep["case"]["source"]
    assert not str(ROOT) in rep["case"]["source"]


def test_a_target_drafter_run_reads_the_shipped_prompts(installed):
    diag, work, env, _ = installed
    _run([diag, "run", "--target", "zoo:llama-tiny", "--drafter", "zoo:llama-tiny-eagle3-embed-vllm-ids",
          "--layout", "embed+L2+L4", "--tree", "chain-3", "--limit", "4", "--max-new-tokens", "16",
          "--out", work / "flags", "--quiet"], cwd=work, env=env)
    rep = json.loads((work / "flags" / "report.json").read_text())
    assert "site-packages/diag/cases/prompts/mixed-48.jsonl" in json.dumps(rep["prompts"])
