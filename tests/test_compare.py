import pandas as pd
import pytest
from rich.console import Console

from odc_bench.compare import WORKLOAD, comparison, print_comparison


def _row(run_id, engine, balancer, samples_per_s, status="ok", dataset="longalign", seed=0, group=None):
    workload = dict.fromkeys(WORKLOAD, 1) | {"backend": "local", "model": "tiny", "dataset": dataset}
    config = None if group is None else f"engine:\n  name: {engine}\n  backend: {group}\n"
    return workload | dict(run_id=run_id, engine=engine, balancer=balancer, seed=seed, status=status,
                           samples_per_s=samples_per_s, bubble_rate=0.1, predicted_bubble_rate=0.05,
                           peak_mem_mb=100.0, config=config)


def test_speedups_are_against_collective_lb_micro_with_seeds_averaged():
    table = pd.DataFrame([
        _row("a", "collective", "lb_micro", 10.0, seed=0), _row("b", "collective", "lb_micro", 14.0, seed=1),
        _row("c", "odc", "lb_mini", 18.0), _row("d", "collective", "local_sort", 6.0),
        _row("e", "odc", "lb_mini", 99.0, status="failed"),
    ])
    rows = comparison(table).set_index(["engine", "balancer"])
    assert rows.loc[("collective", "lb_micro"), "runs"] == 2
    assert rows.loc[("odc", "lb_mini"), "speedup"] == pytest.approx(18.0 / 12.0)
    assert rows.loc[("collective", "local_sort"), "speedup"] == pytest.approx(0.5)


def test_without_lb_micro_the_baseline_is_collective_local_sort_per_workload():
    table = pd.DataFrame([
        _row("a", "collective", "local_sort", 5.0, dataset="aime"), _row("b", "odc", "local_sort", 7.5, dataset="aime"),
        _row("c", "odc", "dynamic", 3.0, dataset="fixed"),
    ])
    rows = comparison(table)
    aime = rows[rows.dataset == "aime"].set_index("engine")
    assert aime.loc["odc", "speedup"] == pytest.approx(1.5)
    assert rows[rows.dataset == "fixed"]["speedup"].isna().all(), "no collective run: nothing to compare with"
    console = Console(record=True, width=120)
    print_comparison(rows, console)
    text = console.export_text()
    assert "odc+local_sort" in text and "1.50x" in text and "speedup vs collective+local_sort" in text


def test_fsdp2_on_two_process_groups_is_two_series_and_the_shared_memory_one_is_the_baseline():
    table = pd.DataFrame([
        _row("a", "collective", "local_sort", 5.0, group="gloo"),
        _row("b", "collective", "local_sort", 8.0, group="shm"),
        _row("c", "odc", "local_sort", 10.0),
    ])
    rows = comparison(table).set_index("series")
    assert rows.loc["collective[shm]+local_sort", "speedup"] == pytest.approx(1.0)
    assert rows.loc["collective[gloo]+local_sort", "speedup"] == pytest.approx(5.0 / 8.0)
    assert rows.loc["odc+local_sort", "speedup"] == pytest.approx(10.0 / 8.0)
    console = Console(record=True, width=120)
    print_comparison(comparison(table), console)
    assert "collective[gloo]+local_sort" in console.export_text(), "the group is printed, not eaten as markup"


def test_one_process_group_is_not_named():
    table = pd.DataFrame([_row("a", "collective", "local_sort", 5.0, group="shm"), _row("b", "odc", "local_sort", 6.0)])
    assert set(comparison(table)["series"]) == {"collective+local_sort", "odc+local_sort"}
