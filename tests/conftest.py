import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import signals  # noqa: E402  (test support beside this file)


@pytest.fixture
def sigint_delivered():
    """SIGINT raises KeyboardInterrupt in the test, however the suite was started (signals.py)."""
    with signals.delivered():
        yield
