"""SIGINT as a terminal delivers it, whatever the suite was started from: a shell's background
job (`cmd &`) starts with SIGINT ignored, and its children inherit that, so a test that sends
SIGINT would see nothing happen. Test support; knows nothing about diag."""

import contextlib
import signal


@contextlib.contextmanager
def delivered():
    """SIGINT raises KeyboardInterrupt in this process while inside; restored afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def default_in_child() -> None:
    """Popen preexec_fn: the child starts with SIGINT's default action, so its Python raises
    KeyboardInterrupt on it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
