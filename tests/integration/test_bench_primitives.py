"""The primitives microbenchmark as a task of the app: rows, schema, bad input."""

import pandas as pd
import pytest

from odc_bench.errors import ConfigError
from odc_bench.jobs.primitives import plan_from_config
from tests.helpers import odc_bench, run_config
from tests.helpers.mpi import requires_mpi

SCHEMA = ["run_id", "timestamp", "commit", "host", "op", "transport", "world_size", "size_bytes", "dtype",
          "iterations", "seconds", "bandwidth_gbps", "memcpy_gbps", "ratio_to_memcpy"]


def test_sizes_follow_the_config():
    plan = plan_from_config(run_config("task=primitives", "primitives.min_bytes=4096",
                                       "primitives.max_bytes=262144", "world_size=4"))
    assert plan.sizes == [4096, 16384, 65536, 262144] and plan.world_size == 4
    assert plan_from_config(run_config("task=primitives", "primitives.min_bytes=6", "primitives.max_bytes=100",
                                       "primitives.step=3", "primitives.dtype=bf16")).sizes == [6, 18, 54]


def test_the_sweep_takes_benchmark_settings_from_the_command_line():
    config = run_config("sweep=primitives", "primitives.dtype=bf16", "primitives.max_bytes=65536")
    assert config.task == "primitives" and plan_from_config(config).sizes == [4096, 16384, 65536]


@pytest.mark.parametrize("override, message", [
    ("primitives.dtype=fp16", "primitives.dtype must be one of fp32, bf16"),
    ("primitives.min_bytes=4", "must hold at least one fp32 element per rank"),
    ("primitives.step=1", "primitives.step must be at least 2, got 1"),
    ("primitives.turn_s=0", "primitives.turn_s must be a positive number"),
])
def test_bad_benchmark_config_is_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        plan_from_config(run_config("task=primitives", override))


@pytest.mark.slow
def test_benchmark_appends_one_row_per_op_and_size(results_dir, monkeypatch, capsys):
    monkeypatch.chdir(results_dir.parent)
    args = ("task=primitives", "world_size=2", "primitives.min_bytes=256", "primitives.max_bytes=4096",
            "primitives.rounds=3", "primitives.turn_s=0.001", "primitives.dtype=bf16", f"results_dir={results_dir}")
    assert odc_bench(*args) == 0, capsys.readouterr().err
    # Each size its own label, one below a KiB included (it once read "0 KiB").
    labels = [line.split("│")[1].strip() for line in capsys.readouterr().out.splitlines() if line.count("│") > 2]
    assert labels == ["256 B", "1 KiB", "4 KiB"]
    table = pd.read_csv(results_dir / "primitives.csv")
    assert list(table.columns) == SCHEMA
    assert len(table) == 3 * 5
    assert set(table["op"]) == {"gather", "scatter_accumulate", "all_gather", "reduce_scatter", "memcpy"}
    assert dict(zip(table["op"], table["transport"], strict=True)) == {
        "gather": "shm", "scatter_accumulate": "shm", "all_gather": "gloo", "reduce_scatter": "gloo",
        "memcpy": "local"}
    assert (table["dtype"] == "bf16").all() and (table["world_size"] == 2).all()
    assert (table["iterations"] % 3 == 0).all()  # 3 rounds of whole turns
    assert (table["seconds"] > 0).all()
    pd.testing.assert_series_equal(table["bandwidth_gbps"], table["size_bytes"] / table["seconds"] / 1e9,
                                   check_names=False)
    pd.testing.assert_series_equal(table["ratio_to_memcpy"], table["bandwidth_gbps"] / table["memcpy_gbps"],
                                   check_names=False)
    memcpy = table[table["op"] == "memcpy"].set_index("size_bytes")["bandwidth_gbps"]
    pd.testing.assert_series_equal(table["memcpy_gbps"], table["size_bytes"].map(memcpy), check_names=False)

    assert odc_bench("task=primitives", "primitives.dtype=int8", f"results_dir={results_dir}") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "odc_bench: error: primitives.dtype must be one of")
    assert len(pd.read_csv(results_dir / "primitives.csv")) == 15


@pytest.mark.slow
@pytest.mark.mpi
@requires_mpi
def test_the_mpi_transport_rows_name_mpi_and_gloo(results_dir, monkeypatch, capsys):
    monkeypatch.chdir(results_dir.parent)
    done = odc_bench("task=primitives", "world_size=2", "primitives.transport=mpi", "primitives.min_bytes=4096",
                     "primitives.max_bytes=16384", "primitives.rounds=2", "primitives.turn_s=0.001",
                     f"results_dir={results_dir}")
    assert done == 0, capsys.readouterr().err
    table = pd.read_csv(results_dir / "primitives.csv")
    assert list(table.columns) == SCHEMA and len(table) == 2 * 5
    assert dict(zip(table["op"], table["transport"], strict=True)) == {
        "gather": "mpi", "scatter_accumulate": "mpi", "all_gather": "gloo", "reduce_scatter": "gloo",
        "memcpy": "local"}
    assert (table["seconds"] > 0).all()
