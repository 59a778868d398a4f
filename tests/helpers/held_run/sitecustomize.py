"""Put on PYTHONPATH with ODC_TEST_HOLD naming a file, every rank of a run (each SLURM task
included) waits before each sample while that file exists. A test holds a run where it chose
(just after a checkpoint) for as long as SLURM's commands take to act on it under load: a run
made long enough to outlast them instead trained for minutes (tests/integration/test_slurm.py)."""

import os
import time
from pathlib import Path

from odc_bench.data import tokens

_HOLD = Path(os.environ["ODC_TEST_HOLD"])
_source = tokens.token_source


def _held_source(ds):
    sample = _source(ds)

    def held(*args):
        while _HOLD.exists():
            time.sleep(0.05)
        return sample(*args)

    return held


# The worker binds token_source when it is imported, after this file has run.
tokens.token_source = _held_source
