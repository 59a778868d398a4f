"""The Hydra app: `python -m odc_bench [overrides]` runs one job; `sweep=NAME` runs a sweep."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from odc_bench.config import ConfigError, RunSpec, check_results_dir, resolve
from odc_bench.launch import slurm
from odc_bench.launch.local import RunFailed, run_local
from odc_bench.metrics import events_frame, minibatch_losses, summarize
from odc_bench.provenance import REPO_ROOT, git_commit
from odc_bench.results import SCHEMA_VERSION, append_row, completed_keys, write_trace, write_trace_frame

SWEEPS_DIR = Path(os.environ.get("ODC_SWEEPS_DIR", REPO_ROOT / "sweeps"))


def register_sweeps(directory: Path = SWEEPS_DIR) -> None:
    """Expose each sweeps/NAME.yaml as the config option `sweep=NAME` (package _global_)."""
    store = ConfigStore.instance()
    for path in sorted(directory.glob("*.yaml")):
        store.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_")


def fail_config(error: ConfigError) -> None:
    print(f"odc_bench: error: {error}", file=sys.stderr)
    sys.exit(2)


def base_row(spec: RunSpec) -> dict:
    c = spec.config
    return dict(
        run_id=spec.run_id, schema_version=SCHEMA_VERSION, timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"),
        commit=git_commit(), host=socket.gethostname(), backend=c["backend"]["name"], engine=c["engine"]["name"],
        balancer=c["balancer"]["name"], cost_model=spec.cost_model, model=c["model"]["name"],
        dataset=c["dataset"]["name"], world_size=c["world_size"], minibatch_size=c["minibatch_size"],
        num_minibatches=c["num_minibatches"], warmup_minibatches=c["warmup_minibatches"],
        max_tokens=spec.max_tokens, packing_ratio=c["packing_ratio"], length_scale=c["dataset"]["length_scale"],
        precision=c["precision"], seed=c["seed"], predicted_bubble_rate=spec.predicted_bubble_rate(),
        config=OmegaConf.to_yaml(OmegaConf.create(c)).strip(),
    )


def execute(spec: RunSpec, results_dir: Path, launch: Callable[..., list[dict] | None] = run_local) -> dict | None:
    """Run the ranks (or simulate them), summarise their traces, and record the row (failed runs too).

    Returns None in a SLURM task other than rank 0: rank 0 gathers the ranks and records the row.
    """
    if spec.config["backend"]["name"] == "sim":
        return execute_sim(spec, results_dir)
    row = base_row(spec)
    try:
        results = launch(spec, deadline_s=spec.config.get("deadline_s"))
    except RunFailed as e:
        row.update(status="failed", error=str(e))
        append_row(results_dir / "runs.csv", row)
        return row
    if results is None:
        return None
    events = events_frame(results)
    trace_path = results_dir / "traces" / f"{spec.run_id}.csv"
    write_trace(trace_path, events.to_dict("records"))
    losses = minibatch_losses(events, [mb.labelled_tokens for mb in spec.minibatches])
    row.update(summary(spec, events))
    row.update(status="ok", error="", peak_mem_mb=max(r["peak_bytes"] + r["heap_bytes"] for r in results) / 2**20,
               heap_mb=max(r["heap_bytes"] for r in results) / 2**20, loss_first=losses[0],
               loss_last=losses[-1], trace=str(trace_path.relative_to(results_dir)))
    append_row(results_dir / "runs.csv", row)
    return row


def summary(spec: RunSpec, events) -> dict:
    """The row's timing columns from a trace, real or simulated alike."""
    warmup = int(spec.config["warmup_minibatches"])
    measured = spec.minibatches[warmup:]
    return summarize(events, spec.world_size, warmup, samples=sum(len(mb.lengths) for mb in measured),
                     tokens=sum(sum(mb.lengths) for mb in measured))


def execute_sim(spec: RunSpec, results_dir: Path) -> dict:
    """The simulator's row: same columns; no losses or memory, which it does not model."""
    from odc_bench.sim import simulate

    row = base_row(spec)
    events = simulate(spec).events
    row.update(summary(spec, events))
    row.update(status="ok", error="", trace="")
    if spec.config["backend"].get("write_trace", True):
        trace_path = results_dir / "traces" / f"{spec.run_id}.csv"
        write_trace_frame(trace_path, events)
        row["trace"] = str(trace_path.relative_to(results_dir))
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
        Console(stderr=True).print(f"[red]run failed:[/red] {row['error']}")


def run_job(cfg: DictConfig) -> dict | list[dict] | None:
    task = cfg.get("task", "train")
    if task == "primitives":  # the communication microbenchmark, not a training run
        from odc_bench.bench_primitives import run_primitives

        return run_primitives(cfg)
    results_dir = Path(cfg.results_dir)
    try:
        spec = resolve(cfg)
        check_results_dir(results_dir)
        if spec.run_id in completed_keys(results_dir / "runs.csv"):
            print(f"odc_bench: run {spec.run_id} already in {results_dir / 'runs.csv'}; skipped")
            return None
        # The simulator checks its hardware profile only when it runs: a ConfigError, no row.
        row = execute(spec, results_dir, slurm.run_ranks if slurm.in_task() else run_local)
    except ConfigError as e:
        fail_config(e)
    if row is None:
        return None
    print_row(row)
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if row["status"] != "ok" and not multirun:
        sys.exit(1)
    return row


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict | None:
    return run_job(cfg)  # the row (None when skipped): Hydra hands it to callbacks and launchers

