"""`make test`: the whole suite, as CI runs it, in three pytest processes.

1. The wall-clock comparisons (marker `timing`) first, alone, once the load average has
   settled: they measure the machine, and anything beside them would be measured too.
2. Then the SLURM tests (marker `slurm`), which spend most of their time waiting for the
   cluster's scheduler, beside all the others; their output follows when both are done.
   The others run on two pytest-xdist workers, a file to a worker: alone on one worker they
   kept a 2-core machine's cores busy less than half the time (docs/architecture.md, "Tests").

Arguments go to every pytest (`python -m tests.suite -x -k resume`); `-m` is this script's.
Ctrl-C reaches each pytest once, so the SLURM tests still cancel what they submitted. The exit
status is the first failing pytest's (no test selected counts as passing).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from tests.helpers import overloaded
from tests.helpers.shm import PART

NOTHING_SELECTED = 5  # pytest's exit status when the marks and -k leave no test
# What came before (installing, lint) can leave the one-minute load average high for a while:
# the timing tests wait this long for it to settle before they skip.
SETTLE_S = 120.0
# Each file on one worker: a file's tests share module fixtures (a trained model, a composed
# sweep) that would otherwise be built once per worker.
WORKERS = ("-n", "2", "--dist", "loadfile")


def _pytest(args: Sequence[str], marks: str, durations: int) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", *args, "-m", marks, f"--durations={durations}"]


def _wait(procs: Sequence[subprocess.Popen]) -> list[int]:
    """Every process's exit status; on Ctrl-C each is interrupted once and waited for, so that
    its tests clean up (cancel SLURM jobs, remove shared memory)."""
    try:
        return [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        raise


def _settle() -> None:
    deadline = time.monotonic() + SETTLE_S
    if (busy := overloaded()) is not None:
        print(f"tests.suite: load average {busy[0]:.1f} on {busy[1]} cores; waiting up to {SETTLE_S:.0f} s for it "
              f"to settle before the timing tests", flush=True)
    while overloaded() is not None and time.monotonic() < deadline:
        time.sleep(2)


def main(args: Sequence[str]) -> int:
    _settle()
    # Each pytest in its own session: the terminal's Ctrl-C reaches this process alone, which
    # passes it on once (a second SIGINT would cut a pytest's clean-up short).
    timing = subprocess.Popen(_pytest(args, "timing and not slurm", 5), start_new_session=True)
    statuses = _wait([timing])
    with tempfile.TemporaryFile("w+", encoding="locale") as log:  # as the pytest writing it
        slurm = subprocess.Popen(_pytest([*args, "-p", "no:cacheprovider"], "slurm", 10), stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env=dict(os.environ, **{PART: "slurm"}))
        rest = subprocess.Popen(_pytest([*WORKERS, *args], "not slurm and not timing", 15), start_new_session=True,
                                env=dict(os.environ, **{PART: "main"}))
        try:
            statuses += _wait([rest, slurm])
        finally:
            log.seek(0)
            print("\n--- the SLURM tests, run beside the others ---", flush=True)
            sys.stdout.write(log.read())
    failed = [s for s in statuses if s not in (0, NOTHING_SELECTED)]
    return failed[0] if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
