"""What tests share: the repository, the config a command line composes, and running the CLI.

reference.py holds the single-process trainer every engine must reproduce, real_data.py small
real datasets, figures.py results tables to draw figures from.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig

from odc_bench.config.compose import compose_config as _compose
from odc_bench.config.compose import compose_run
from odc_bench.config.run import RunConfig
from odc_bench.plan.spec import RunSpec, resolve
from odc_bench.results.migrate import series_from_config

REPO = Path(__file__).resolve().parents[2]


def compose_config(*overrides: str, hydra: bool = False) -> DictConfig:
    """The composed config `python -m odc_bench OVERRIDES` would run with (Hydra's section too, if asked)."""
    return _compose(overrides, hydra=hydra)


def run_config(*overrides: str) -> RunConfig:
    """The typed config `python -m odc_bench OVERRIDES` would run with."""
    return compose_run(overrides)


def run_spec(*overrides: str) -> RunSpec:
    """The planned run `python -m odc_bench OVERRIDES` would execute."""
    return resolve(compose_run(overrides))


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0")
    return subprocess.run([sys.executable, "-m", "odc_bench", *args], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def with_series(row: dict) -> dict:
    """A synthetic row with the series columns a run of its config would have written."""
    values = series_from_config(row["engine"], row.get("backend"), row.get("config"))
    return {**row, **dict(zip(("variant", "shard", "fetch", "staleness"), values, strict=True))}
