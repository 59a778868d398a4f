"""A simulated run over the simulated device's memory runs and says so in its row; a local run
over this host's memory is still refused before anything is written."""

import pandas as pd
import pytest

from odc_bench.errors import ConfigError
from odc_bench.jobs.train import run_training
from tests.helpers import run_config

# 1.5B on 8 A100s at packing ratio 8: 512K tokens per microbatch, about 97 GiB by the estimate.
OVER = ("backend=sim", "backend/hardware=a100", "precision=bf16", "backend.recompute=true", "model=qwen2_1p5b",
        "world_size=8", "dataset.length_scale=1", "packing_ratio=8", "num_minibatches=2", "warmup_minibatches=0",
        "backend.write_trace=false")


def test_a_simulated_run_over_device_memory_runs_and_records_its_estimate(tmp_path):
    row = run_training(run_config(*OVER, f"results_dir={tmp_path}"))
    assert isinstance(row, dict) and row["status"] == "ok"
    table = pd.read_csv(tmp_path / "runs.csv")
    assert (table["mem_estimate_mb"] > table["mem_limit_mb"]).all()


def test_a_local_run_over_this_hosts_memory_is_refused(tmp_path):
    config = run_config("model=qwen2_7b", "dataset.length_scale=1", f"results_dir={tmp_path}")
    with pytest.raises(ConfigError, match="a rank would need about"):
        run_training(config)
    assert not (tmp_path / "runs.csv").exists()
