import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import signals  # noqa: E402  (test support beside this file)

# transformers attaches its StreamHandler to whatever sys.stderr is when its logger is first used.
# When that happened inside a capsys test, the handler kept that test's stream, closed after it, and
# every later transformers warning printed "--- Logging error --- Traceback ..." into another test's
# stderr (the bad-input catalogue then saw a traceback). Configured here, it holds pytest's
# session-wide capture stream instead, which stays open.
from transformers.utils import logging as _hf_logging  # noqa: E402

_hf_logging.get_logger("transformers")


@pytest.fixture(scope="session")
def kimi_small(tmp_path_factory):
    """A 2-layer Kimi-shaped INT4 target and its drafter at bench/cpu.py's SMALL widths (seed 5),
    written once a session; tests load it on the device and in the dtype they need."""
    from diag.bench.cpu import SMALL, SMALL_DRAFTER
    from diag.zoo.kimi_shaped import kimi_shaped

    return kimi_shaped(tmp_path_factory.mktemp("kimi") / "k", layers=2, seed=5, widths=SMALL,
                       drafter_widths=SMALL_DRAFTER)


@pytest.fixture(scope="session")
def kimi_cpu(kimi_small):
    """kimi_small loaded on the CPU in float32: (paths, target, drafter). Shared by every module
    that asks: a test that changes either must restore it."""
    import torch

    from diag.drafter.checkpoint import load_drafter
    from diag.int4.load import load_packed_target

    return kimi_small, load_packed_target(kimi_small.target, dtype=torch.float32), load_drafter(kimi_small.drafter)[0]


@pytest.fixture
def target_loads(tmp_path, monkeypatch):
    """The path of each target a run loads (run/target_passes' load_target), in a cache of the
    test's own ($DIAG_CACHE_DIR under tmp_path), so the test's first run loads."""
    from diag.run import target_passes

    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    loads, real = [], target_passes.load_target
    monkeypatch.setattr(target_passes, "load_target", lambda path, **kw: (loads.append(str(path)), real(path, **kw))[1])
    return loads


@pytest.fixture
def sigint_delivered():
    """SIGINT raises KeyboardInterrupt in the test, however the suite was started (signals.py)."""
    with signals.delivered():
        yield


# ---- vLLM servers started ahead of the tests that name them (tests/vllm_prestart.py) ----
def _vllm_cells(item):
    """The servers a test names; none for a test skipped outright (skipif(True, ...))."""
    if any(m.args and m.args[0] is True for m in item.iter_markers("skipif")):
        return []
    return [m.args[0] for m in item.iter_markers("vllm") if m.args]


def pytest_collection_modifyitems(config, items):
    """The tests that need a vLLM server run last (vllm_prestart.last), so their servers start
    beside the rest of the suite."""
    named = lambda item: item.get_closest_marker("vllm") is not None  # noqa: E731
    if any(named(item) for item in items):      # the harness imported only when a test needs it
        import vllm_prestart
        items[:] = vllm_prestart.last(items, named)


def pytest_collection_finish(session):
    """Work a test module can start early (a module-level start_in_background, e.g. test_installed's
    venv) and the vLLM servers the selected tests name start now, in background threads."""
    if session.config.option.collectonly:
        return
    for mod in dict.fromkeys(getattr(item, "module", None) for item in session.items):
        if hasattr(mod, "start_in_background"):
            mod.start_in_background(session)
    cells = [c for item in session.items for c in _vllm_cells(item)]
    if cells:
        import vllm_cells
        import vllm_prestart
        names = [n for c in cells for n in c.zoo_names]
        vllm_prestart.prestart([(c.label, c.server_args) for c in cells],
                               build=lambda: vllm_cells.built_aside(names).__getitem__)


def pytest_runtest_teardown(item):
    for c in _vllm_cells(item):
        import vllm_prestart
        vllm_prestart.release(c.label)


def pytest_terminal_summary(terminalreporter):
    if "vllm_prestart" in sys.modules:
        for line in sys.modules["vllm_prestart"].summary():
            terminalreporter.write_line(line)


def pytest_sessionfinish(session):
    if "vllm_server" in sys.modules:
        sys.modules["vllm_server"].shutdown()
