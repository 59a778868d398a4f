"""`python -m odc_bench.whatif` and the `odc-whatif` script: the command line is cli.py's.

This module imports little: the figure's helper process forks before the command imports the
harness, and loads matplotlib on the other core while this one imports and reads its input, so
that neither import lies on the verdict's path (forked.Helper)."""

from __future__ import annotations

import gc
import signal
import sys

from odc_bench.errors import ends_cleanly
from odc_bench.forked import Helper
from odc_bench.whatif import PROG


def run() -> None:
    """`python -m odc_bench.whatif` and the `odc-whatif` script."""
    # One short process, and its garbage is rarely cyclic: CPython's default (a collection every
    # 700 new objects) would scan the planner's and the simulator's many small containers again
    # and again for nothing; and at exit, the interpreter's last collections would scan every
    # object only to free memory the process hands back whole (frozen, they are skipped).
    gc.set_threshold(100_000, 50, 100)
    figure = None
    try:
        # Ctrl-C is held while the helper forks and the command loads, as odc_bench/__main__.py
        # holds it (an extension module's import can swallow it half-way); held, it is raised on
        # release, below, inside this try. (Released between the fork and the import, it was
        # raised before the try: a traceback and no 130.)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            figure = None if _asks_only(sys.argv[1:]) else Helper("odc_bench.whatif.figure")
            from odc_bench.whatif.cli import main
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        with ends_cleanly(prog=PROG):
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
        if figure is not None:
            figure.close()
        gc.freeze()


def _asks_only(argv: list[str]) -> bool:
    """Whether the command line only asks for help or the profiles' list: no figure to draw, so no
    helper to load matplotlib beside it (on a busy machine it would slow the answer). Anything
    else starts one; cli.main closes it where it draws no figure after all."""
    return any(a in ("-h", "--help", "--hardware=list") for a in argv) or any(
        a == "--hardware" and b == "list" for a, b in zip(argv, argv[1:], strict=False))


if __name__ == "__main__":
    run()
