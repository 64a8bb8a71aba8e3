"""The replica supervisor's waits: a stop signal is never held back by a blocking call."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(60)

# The race, made deterministic: the main thread blocks SIGUSR1, so the signal lands on another
# thread and the main thread's blocking call is not interrupted (as when a signal comes just
# before the call enters the kernel). Only the wakeup pipe can end the wait early.
RACE = """
import os, signal, subprocess, sys, threading, time
from coadapt.executors._shim import _SignalWake

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
handled = []

def stop(signum, frame):
    handled.append(signum)
    child.terminate()

signal.signal(signal.SIGUSR1, stop)
wake = _SignalWake()
sender = threading.Thread(target=lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGUSR1)))
sender.start()  # before the mask below, so this thread can take the signal
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
t0 = time.monotonic()
{wait}
waited = time.monotonic() - t0
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
child.kill()
child.wait()
print(f"{{waited:.3f}} {{handled}}")
"""


def _run(wait: str) -> tuple[float, str]:
    script = textwrap.dedent(RACE.format(wait=wait))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=50, check=True
    ).stdout.split(maxsplit=1)
    return float(out[0]), out[1].strip()


def test_a_signal_that_lands_before_the_wait_ends_the_child_wait_at_once() -> None:
    waited, handled = _run("code = wake.wait_child(child)")
    assert waited < 10, f"the wait outlived the stop by {waited:.1f} s"
    assert handled == f"[{int(__import__('signal').SIGUSR1)}]"


def test_a_signal_that_lands_before_the_wait_ends_a_socket_wait_at_once() -> None:
    waited, handled = _run(
        "import socket\na, b = socket.socketpair()\nassert wake.wait([a.fileno()], 20.0) is False"
    )
    assert waited < 10, f"the wait outlived the signal by {waited:.1f} s"
    assert handled != "[]"


def test_without_the_wakeup_pipe_the_same_wait_misses_the_signal() -> None:
    """The control: the scenario above does hold a plain blocking wait (the old shim's)."""
    waited, handled = _run("import select\nselect.select([], [], [], 2.0)")
    assert waited >= 1.9 and handled != "[]"  # handled only once the wait had run its course
