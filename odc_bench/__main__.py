import signal
import sys

from odc_bench.cli import main


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (kill, scancel) unwinds like Ctrl-C: ranks are stopped and temporaries removed."""
    sys.exit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    main()
