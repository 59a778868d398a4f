"""One training run, end to end: plan it, run its ranks (or simulate them), record its row.

Every stage below this one is a pure step of the data flow; this module strings them
together and writes what they produce: the trace beside the results table, and the row in it
(failed runs too).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from odc_bench.config.backend import SimBackendConfig
from odc_bench.config.run import RunConfig
from odc_bench.config.unused import unused_settings
from odc_bench.data.lengths import reuse_note
from odc_bench.data.real import write_pending_caches
from odc_bench.errors import RunFailed
from odc_bench.files import claimed, interrupts_deferred
from odc_bench.jobs import progress
from odc_bench.plan.device import cuda_available
from odc_bench.plan.identity import checkpoint_folder
from odc_bench.plan.spec import Planner, RunSpec
from odc_bench.record.metrics import events_frame
from odc_bench.record.row import diverged, failed_row, run_row, sim_row
from odc_bench.results.table import TRACE_SUFFIX, append_row, check_results_dir, ok_runs, write_trace
from odc_bench.run import slurm_task
from odc_bench.sim import check_hardware, simulate

# A launcher: runs the spec's ranks; every rank's result, or None in a task that does not report.
Launcher = Callable[[RunSpec], list[dict] | None]


def _local(spec: RunSpec) -> list[dict]:
    # The launchers import torch: a simulated run never loads them.
    from odc_bench.run.local import run_local
    from odc_bench.run.mpiexec import run_mpi

    display = progress.current()
    on_progress = display.run_minibatches if display is not None else None
    return (run_mpi if uses_mpi(spec) else run_local)(spec, on_progress=on_progress)


def default_launcher(repeat_index: int = 0) -> Launcher:
    """SLURM's task side inside a job that submitit started (each repeat of the run meeting in a
    folder of its own), local processes otherwise (under mpiexec for the MPI transport)."""
    return partial(slurm_task.run_task, repeat_index=repeat_index) if slurm_task.in_task() else _local


def _record(results_dir: Path, row: dict) -> dict:
    row["attempt"] = append_row(results_dir / "runs.csv", row)
    return row


def execute(spec: RunSpec, results_dir: Path, launch: Launcher | None = None, repeat_index: int = 0) -> dict | None:
    """Run the ranks (or simulate them), summarise their traces, and record the row (failed runs too).

    Returns None in a SLURM task other than rank 0: rank 0 gathers the ranks and records the row.
    """
    if spec.config.simulated:
        return execute_sim(spec, results_dir)
    # odc_core.checkpoint imports torch (about 1.5 s): a simulated run never loads it.
    from odc_core import checkpoint

    folder = checkpoint_folder(spec.config, spec.run_id)
    with warnings.catch_warnings(record=True) as damaged:
        warnings.simplefilter("always", checkpoint.DamagedCheckpointWarning)
        found = checkpoint.latest(folder) if spec.config.checkpoint.resume == "auto" else None
    if not (slurm_task.in_task() and slurm_task.task_rank() != 0):
        for warning in damaged:
            progress.say(f"run {spec.run_id}: {warning.message}")
        if found is not None:
            progress.say(f"run {spec.run_id}: resumed from minibatch {checkpoint.step_of(found)} of "
                         f"{len(spec.minibatches)}, checkpoint {found.name} ({folder})")
    try:
        results = (launch or default_launcher(repeat_index))(spec)
    except RunFailed as e:
        return _record(results_dir, failed_row(spec, str(e)))
    except KeyboardInterrupt as e:
        raise KeyboardInterrupt(str(e) or kept_checkpoints(folder, spec.config.checkpoint.resume == "auto")) from None
    if results is None:
        return None
    events = events_frame(results)
    trace = _trace_path(results_dir, spec)
    with interrupts_deferred():
        row = _publish(results_dir, (trace, events), run_row(spec, results, events, str(trace)))
        # Recorded: its checkpoints have served (a failed run keeps them for its re-run to
        # resume). Under the same hold: half removed, they would resume the config's next run.
        shutil.rmtree(checkpoint_folder(spec.config, spec.run_id), ignore_errors=True)
    return row


def _publish(results_dir: Path, trace: tuple[Path, pd.DataFrame] | None, row: dict) -> dict:
    """The run's trace (its path and events, when it has one) and the row that names it: both, or
    (the row not written) neither, so no trace is left that no row names. Ctrl-C waits for them
    (the caller holds it)."""
    if trace is None:
        return _record(results_dir, row)
    path, events = trace
    write_trace(results_dir / path, events)
    try:
        return _record(results_dir, row)
    except BaseException:
        (results_dir / path).unlink(missing_ok=True)
        raise


def kept_checkpoints(folder: Path, resumes: bool = True) -> str:
    """What a stopped run leaves, for the Ctrl-C line: its checkpoints, where, and whether the same
    command resumes from them (checkpoint.resume=auto); empty when it has none."""
    from odc_core import checkpoint

    with warnings.catch_warnings():  # what a resume would skip was said as the run started
        warnings.simplefilter("ignore", checkpoint.DamagedCheckpointWarning)
        newest = checkpoint.latest(folder)
    if newest is None:
        return ""
    steps = [p.name for p in checkpoint.complete(folder)]
    # the minibatch a harness checkpoint resumes from is its step (worker.save numbers them so)
    then = (f"the same command resumes it from minibatch {checkpoint.step_of(newest)}" if resumes else
            "checkpoint.resume=never: the same command starts again from minibatch 0")
    several = len(steps) > 1
    return (f"the run under way was stopped and wrote no row; its checkpoint{'s' * several} "
            f"{', '.join(steps)} stay{'s' * (not several)} in {folder}: {then}")


def _trace_path(results_dir: Path, spec: RunSpec) -> Path:
    """traces/<run_id>.csv.gz, or <run_id>-<n>.csv.gz for the n-th run of a config already in the table."""
    traces = results_dir / "traces"
    runs = sum(1 for _ in traces.glob(f"{spec.run_id}*{TRACE_SUFFIX}")) if traces.is_dir() else 0
    return Path("traces") / (f"{spec.run_id}{TRACE_SUFFIX}" if runs == 0 else f"{spec.run_id}-{runs}{TRACE_SUFFIX}")


def execute_sim(spec: RunSpec, results_dir: Path) -> dict:
    """The simulator's row, with its trace when the backend writes one."""
    backend = spec.config.backend
    with_trace = isinstance(backend, SimBackendConfig) and backend.write_trace
    sim = simulate(spec, trace=with_trace)
    # Only a simulation that kept its events has them: with_trace asked for them.
    trace = (_trace_path(results_dir, spec), sim.events) if with_trace else None
    with interrupts_deferred():
        return _publish(results_dir, trace, sim_row(spec, sim, str(trace[0]) if trace else ""))


SHOWN = ("engine", "balancer", "model", "dataset", "world_size", "minibatch_size", "samples_per_s",
         "tokens_per_s", "mfu", "bubble_rate", "predicted_bubble_rate", "peak_mem_mb", "mem_estimate_mb", "wall_s",
         "loss_last")


def _fmt(value: object) -> str:
    """A cell of the run's table; '-' for what the run does not measure (the simulator's memory, losses)."""
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def print_row(row: dict) -> None:
    table = Table(title=f"run {row['run_id']} ({row['status']})", show_header=False)
    for col in SHOWN:
        table.add_row(col, _fmt(row.get(col)))
    Console().print(table)
    if row["status"] != "ok":
        # Verbatim: error text may hold brackets that markup would swallow.
        Console(stderr=True).print(f"run failed: {row['error']}", markup=False, highlight=False)


def describe_lengths(spec: RunSpec) -> str:
    """One line: the sample lengths the run trains on, after dataset.length_scale (the row has them too)."""
    s, ds = spec.length_stats(), spec.config.dataset
    scale = "" if ds.length_scale == 1 else f", dataset.length_scale={ds.length_scale:g}"
    reuse = reuse_note(spec.pool_size, int(s["samples"]))
    drawn = (f"{s['samples']} samples drawn from the {spec.pool_size} of {ds.name}{scale} ({reuse})" if reuse else
             f"{s['samples']} samples of {ds.name}{scale}")
    return (f"lengths: {drawn}: mean {s['len_mean']:.0f}, p50 {s['len_p50']:.0f}, "
            f"p99 {s['len_p99']:.0f}, max {s['len_max']} tokens; max_tokens {spec.max_tokens}")


def uses_mpi(spec: RunSpec) -> bool:
    """run.mpiexec.uses_mpi, without importing the launcher (and torch) for every run."""
    return getattr(spec.config.engine.options, "transport", None) == "mpi"


def run_training(config: RunConfig, in_sweep: bool = False, job_gpus: int | None = None,
                 planner: Planner | None = None) -> dict | list[dict] | None:
    """The task=train job: plan (with `planner`, which may hold the plan already), run the
    config until the table holds `repeat` ok runs of it, print each row.

    ConfigError (bad input) before anything is written. A single job with a failed run exits
    with status 1; in a sweep the next job goes on. Returns the row, the rows of several
    repeats, or None when the table already had them."""
    results_dir = Path(config.results_dir)
    if job_gpus and not config.simulated and slurm_task.in_task() and not cuda_available():
        # Resolved for CUDA where it was submitted; a CPU run here would be another run.
        raise RunFailed(f"this SLURM job asked for GPUs (hydra.launcher.gpus_per_node={job_gpus}) but its node "
                        f"{socket.gethostname()} sees no CUDA device; check hydra.launcher.partition, or leave out "
                        f"gpus_per_node to run CPU ranks")
    spec = (planner or Planner()).resolve(config)
    check_results_dir(results_dir)
    for unused in unused_settings(config):
        print(f"odc_bench: note: {unused.note()}", file=sys.stderr)
    # Claimed before anything else, so that a re-run takes over the claim a killed command left,
    # whatever it finds. A SLURM job's tasks all run this, and its driver keeps the folder's runs
    # from being submitted twice (cli/submissions.py).
    claim = contextlib.nullcontext(None) if slurm_task.in_task() else claimed(
        results_dir / f".{spec.run_id}.running", f"pid {os.getpid()} on {socket.gethostname()}, "
                                                  f"since {time.strftime('%H:%M:%S')}")
    with claim as elsewhere:
        if elsewhere is not None:
            print(f"odc_bench: run {spec.run_id} is under way in another command ({elsewhere or 'starting'}) on "
                  f"{results_dir}; skipped")
            return None
        if _already_done(spec, results_dir):
            return None
        if not slurm_task.in_task():  # a SLURM job's nodes are not this host
            spec.check_devices()
            spec.check_compile()
            spec.check_fits()
            if uses_mpi(spec):
                from odc_bench.run.mpiexec import mpiexec_path

                mpiexec_path()
            if (shared := spec.cpus_shared()) is not None:
                print(f"odc_bench: note: {shared}", file=sys.stderr)
        if config.simulated:
            check_hardware(spec)
            # Answered anyway (a sweep at paper scale holds configs that do not fit), but not
            # without a word: its throughput is what the GPUs would reach with memory enough.
            if (problem := spec.fit_problem()) is not None:
                print(f"odc_bench: note: on the simulated GPUs this run would not fit: {problem}; the simulator "
                      f"answers it anyway", file=sys.stderr)
        done = ok_runs(results_dir / "runs.csv").get(spec.run_id, 0)
        write_pending_caches()  # the run is accepted: only now does anything land beside the user's data
        # Out before the run starts, however stdout buffers (a pipe or a file: block by block): a
        # reader gone (`| head`) ends the command here rather than after the run wrote its row.
        print(describe_lengths(spec), flush=True)
        rows = []
        for index in range(done, config.repeat):
            row = execute(spec, results_dir, repeat_index=index)
            if row is not None:
                print_row(row)
                if (note := diverged(row)) is not None:
                    print(f"odc_bench: note: {note}", file=sys.stderr)
                rows.append(row)
    if any(r["status"] != "ok" for r in rows) and not in_sweep:
        sys.exit(1)
    return None if not rows else rows[0] if len(rows) == 1 else rows


def _already_done(spec: RunSpec, results_dir: Path) -> bool:
    """Whether the table holds the run's `repeat` ok rows (said, when it does)."""
    done = ok_runs(results_dir / "runs.csv").get(spec.run_id, 0)
    if done >= spec.config.repeat:
        print(f"odc_bench: run {spec.run_id} already in {results_dir / 'runs.csv'} "
              f"({done} ok of repeat={spec.config.repeat}); skipped")
    return done >= spec.config.repeat
