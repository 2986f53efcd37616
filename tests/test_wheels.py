"""diag.engines.sglang.wheels over diag.engines.wheels (the one home of engine wheels): one cache of
SGLang's released wheels for the flag table generator and the differential tests; pip is
replaced here by a fake that writes or refuses a wheel."""

import subprocess
from pathlib import Path

import pytest

from diag.engines import wheels as engine_wheels
from diag.engines.sglang import wheels


@pytest.fixture
def wheel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_SGLANG_WHEELS", str(tmp_path / "w"))
    return tmp_path / "w"


def _fake_pip(calls, name="sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", rc=0):
    def run(cmd, **kw):
        calls.append(cmd)
        dest = cmd[cmd.index("-d") + 1]
        if rc == 0:
            (Path(dest) / name).write_bytes(b"PK")
        return subprocess.CompletedProcess(cmd, rc, "", "ERROR: No matching distribution found")
    return run


def test_a_wheel_is_fetched_once_for_cpython_311_and_renamed_into_the_cache(wheel_cache, monkeypatch):
    calls = []
    monkeypatch.setattr(engine_wheels.subprocess, "run", _fake_pip(calls))
    got = wheels.wheel("0.5.23")
    assert got == wheel_cache / "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl" and got.read_bytes() == b"PK"
    assert wheels.wheel("0.5.23") == got and len(calls) == 1                    # cached: no second pip
    cmd = calls[0]
    assert "sglang==0.5.23" in cmd and "--no-deps" in cmd and cmd[cmd.index("--abi") + 1] == "cp311"
    assert [p.name for p in wheel_cache.iterdir()] == [got.name]               # no download folder left


def test_a_refused_download_names_the_version_and_what_pip_said(wheel_cache, monkeypatch):
    monkeypatch.setattr(engine_wheels.subprocess, "run", _fake_pip([], rc=1))
    with pytest.raises(wheels.WheelError, match=r"(?s)sglang==0\.5\.99 failed \(exit 1\).*No matching distribution"):
        wheels.wheel("0.5.99")
    assert wheels.cached("0.5.99") is None and list(wheel_cache.iterdir()) == []


def test_the_generator_and_the_tests_share_the_cache(wheel_cache):
    import sglang_wheels
    assert sglang_wheels.cache_root() == wheels.wheel_dir() == wheel_cache


def test_every_engine_caches_its_wheels_in_the_one_home(tmp_path, monkeypatch):
    from diag.engines.vllm import wheels as vllm_wheels
    monkeypatch.delenv("DIAG_SGLANG_WHEELS", raising=False)
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path))
    assert wheels.wheel_dir() == engine_wheels.cache_dir("sglang") == tmp_path / "sglang-wheels"
    assert vllm_wheels.wheel_cache() == engine_wheels.cache_dir("vllm") == tmp_path / "vllm-wheels"
