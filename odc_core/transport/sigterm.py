"""Removing this process's shared-memory segments when it is terminated.

torchrun (and torch.multiprocessing, SLURM at a time limit) stops a failed rank's peers with
SIGTERM, whose default action ends a process without running atexit, so every segment the
peers created would stay in /dev/shm until the next heap on the host swept it. While a heap is
open, a handler here first runs every open heap's clean-up and then does what SIGTERM did
before it: the previous Python handler, or the default action (the process dies of SIGTERM,
as its launcher expects). Where SIGTERM was ignored, or handled outside Python, nothing is
installed.

What the clean-up may do is what is safe at any bytecode boundary of the main thread: unlink
segment names. It leaves every mapping in place (peers' and this process's tensors stay valid),
so a previous handler that lets the process go on leaves a working heap whose names are gone.
SIGKILL cannot be handled: those segments are still swept by the peers or the next heap.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_cleanups: dict[int, Callable[[], None]] = {}
_installed = False
_previous: Any = signal.SIG_DFL  # the handler ours replaced when it was last installed
_guard = threading.Lock()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    for cleanup in list(_cleanups.values()):
        cleanup()
    _uninstall()
    if callable(_previous):
        _previous(signum, frame)
    else:  # SIG_DFL: die of SIGTERM, set here in case ours was reached through someone's chain
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _uninstall() -> None:
    global _installed
    if _installed and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, _previous)
    _installed = False


def on_sigterm(key: int, cleanup: Callable[[], None]) -> None:
    """Run `cleanup` if this process gets SIGTERM before forget(key). The handler is installed
    from the main thread only (Python's rule); a clean-up registered from another thread runs
    when one registered from the main thread installed it."""
    global _installed, _previous
    with _guard:
        _cleanups[key] = cleanup
        if _installed or threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current in (signal.SIG_IGN, None):  # ignored, or handled outside Python: leave it be
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
        _installed, _previous = True, current


def forget(key: int) -> None:
    """Drop a clean-up; the last one gone puts the previous handler back (from the main thread)."""
    with _guard:
        _cleanups.pop(key, None)
        if not _cleanups and threading.current_thread() is threading.main_thread():
            _uninstall()
