"""One training run, end to end: plan it, run its ranks (or simulate them), record its row.

Every stage below this one is a pure step of the data flow; this module strings them
together and writes what they produce: the trace beside the results table, and the row in it
(failed runs too).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from odc_bench.config.backend import SimBackendConfig
from odc_bench.config.run import RunConfig
from odc_bench.errors import RunFailed
from odc_bench.jobs import progress
from odc_bench.plan.spec import RunSpec, resolve
from odc_bench.record.metrics import events_frame
from odc_bench.record.row import failed_row, run_row, sim_row
from odc_bench.results.table import append_row, check_results_dir, completed_keys, write_trace
from odc_bench.run import slurm_task
from odc_bench.run.local import run_local
from odc_bench.sim import simulate

# A launcher: runs the spec's ranks; every rank's result, or None in a task that does not report.
Launcher = Callable[[RunSpec], list[dict] | None]


def _local(spec: RunSpec) -> list[dict]:
    display = progress.current()
    return run_local(spec, on_progress=display.run_minibatches if display is not None and display.enabled else None)


def default_launcher() -> Launcher:
    """SLURM's task side inside a job that submitit started, local processes otherwise."""
    return slurm_task.run_task if slurm_task.in_task() else _local


def execute(spec: RunSpec, results_dir: Path, launch: Launcher | None = None) -> dict | None:
    """Run the ranks (or simulate them), summarise their traces, and record the row (failed runs too).

    Returns None in a SLURM task other than rank 0: rank 0 gathers the ranks and records the row.
    """
    if spec.config.simulated:
        return execute_sim(spec, results_dir)
    try:
        results = (launch or default_launcher())(spec)
    except RunFailed as e:
        row = failed_row(spec, str(e))
        append_row(results_dir / "runs.csv", row)
        return row
    if results is None:
        return None
    events = events_frame(results)
    trace = Path("traces") / f"{spec.run_id}.csv"
    write_trace(results_dir / trace, events)
    row = run_row(spec, results, events, str(trace))
    append_row(results_dir / "runs.csv", row)
    return row


def execute_sim(spec: RunSpec, results_dir: Path) -> dict:
    """The simulator's row, with its trace when the backend writes one."""
    events = simulate(spec).events
    trace = ""
    backend = spec.config.backend
    if isinstance(backend, SimBackendConfig) and backend.write_trace:
        trace = str(Path("traces") / f"{spec.run_id}.csv")
        write_trace(results_dir / trace, events)
    row = sim_row(spec, events, trace)
    append_row(results_dir / "runs.csv", row)
    return row


SHOWN = ("engine", "balancer", "model", "dataset", "world_size", "minibatch_size", "samples_per_s",
         "tokens_per_s", "bubble_rate", "predicted_bubble_rate", "peak_mem_mb", "wall_s", "loss_last")


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_row(row: dict) -> None:
    table = Table(title=f"run {row['run_id']} ({row['status']})", show_header=False)
    for col in SHOWN:
        table.add_row(col, _fmt(row.get(col)))
    Console().print(table)
    if row["status"] != "ok":
        # Verbatim: error text may hold brackets that markup would swallow.
        Console(stderr=True).print(f"run failed: {row['error']}", markup=False, highlight=False)


def run_training(config: RunConfig, in_sweep: bool = False) -> dict | None:
    """The task=train job: plan, skip a run already in the table, execute, print the row.

    ConfigError (bad input) before anything is written. A single run that failed exits with
    status 1; in a sweep the next run goes on. Returns the row (None when skipped)."""
    results_dir = Path(config.results_dir)
    spec = resolve(config)
    check_results_dir(results_dir)
    if spec.run_id in completed_keys(results_dir / "runs.csv"):
        print(f"odc_bench: run {spec.run_id} already in {results_dir / 'runs.csv'}; skipped")
        return None
    row = execute(spec, results_dir)
    if row is None:
        return None
    print_row(row)
    if row["status"] != "ok" and not in_sweep:
        sys.exit(1)
    return row
