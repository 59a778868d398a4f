"""The Hydra app: `python -m odc_bench [overrides]` runs one job; `sweep=NAME` runs a sweep."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from odc_bench.config import ConfigError, RunSpec, resolve
from odc_bench.launch.local import RunFailed, run_local
from odc_bench.metrics import events_frame, minibatch_losses, summarize
from odc_bench.results import SCHEMA_VERSION, append_row, completed_keys, write_trace, write_trace_frame

REPO_ROOT = Path(__file__).resolve().parents[1]
SWEEPS_DIR = Path(os.environ.get("ODC_SWEEPS_DIR", REPO_ROOT / "sweeps"))


def register_sweeps(directory: Path = SWEEPS_DIR) -> None:
    """Expose each sweeps/NAME.yaml as the config option `sweep=NAME` (package _global_)."""
    store = ConfigStore.instance()
    for path in sorted(directory.glob("*.yaml")):
        store.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_")


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fail_config(error: ConfigError) -> None:
    print(f"odc_bench: error: {error}", file=sys.stderr)
    sys.exit(2)


def base_row(spec: RunSpec) -> dict:
    c = spec.config
    return dict(
        run_id=spec.run_id, schema_version=SCHEMA_VERSION, timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"),
        commit=_commit(), host=socket.gethostname(), backend=c["backend"]["name"], engine=c["engine"]["name"],
        balancer=c["balancer"]["name"], cost_model=c["balancer"].get("cost_model", ""), model=c["model"]["name"],
        dataset=c["dataset"]["name"], world_size=c["world_size"], minibatch_size=c["minibatch_size"],
        num_minibatches=c["num_minibatches"], warmup_minibatches=c["warmup_minibatches"],
        max_tokens=spec.max_tokens, packing_ratio=c["packing_ratio"], length_scale=c["dataset"]["length_scale"],
        precision=c["precision"], seed=c["seed"], config=OmegaConf.to_yaml(OmegaConf.create(c)).strip(),
    )


def execute(spec: RunSpec, results_dir: Path) -> dict:
    """Run the ranks (or simulate them), summarise the traces, and record the row (failed runs too)."""
    if spec.config["backend"]["name"] == "sim":
        return execute_sim(spec, results_dir)
    row = base_row(spec)
    try:
        results = run_local(spec, deadline_s=spec.config.get("deadline_s"))
    except RunFailed as e:
        row.update(status="failed", error=str(e))
        append_row(results_dir / "runs.csv", row)
        return row
    events = events_frame(results)
    trace_path = results_dir / "traces" / f"{spec.run_id}.csv"
    write_trace(trace_path, events.to_dict("records"))
    losses = minibatch_losses(events, [mb.labelled_tokens for mb in spec.minibatches])
    row.update(summary(spec, events))
    row.update(status="ok", error="", peak_mem_mb=max(r["peak_bytes"] for r in results) / 2**20,
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
         "tokens_per_s", "bubble_rate", "peak_mem_mb", "wall_s", "loss_last")


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_row(row: dict) -> None:
    table = Table(title=f"run {row['run_id']} ({row['status']})", show_header=False)
    for col in SHOWN:
        table.add_row(col, _fmt(row.get(col)))
    Console().print(table)
    if row["status"] != "ok":
        Console(stderr=True).print(f"[red]run failed:[/red] {row['error']}")


def run_job(cfg: DictConfig) -> dict | None:
    try:
        spec = resolve(cfg)
        results_dir = Path(cfg.results_dir)
        if spec.run_id in completed_keys(results_dir / "runs.csv"):
            print(f"odc_bench: run {spec.run_id} already in {results_dir / 'runs.csv'}; skipped")
            return None
        row = execute(spec, results_dir)
    except ConfigError as e:
        fail_config(e)
    print_row(row)
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if row["status"] != "ok" and not multirun:
        sys.exit(1)
    return row


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_job(cfg)

