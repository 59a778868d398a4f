"""The SIGTERM clean-up of shared-memory heaps (odc_core/transport/sigterm.py) chains the handler
it found, and leaves the process's handler as it was once the last heap is closed."""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist

from odc_core.transport.shm import ShmHeap, list_segments, of_job


def _mine(job: str) -> list[str]:
    return [s for s in list_segments() if of_job(s, job)]


def test_sigterm_removes_the_heaps_segments_then_runs_the_previous_handler():
    seen: list[int] = []

    def previous(signum, _frame):
        seen.append(signum)

    original = signal.signal(signal.SIGTERM, previous)
    try:
        heap = ShmHeap(0, 1, "sigterm-test", dist.HashStore(), timeout_s=5.0)
        heap.alloc("x", 4, torch.float32)
        assert len(_mine("sigterm-test")) == 2 and signal.getsignal(signal.SIGTERM) is not previous
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM], "the previous handler ran"
        assert _mine("sigterm-test") == [], "the segments' names are gone"
        assert signal.getsignal(signal.SIGTERM) is previous, "a second SIGTERM goes to the previous handler"
        heap.view("x", 0).add_(1.0)  # the mapping stays valid after its name is gone
        heap.close()
        again = ShmHeap(0, 1, "sigterm-test2", dist.HashStore(), timeout_s=5.0)
        again.close()
        assert signal.getsignal(signal.SIGTERM) is previous, "closing the last heap puts the handler back"
    finally:
        signal.signal(signal.SIGTERM, original)


def test_an_ignored_sigterm_stays_ignored():
    original = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        heap = ShmHeap(0, 1, "sigterm-test3", dist.HashStore(), timeout_s=5.0)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        heap.close()
    finally:
        signal.signal(signal.SIGTERM, original)
