"""A small results root for the figure tests: runs.csv with traces, and primitives.csv.

Throughputs follow simple formulas so the tests know what every bar and point must show:
samples/s = 10 x SPEED[series] x (1 + minibatch_size / 10) x SWEEP_BONUS (ODC only, per varied factor).
Traces are synthetic but obey each engine's semantics: under collective every unit step is a
barrier across ranks; under ODC each rank runs its own microbatches and waits once at the sync.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from odc_bench.record.schema import COLUMNS, SCHEMA_VERSION
from tests.helpers import with_series

SERIES = [("collective", "local_sort"), ("collective", "lb_micro"), ("odc", "lb_micro"), ("odc", "lb_mini")]
SPEED = {("collective", "local_sort"): 0.9, ("collective", "lb_micro"): 1.0, ("odc", "local_sort"): 0.95,
         ("odc", "lb_micro"): 1.15,
         ("odc", "lb_mini"): 1.3}
SCALE = 1 / 64
GOLDEN = dict(dataset="longalign", model="tiny", world_size=2, minibatch_size=4, packing_ratio=1,
              length_scale=SCALE, max_tokens=1024)
# One-factor variations of the golden setting (the Fig. 10 sweeps), and the extra speed ODC gets there.
VARIATIONS = [
    (dict(packing_ratio=2, max_tokens=2048), 0.95),
    (dict(packing_ratio=4, max_tokens=4096), 0.9),
    (dict(world_size=4), 1.1),
    (dict(length_scale=2 * SCALE, max_tokens=2048), 1.05),
]
MINIBATCHES = [1, 2, 4]
DATASETS = {"longalign": 1024, "swe_smith": 2048}
UNITS = ["layer0", "layer1"]
NUM_MINIBATCHES, WARMUP = 3, 1
# Per-rank microbatch costs (seconds) of every minibatch in the golden traces: rank 0 got the long samples.
COSTS = {"collective": [[0.30, 0.10], [0.05, 0.04]], "odc": [[0.30], [0.12, 0.10, 0.08]]}
SYNC_GAP = 0.001

PRIM_SIZES = [4096 * 4**i for i in range(5)]
PRIM_WORLDS = [2, 4]
PRIM_BW = {("gather", "shm"): 8.0, ("scatter_accumulate", "shm"): 4.0, ("all_gather", "gloo"): 2.0,
           ("reduce_scatter", "gloo"): 1.0, ("memcpy", "local"): 10.0}


def samples_per_s(engine: str, balancer: str, minibatch_size: int, bonus: float = 1.0) -> float:
    return 10 * SPEED[(engine, balancer)] * (1 + minibatch_size / 10) * (bonus if engine == "odc" else 1.0)


def _row(engine: str, balancer: str, run_id: str, trace: str | None, bonus: float = 1.0, **setting) -> dict:
    row = {c: None for c in COLUMNS}
    row.update(run_id=run_id, schema_version=SCHEMA_VERSION, status="ok", backend="local", engine=engine,
               balancer=balancer,
               cost_model="linear", precision="fp32", seed=0, num_minibatches=NUM_MINIBATCHES,
               warmup_minibatches=WARMUP, trace=trace, **setting)
    row["samples_per_s"] = samples_per_s(engine, balancer, setting["minibatch_size"], bonus)
    row["tokens_per_s"] = 300 * row["samples_per_s"]
    row["bubble_rate"] = {"collective": 0.5, "odc": 0.2}[engine]
    row["predicted_bubble_rate"] = np.nan if balancer == "local_sort" else row["bubble_rate"] - 0.05
    row["peak_mem_mb"] = 100.0
    return row


def trace_events(engine: str) -> list[dict]:
    """Events of every minibatch: per-unit forward/backward spans, microbatch, sync, optimizer, minibatch."""
    costs = COSTS[engine]
    world = len(costs)
    events: list[dict] = []
    start = 100.0
    for mb in range(NUM_MINIBATCHES):
        clock = [start] * world
        steps = max(len(c) for c in costs)
        for m in range(steps):
            phases = [("fwd", u) for u in UNITS] + [("bwd", u) for u in reversed(UNITS)]
            mb_start = list(clock)
            for kind, unit in phases:
                if engine == "collective":  # a barrier before every unit step
                    clock = [max(clock)] * world
                for r in range(world):
                    if m < len(costs[r]):
                        d = costs[r][m] / len(phases)
                        events.append(dict(rank=r, minibatch=mb, microbatch=m, kind=kind, unit=unit,
                                           t0=clock[r], t1=clock[r] + d))
                        clock[r] += d
            for r in range(world):
                if m < len(costs[r]):
                    events.append(dict(rank=r, minibatch=mb, microbatch=m, kind="microbatch", unit="",
                                       t0=mb_start[r], t1=clock[r]))
        done = max(clock) + SYNC_GAP
        for r in range(world):
            events.append(dict(rank=r, minibatch=mb, microbatch=-1, kind="sync", unit="", t0=clock[r], t1=done))
            events.append(dict(rank=r, minibatch=mb, microbatch=-1, kind="optimizer", unit="", t0=done,
                               t1=done + 0.01))
            events.append(dict(rank=r, minibatch=mb, microbatch=-1, kind="minibatch", unit="", t0=start,
                               t1=done + 0.01))
        start = done + 0.02
    return events


# With `variants`: ODC + LB-Mini also planned with a second cost model at the golden setting (a
# variant of one series, traced; collective has no run under it), and ODC + LocalSort at the
# golden setting only (a series with one point of every sweep).
VARIANT_COST = "calibrated:tiny-cpu"


def write_runs(folder: Path, engines: tuple[str, ...] = ("collective", "odc"), backend: str = "local",
               variants: bool = False) -> pd.DataFrame:
    rows = []
    for engine, balancer in [s for s in SERIES if s[0] in engines]:
        for dataset, max_tokens in DATASETS.items():
            for mb in MINIBATCHES:
                setting = dict(GOLDEN, dataset=dataset, minibatch_size=mb, max_tokens=max_tokens)
                run_id = f"{engine}-{balancer}-{dataset}-{mb}"
                golden = setting == GOLDEN
                rows.append(_row(engine, balancer, run_id, f"traces/{run_id}.csv" if golden else None, **setting))
                if golden:
                    trace = pd.DataFrame(trace_events(engine))
                    (folder / "traces").mkdir(parents=True, exist_ok=True)
                    trace.to_csv(folder / "traces" / f"{run_id}.csv", index=False)
        for i, (change, bonus) in enumerate(VARIATIONS):
            rows.append(_row(engine, balancer, f"{engine}-{balancer}-var{i}", None, bonus, **(GOLDEN | change)))
    if variants:
        rows.append(_row("odc", "local_sort", "odc-local_sort-golden", None, **GOLDEN))
        run_id = f"odc-lb_mini-{VARIANT_COST}"  # sorts before the linear run: picked first by name alone
        rows.append(_row("odc", "lb_mini", run_id, f"traces/{run_id}.csv", **GOLDEN) | {"cost_model": VARIANT_COST})
        pd.DataFrame(trace_events("odc")).to_csv(folder / "traces" / f"{run_id}.csv", index=False)
    table = pd.DataFrame([with_series(r | {"backend": backend}) for r in rows], columns=COLUMNS)
    folder.mkdir(parents=True, exist_ok=True)
    table.to_csv(folder / "runs.csv", index=False)
    return table


def write_primitives(folder: Path) -> pd.DataFrame:
    rows = []
    for (op, transport), bw in PRIM_BW.items():
        for world in [1] if op == "memcpy" else PRIM_WORLDS:
            for size in PRIM_SIZES:
                rows.append(dict(run_id="p", timestamp="", commit="", host="test", op=op, transport=transport,
                                 world_size=world, size_bytes=size, dtype="float32", iterations=10,
                                 seconds=size / (bw * 1e9), bandwidth_gbps=bw, memcpy_gbps=PRIM_BW[("memcpy", "local")],
                                 ratio_to_memcpy=bw / PRIM_BW[("memcpy", "local")]))
    table = pd.DataFrame(rows)
    folder.mkdir(parents=True, exist_ok=True)
    table.to_csv(folder / "primitives.csv", index=False)
    return table


# ---- stale-synchronous ODC's convergence runs (paper_figures/staleness.py) ----------------

STALENESS_STEPS = 120
# series -> (engine, balancer, staleness, loss decay per step, seconds per step)
STALENESS_SERIES = {
    "Collective + LB-Micro": ("collective", "lb_micro", None, 0.02, 0.30),
    "ODC s=0 + LB-Carry": ("odc", "lb_carry", 0, 0.02, 0.20),
    "ODC s=1 + LB-Carry": ("odc", "lb_carry", 1, 0.018, 0.16),
    "ODC s=2 + LB-Carry": ("odc", "lb_carry", 2, 0.015, 0.15),
}
STALENESS_LABELLED = 1000  # labelled tokens per minibatch: 2 ranks x 2 microbatches of 255 tokens and 5 samples


def staleness_loss(decay: float, k: int) -> float:
    return 1.0 + 6.0 * math.exp(-decay * k)


def staleness_trace(decay: float, seconds: float) -> pd.DataFrame:
    events = []
    for k in range(STALENESS_STEPS):
        t0, t1 = 10.0 + k * seconds, 10.0 + (k + 1) * seconds
        for r in range(2):
            for j in range(2):
                events.append(dict(rank=r, minibatch=k, microbatch=j, kind="microbatch", t0=t0, t1=t1, tokens=255,
                                   samples=5))
            # Rank 1 leaves each minibatch a little later: a minibatch's time is the last rank's.
            events.append(dict(rank=r, minibatch=k, microbatch=-1, kind="minibatch", t0=t0, t1=t1 + 0.01 * r,
                               loss_sum=staleness_loss(decay, k) * STALENESS_LABELLED / 2))
    return pd.DataFrame(events)


def write_staleness_runs(folder: Path, sets: int = 1, slower: dict[str, tuple[float, ...]] | None = None,
                         incomplete: tuple[str, ...] = ()) -> None:
    """Runs of sweep=ssp_convergence whose loss curves and clocks are known (paper_figures/staleness.py):
    `sets` side-by-side sets (attempt j of each series' run key), a series' seconds per step
    multiplied by slower[series][j] in set j, and one more run of the `incomplete` series alone."""
    (folder / "traces").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (label, (engine, balancer, s, decay, seconds)) in enumerate(STALENESS_SERIES.items()):
        engine_cfg = {"name": engine} if s is None else {"name": engine, "staleness": s}
        for j in range(sets + (label in incomplete)):
            factor = (slower or {}).get(label, (1.0,) * (sets + 1))[j]
            row = {c: None for c in COLUMNS}
            row.update(run_id=f"r{i}", attempt=j, schema_version=SCHEMA_VERSION, status="ok", backend="local",
                       engine=engine,
                       balancer=balancer, cost_model="calibrated:tiny-cpu", precision="fp32", bubble_rate=0.2,
                       tokens_per_s=100.0, model="tiny", dataset="pareto", world_size=2, minibatch_size=4,
                       max_tokens=2048, packing_ratio=1, length_scale=1 / 64, num_minibatches=STALENESS_STEPS,
                       warmup_minibatches=2, seed=0, samples_per_s=1.0, trace=f"traces/r{i}-{j}.csv",
                       config=yaml.safe_dump({"engine": engine_cfg, "dataset": {"tokens": "learnable"}}))
            rows.append(row)
            staleness_trace(decay, seconds * factor).to_csv(folder / "traces" / f"r{i}-{j}.csv", index=False)
    # A short learnable run and a synthetic-token run: neither is drawn.
    odc = next(row for row in rows if row["run_id"] == "r1")
    short = dict(odc, run_id="short", num_minibatches=10)
    synthetic = dict(odc, run_id="syn", config=yaml.safe_dump({"engine": {"name": "odc"},
                                                                "dataset": {"tokens": "synthetic"}}))
    pd.DataFrame([with_series(r) for r in (*rows, short, synthetic)], columns=COLUMNS).to_csv(
        folder / "runs.csv", index=False)


def results_root(root: Path, engines: tuple[str, ...] = ("collective", "odc"), primitives: bool = True,
                 backend: str = "local", variants: bool = False) -> Path:
    write_runs(root / ("sim" if backend == "sim" else "cpu"), engines, backend, variants)
    if primitives:
        write_primitives(root / "primitives")
    return root
