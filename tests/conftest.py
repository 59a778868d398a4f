from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from odc_bench.app import register_sweeps

REPO = Path(__file__).resolve().parents[1]

register_sweeps()


def compose_config(*overrides: str) -> DictConfig:
    """The config `python -m odc_bench OVERRIDES` would run with."""
    with initialize_config_module("odc_bench.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides))


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0")
    return subprocess.run([sys.executable, "-m", "odc_bench", *args], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"
