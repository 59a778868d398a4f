"""`python -m odc_bench.whatif` and the `odc-whatif` script: the command line is cli.py's.

This module imports little: the figure's helper process forks before the command imports the
harness, and loads matplotlib on the other core while this one imports and reads its input, so
that neither import lies on the verdict's path (forked.Helper)."""

from __future__ import annotations

import gc
import signal
import sys

from odc_bench.forked import Helper
from odc_bench.whatif import PROG


def run() -> None:
    """`python -m odc_bench.whatif` and the `odc-whatif` script."""
    # One short process, and its garbage is rarely cyclic: CPython's default (a collection every
    # 700 new objects) would scan the planner's and the simulator's many small containers again
    # and again for nothing; and at exit, the interpreter's last collections would scan every
    # object only to free memory the process hands back whole (frozen, they are skipped).
    gc.set_threshold(100_000, 50, 100)
    figure = Helper("odc_bench.whatif.figure")
    try:
        # Ctrl-C is held while the command loads, as odc_bench/__main__.py holds it (an extension
        # module's import can swallow it half-way); held, it is raised on release, below.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            from odc_bench.whatif.cli import main
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        main(figure=figure)
    except KeyboardInterrupt:
        # The workers (forked.py) have ended the series in hand and exited by now.
        print(f"{PROG}: interrupted", file=sys.stderr)
        # Clears CPython's mark of an unhandled KeyboardInterrupt, which a Ctrl-C surfacing in
        # exec()'d source (a dataclass's generated methods) leaves set: the process would end by
        # SIGINT rather than with 130 (odc_bench.cli.interrupted does the same).
        exec("")
        sys.exit(130)
    finally:
        figure.close()
        gc.freeze()


if __name__ == "__main__":
    run()
