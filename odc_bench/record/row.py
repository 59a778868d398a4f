"""A run's results row: what ran (its config, where and when) and what it measured.

The columns are the results table's schema (results/README.md defines each); the full
resolved config rides along as YAML, so a row says exactly what ran.
"""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Any

import pandas as pd
import yaml

from odc_bench.config.backend import GpuHardwareConfig, SimBackendConfig
from odc_bench.config.fields import require
from odc_bench.config.run import RunConfig
from odc_bench.models.flops import train_flops
from odc_bench.plan.spec import RunSpec
from odc_bench.provenance import git_commit
from odc_bench.record.metrics import minibatch_losses, summarize, summary
from odc_bench.record.schema import SCHEMA_VERSION
from odc_bench.sim import Simulation

MB = 2**20


def series_columns(config: RunConfig) -> dict[str, Any]:
    """What tells a run's series apart beyond engine and balancer (results/series.py reads these,
    never the config text): the value of the option the engine's record names for it (FSDP2's
    process group, ODC's staleness), the shard layout, where an on-demand engine fetches remote
    shards from (its owners, or the simulator's nearest holder), and the staleness."""
    record = config.engine.spec
    options = config.engine.options
    on_demand = record.simulated_as == "odc"
    fetch = (config.backend.odc_fetch if isinstance(config.backend, SimBackendConfig) else "owner") if on_demand else ""
    return dict(variant=str(getattr(options, record.series_option)) if record.series_option else "",
                shard=options.shard, fetch=fetch, staleness=config.engine.staleness)


def base_row(spec: RunSpec) -> dict[str, Any]:
    """What every row of the run says, whatever its outcome."""
    c = spec.config
    return dict(
        run_id=spec.run_id, schema_version=SCHEMA_VERSION, timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"),
        commit=git_commit(), host=socket.gethostname(), backend=c.backend.name, engine=c.engine.name,
        balancer=c.balancer.name, **series_columns(c), cost_model=spec.cost_model.label, model=c.model.name,
        dataset=c.dataset.name,
        world_size=c.world_size, minibatch_size=c.minibatch_size, num_minibatches=c.num_minibatches,
        warmup_minibatches=c.warmup_minibatches, max_tokens=spec.max_tokens, packing_ratio=c.packing_ratio,
        length_scale=c.dataset.length_scale, precision=c.precision, seed=c.seed,
        predicted_bubble_rate=spec.predicted_bubble_rate(), **spec.length_stats(),
        mem_estimate_mb=spec.memory.total / MB, resumed_from=0, mfu=None,
        requeues=int(os.environ.get("SLURM_RESTART_COUNT") or 0),
        mem_limit_mb=spec.memory_limit / MB if spec.memory_limit is not None else None,
        config=yaml.safe_dump(c.to_dict(), sort_keys=False).strip(),
    )


def _measured_work(spec: RunSpec, first: int) -> dict[str, int]:
    measured = spec.minibatches[first:]
    return dict(samples=sum(len(mb.lengths) for mb in measured), tokens=sum(sum(mb.lengths) for mb in measured))


def timing(spec: RunSpec, events: pd.DataFrame, resumed_from: int = 0) -> dict[str, float]:
    """The row's timing columns from a trace, real or simulated alike: over the minibatches after
    the warm-up, or (a run resumed later than that) after the minibatch it resumed from."""
    first = max(spec.config.warmup_minibatches, resumed_from)
    return summarize(events, spec.world_size, first, **_measured_work(spec, first))


def sim_timing(spec: RunSpec, sim: Simulation) -> dict[str, float]:
    """The same columns from a simulated timeline, without building its trace."""
    warmup = spec.config.warmup_minibatches
    totals = sim.totals(warmup)
    # Only a profile of unbounded rates and no latency gets here (it was a ZeroDivisionError).
    require(totals["wall_s"] > 0, "the simulated minibatches take no time (backend.hardware's rates too high to "
                                  "count and every latency 0 s); give it a real device's figures")
    return summary(totals, spec.world_size, **_measured_work(spec, warmup))


def failed_row(spec: RunSpec, error: str) -> dict[str, Any]:
    return {**base_row(spec), "status": "failed", "error": error}


def run_row(spec: RunSpec, rank_results: list[dict], events: pd.DataFrame, trace: str) -> dict[str, Any]:
    """The row of a real run that finished: timing, memory and the loss curve's ends."""
    losses = minibatch_losses(events, [mb.labelled_tokens for mb in spec.minibatches])
    resumed_from = rank_results[0].get("resumed_from", 0)
    return {**base_row(spec), **timing(spec, events, resumed_from), "status": "ok", "error": "",
            "attention": ",".join(sorted({k for r in rank_results for k in r.get("attention", "").split(",") if k})),
            "resumed_from": resumed_from,
            "peak_mem_mb": max(r["peak_bytes"] + r["heap_bytes"] for r in rank_results) / MB,
            "heap_mb": max(r["heap_bytes"] for r in rank_results) / MB,
            "loss_first": losses[0], "loss_last": losses[-1], "trace": trace}


def diverged(row: dict[str, Any]) -> str | None:
    """A note where a real run's training loss ended as NaN or infinity (a learning rate too
    high): the row is kept, its times being of the work the run did, but a table read for its
    losses (a convergence study) would otherwise show it among the others without a word."""
    last = row.get("loss_last")
    if row.get("status") != "ok" or last is None or math.isfinite(last):
        return None
    return (f"run {row['run_id']}'s training loss is {last} at its last minibatch ({row['loss_first']:.4g} at its "
            f"first): the model diverged (a lower optim.lr trains it); the row is kept, its times those of the work "
            f"the run did")


def sim_row(spec: RunSpec, sim: Simulation, trace: str) -> dict[str, Any]:
    """The simulator's row: the same columns; no losses or measured memory, which it does not
    model (the estimate, mem_estimate_mb, is every row's)."""
    times = sim_timing(spec, sim)
    return {**base_row(spec), **times, "mfu": mfu(spec, spec.config.warmup_minibatches, times["wall_s"]),
            "status": "ok", "error": "", "trace": trace}


def mfu(spec: RunSpec, first: int, wall_s: float) -> float | None:
    """Model FLOPs utilisation over the measured window: the model's training FLOPs for the
    samples measured (models/flops.py: three times the forward, attention causal and per
    document, recomputation not counted) over wall seconds x ranks x the device's peak. Only a
    simulated GPU has a stated peak; elsewhere None."""
    backend = spec.config.backend
    if not isinstance(backend, SimBackendConfig) or not isinstance(backend.hardware, GpuHardwareConfig):
        return None
    lengths = [n for mb in spec.minibatches[first:] for n in mb.lengths]
    peak = backend.hardware.peak_tflops * 1e12
    return train_flops(spec.config.model, lengths) / (wall_s * spec.world_size * peak) if wall_s > 0 else None
