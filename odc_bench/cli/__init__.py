"""The command line: checks before Hydra starts (precheck.py), the sweeps' sweeper (sweeper.py),
the SLURM launcher's driver side (slurm.py) and the progress callback (progress.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from odc_bench.app import main as hydra_main
from odc_bench.cli.precheck import precheck
from odc_bench.config.compose import register_sweeps
from odc_bench.errors import ConfigError, fail


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m odc_bench`: every bad input ends in one line and exit status 2 before Hydra runs."""
    register_sweeps()
    try:
        precheck(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        fail(e)
    hydra_main()
