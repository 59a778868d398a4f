"""Fit the simulator's CPU profile from real runs on this machine.

`python -m odc_bench.calibrate.cpu_profile [OVERRIDES] [--engines collective odc]` runs a few real
jobs per engine (LongAlign and SWE-smith length profiles, so documents span a wide range of
lengths), then fits from their traces and writes results/calibration/sim-<model>-cpu.json:

- compute: per unit kind (embed, layer, head) and direction, seconds = c0 + c_tok * tokens +
  c_sq * sum of squared document lengths + one term per knot, h_k * sum max(0, len - k)^2
  (layout.doc_features; least squares, coefficients kept non-negative), one fit over every
  run of every engine: the same unit on the same core costs the same whichever engine runs
  it (measured: the two engines' layer times per length bin agree within the runs' noise),
  and fitting each engine on its own runs only adds each engine's drift to the predicted
  odc/collective ratio (refitting one validation's real runs: 1 of 6 configs within 5% with
  per-engine fits, 5 of 6 with one; docs/simulator.md);
- per engine, the serial gap before each kind of position and after a microbatch's last
  position (tail), each as seconds + seconds per token of the microbatch (least squares; the
  gaps grow with the microbatch's size), the mean gap before a microbatch's first position
  (prep), the sync's own cost, and the optimizer's seconds per owned parameter.

Gaps are defined so that the simulator's recurrences reproduce the calibration traces:
collective (a barrier per position): gap = rise of the latest end over ranks minus the
largest compute, against the most tokens over ranks; ODC (ranks independent): gap = a
rank's start minus its previous end, against its own tokens.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd

from odc_bench.config.compose import COMPOSE_ERRORS, compose_run, hydra_error_line, string_override
from odc_bench.config.engine import ENGINES
from odc_bench.errors import CommandParser, ConfigError, command_name, ends_cleanly, fail
from odc_bench.files import atomic_write_text, writable_file, writable_folder
from odc_bench.jobs.train import execute
from odc_bench.plan.spec import RunSpec, resolve
from odc_bench.provenance import REPO_ROOT, host_fingerprint
from odc_bench.run.worker import threads_per_rank
from odc_bench.sim.hardware import GAP_CLASSES, unit_shape
from odc_bench.sim.layout import KINDS, PHASES, Layout, doc_features

DEFAULT_RUNS = (("dataset=longalign",), ("dataset=swe_smith",))
SIM_ENGINES = [name for name, spec in ENGINES.items() if spec.simulated_as is not None]


# Knots of the compute fit (layout.doc_features) at these quantiles of the calibration runs'
# document lengths: where the data are dense enough to pin each extra slope down.
KNOT_QUANTILES = (0.5, 0.75, 0.9)


def choose_knots(specs: list[RunSpec]) -> list[float]:
    lengths = [n for spec in specs for mb in spec.minibatches for n in mb.lengths]
    return sorted({float(round(q)) for q in np.quantile(lengths, KNOT_QUANTILES)})


def unit_frame(spec: RunSpec, events: pd.DataFrame, layout: Layout, knots: tuple[float, ...] = ()) -> pd.DataFrame:
    """Measured fwd/bwd spans with their microbatch's compute features (columns f0, f1, ...:
    layout.doc_features), its tokens and position index."""
    warmup = spec.config.warmup_minibatches
    units = events[events["kind"].isin(PHASES) & (events["minibatch"] >= warmup)].copy()
    feats = {}
    for k, mb in enumerate(spec.minibatches):
        for r, rank in enumerate(mb.plan):
            for j, micro in enumerate(rank):
                feats[(r, k, j)] = doc_features([mb.lengths[i] for i in micro], knots)
    key = list(zip(units["rank"], units["minibatch"], units["microbatch"], strict=True))
    f = np.array([feats[x] for x in key]).reshape(len(key), 3 + len(knots))
    for i in range(f.shape[1]):
        units[f"f{i}"] = f[:, i]
    units["tokens"] = f[:, 1]
    names = {n: i for i, n in enumerate(layout.unit_names)}
    u = units["unit"].map(names).to_numpy()
    phase = (units["kind"] == "bwd").to_numpy()
    units["pos"] = np.where(phase, 2 * layout.units - 1 - u, u)
    units["cost"] = layout.unit_kind[u] * 2 + phase
    units["dur"] = units["t1"] - units["t0"]
    units["run"] = spec.run_id
    return units


def nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0: refit without the columns that came out negative.

    Columns are scaled to a common size first (a constant, token counts and squared lengths
    differ by orders of magnitude), so no column's solution is lost to rounding."""
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    keep = np.ones(x.shape[1], dtype=bool)
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(xs[:, keep], y, rcond=None)[0]
        if (coef >= 0).all():
            return coef / scale
        keep &= coef > 0


def fit_compute(units: pd.DataFrame) -> dict:
    cols = sorted((c for c in units.columns if c[0] == "f" and c[1:].isdigit()), key=lambda c: int(c[1:]))
    out: dict[str, dict[str, list[float]]] = {k: {} for k in KINDS}
    for i, (kind, phase) in enumerate((k, p) for k in KINDS for p in PHASES):
        rows = units[units["cost"] == i]
        if rows.empty:  # the embeddings' backward: never traced, part of the tail gap
            out[kind][phase] = [0.0] * len(cols)
            continue
        # Average the layers of one microbatch first: the same work, measured several times.
        g = rows.groupby(["run", "rank", "minibatch", "microbatch"]).agg(
            dur=("dur", "mean"), **{c: (c, "first") for c in cols})
        out[kind][phase] = [float(c) for c in nonneg_lstsq(g[cols].to_numpy(float), g["dur"].to_numpy())]
    return out


def position_class(layout: Layout) -> np.ndarray:
    """GAP_CLASSES index of every traced position."""
    U, L = layout.units, layout.cfg.num_layers
    cls = np.empty(layout.positions - 1, dtype=int)
    cls[0], cls[1:1 + L], cls[U - 1] = 0, 1, 2
    cls[U], cls[U + 1:2 * U - 1] = 3, 4
    return cls


def fit_gaps(engine: str, spec: RunSpec, events: pd.DataFrame, layout: Layout) -> tuple[dict, dict]:
    """Per gap class, (tokens, gap) samples; plus the sync cost and optimizer time of one run."""
    units = unit_frame(spec, events, layout)
    warmup = spec.config.warmup_minibatches
    ev = events[events["minibatch"] >= warmup]
    micro = ev[ev["kind"] == "microbatch"].set_index(["rank", "minibatch", "microbatch"]).sort_index()
    P1 = layout.positions - 1
    start = units.pivot_table(index=["minibatch", "microbatch", "pos"], columns="rank", values="t0")
    end = units.pivot_table(index=["minibatch", "microbatch", "pos"], columns="rank", values="t1")
    cls = position_class(layout)
    samples: dict[int, list[tuple[float, float]]] = {c: [] for c in range(len(GAP_CLASSES))}
    for (m, j), s in start.groupby(level=[0, 1]):
        s = s.droplevel([0, 1]).reindex(range(P1))
        e = end.loc[(m, j)].reindex(range(P1))
        mb = micro.xs((m, j), level=[1, 2]).reindex(s.columns)
        if engine == "collective":
            most = float(mb["tokens"].max())
            latest = np.concatenate([[mb["t0"].max()], e.max(axis=1).to_numpy()])
            step = np.diff(latest) - (e - s).max(axis=1).to_numpy()
            for p in range(P1):
                samples[cls[p]].append((most, step[p]))
            samples[5].append((most, mb["t1"].mean() - latest[-1]))
        else:
            step = s.to_numpy() - np.vstack([mb["t0"].to_numpy(), e.to_numpy()[:-1]])
            own = mb["tokens"].to_numpy()
            for p in range(P1):
                samples[cls[p]].extend(zip(own, step[p], strict=True))
            samples[5].extend(zip(own, mb["t1"].to_numpy() - e.to_numpy()[-1], strict=True))
    preps = [d for _, g in micro.groupby(level=[0, 1]) for d in g["t0"].to_numpy()[1:] - g["t1"].to_numpy()[:-1]]
    sync = ev[ev["kind"] == "sync"].assign(d=lambda x: x["t1"] - x["t0"]).groupby("minibatch")["d"].min()
    opt = ev[ev["kind"] == "optimizer"].assign(d=lambda x: x["t1"] - x["t0"])["d"]
    params = float(layout.unit_params.sum()) / spec.world_size
    scalars = dict(prep=preps, sync=list(sync), optimizer_per_param=list(opt / params))
    return samples, scalars


def fit_engine(pairs: list[tuple[RunSpec, pd.DataFrame]], engine: str, layout: Layout) -> dict:
    """Gap = a + b x tokens per class (least squares over every run's samples, a, b >= 0)."""
    samples: dict[int, list] = {c: [] for c in range(len(GAP_CLASSES))}
    scalars: dict[str, list] = {}
    for spec, events in pairs:
        s, sc = fit_gaps(engine, spec, events, layout)
        for c in samples:
            samples[c] += s[c]
        for k, v in sc.items():
            scalars.setdefault(k, []).extend(v)
    out: dict[str, list[float] | float] = {}
    for c, name in enumerate(GAP_CLASSES):
        xy = np.array(samples[c], dtype=float).reshape(-1, 2)
        xy = xy[~np.isnan(xy).any(axis=1)]
        coef = nonneg_lstsq(np.column_stack([np.ones(len(xy)), xy[:, 0]]), xy[:, 1]) if len(xy) else np.zeros(2)
        out[name] = [float(coef[0]), float(coef[1])]
    out.update({k: float(np.mean(v)) if v else 0.0 for k, v in scalars.items()})
    return out


def fit(runs: dict[str, list[tuple[RunSpec, pd.DataFrame]]]) -> dict:
    """Calibration data from real runs: {engine: [(spec, events), ...]} of one model and world size."""
    first = next(iter(runs.values()))[0][0]
    layout = Layout(first.config.model)
    knots = tuple(choose_knots([spec for pairs in runs.values() for spec, _ in pairs]))
    units = pd.concat([unit_frame(spec, ev, layout, knots) for pairs in runs.values() for spec, ev in pairs])
    engines = {engine: fit_engine(pairs, engine, layout) for engine, pairs in runs.items()}
    c = first.config
    return dict(version=2, model=c.model.name, shape=unit_shape(c.model), world_size=first.world_size,
                precision=c.precision, compiled=c.compiles("cpu"),
                threads_per_rank=c.threads_per_rank,
                threads=threads_per_rank(first, first.world_size, first.world_size),
                host=socket.gethostname(), fingerprint=host_fingerprint(),
                date=time.strftime("%Y-%m-%d"), knots=list(knots), compute=fit_compute(units), engines=engines,
                runs={e: [spec.run_id for spec, _ in pairs] for e, pairs in runs.items()})


def calibration_path(model: str) -> Path:
    return REPO_ROOT / "results" / "calibration" / f"sim-{model}-cpu.json"


def run_real(overrides: list[str], results_dir: Path) -> tuple[RunSpec, pd.DataFrame]:
    """One real job; returns its spec and trace."""
    spec = resolve(compose_run([*overrides, "backend=local", string_override("results_dir", results_dir)]))
    row = execute(spec, results_dir)
    if row is None or row["status"] != "ok":
        raise RuntimeError(f"calibration run failed: {row['error'] if row else 'no row'}")
    return spec, pd.read_csv(results_dir / row["trace"])


def main(argv: list[str] | None = None) -> None:
    ap = CommandParser(command_name(__spec__.name), description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", nargs="+", default=["collective"], choices=SIM_ENGINES,
                    help="put Hydra overrides before this option: it takes every word after it")
    ap.add_argument("--results-dir", type=writable_folder, default=REPO_ROOT / "results" / "local" / "calibration",
                    help="where the calibration runs' rows go")
    ap.add_argument("--out", type=writable_file, default=None, help="default: results/calibration/sim-<model>-cpu.json")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every calibration run, e.g. model=tiny")
    args = ap.parse_args(argv)
    args.engines = list(dict.fromkeys(args.engines))  # an engine named twice is calibrated once
    base = ["num_minibatches=10", "warmup_minibatches=2", *args.overrides]
    try:  # the overrides checked before the first run, not in its traceback
        composed = compose_run(base)
    except COMPOSE_ERRORS as e:
        fail(ConfigError(hydra_error_line(e)), ap.prog)
    except ConfigError as e:  # a value the config refuses (world_size=-1): it was a traceback
        fail(e, ap.prog)
    if composed.device == "cuda":
        fail(ConfigError("the CPU profile is fitted on this machine's CPU ranks (backend/hardware=cpu simulates them): "
                         "drop device=cuda; a GPU cluster's profile comes from its runs (python -m "
                         "odc_bench.calibrate.cluster_profile, docs/calibrate.md)"), ap.prog)
    base.append("device=cpu")  # device=auto would time a GPU on a machine that has one
    if composed.backend.recompute:
        fail(ConfigError("the CPU profile is fitted on runs without activation checkpointing, which the simulator "
                         "adds to it (backend.recompute in a simulated run): drop backend.recompute=true"), ap.prog)
    runs: dict[str, list] = {}
    for extra in DEFAULT_RUNS:
        for engine in args.engines:  # engines interleaved, so both see the same machine load
            runs.setdefault(engine, []).append(run_real([*base, *extra, f"engine={engine}"], args.results_dir))
    data = fit(runs)
    out = args.out or calibration_path(data["model"])
    atomic_write_text(out, json.dumps(data, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
