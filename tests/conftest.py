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


@pytest.fixture
def sigint_delivered():
    """SIGINT raises KeyboardInterrupt in the test, however the suite was started (signals.py)."""
    with signals.delivered():
        yield
