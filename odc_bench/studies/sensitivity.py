"""The simulator's gap to the paper at its 14B LongAlign cell, measured: how the collective bubble
and ODC's speedups move with the length distribution, the packing limit and the cost model.

    python -m odc_bench.studies.sensitivity run     # every point, 5 seeds -> results/sensitivity/points.csv
    python -m odc_bench.studies.sensitivity table   # docs/sensitivity.md from those rows

The cell is the paper's (Qwen2 14B, LongAlign, 16 devices, 4 samples per device, packing ratio
1) at the sweeps' settings (sim_paper: A100 profile, bf16, recomputation, 50 minibatches, 2 of
them warm-up). Each point of the study draws a length pool from a profile (data/profiles.py's
LengthProfile, mean always 16.5K) and simulates the three series the paper compares there on
it: Collective + LB-Micro, ODC + LB-Mini and ODC + LB-Micro, LB-Micro being this harness's
(balancers/lb_micro.py) or the reference's own (DynamicSameMicro: balancers/verl.py with the run's
cost model and refinement) for both engines. Seeds draw
different pools and minibatches; the table gives their mean and range. Studies:

- one factor at a time around the profile the simulator used before this study (log-normal,
  sigma 0.6, [1K, 64K]): tail weight (sigma), the minimum length, a mass near the maximum,
  the packing limit, the cost model the balancers plan with, the simulated cost of attention
  (the A100 profile's attention efficiency), and LB-Micro's implementation;
- profiles consistent with every published fact (docs/length_facts.md: mean 16.5K, maximum 64K,
  LongAlign's floor near 8K), at the 14B cell and at the golden 1.5B cell (8 devices), ranked by
  their distance to the paper's numbers;
- Fig. 10's max-length axis (the golden cell, every length scaled) for the profile before and
  the profile adopted (PROFILES["longalign"]).

`run` appends after every point and skips points already in the file, so it resumes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from odc_bench.config.backend import GpuHardwareConfig, SimBackendConfig
from odc_bench.config.balancer import CostModelName, QuadraticFit
from odc_bench.config.compose import compose_run
from odc_bench.config.run import RunConfig
from odc_bench.data.profiles import PROFILES, LengthProfile
from odc_bench.errors import CommandParser, command_name, ends_cleanly, positive_int, said
from odc_bench.files import atomic_write_text, writable_file
from odc_bench.plan.spec import Planner
from odc_bench.provenance import REPO_ROOT
from odc_bench.record.row import sim_timing
from odc_bench.results.paper import CELL_14B, SFT_SPEEDUP
from odc_bench.results.series import HEADLINE_BASELINE, HEADLINE_ODC, ODC_LB_MICRO, comparison_key
from odc_bench.results.table import some_of
from odc_bench.sim import simulate
from odc_bench.studies.pages import render
from odc_bench.studies.paper import PAPER_SETTINGS

ROWS = REPO_ROOT / "results" / "sensitivity" / "points.csv"
DOCS = REPO_ROOT / "docs" / "sensitivity.md"
SEEDS = 5
MINIBATCHES, WARMUP = 50, 2
K = 1024


@dataclass(frozen=True)
class Cell:
    model: str
    world_size: int
    minibatch_size: int = 4

    @property
    def name(self) -> str:
        return f"{self.model} x {self.world_size}"


CELL = Cell("qwen2_14b", 16)
GOLDEN = Cell("qwen2_1p5b", 8)
# The LongAlign profile before this study: a log-normal fitted to the published mean and maximum
# with an assumed spread and a floor at 1K.
BEFORE = LengthProfile("longalign", mean=16_500, sigma=0.60, min_len=1_024, max_len=65_536, num_samples=10_000)
# Series at the cell: (label, engine, balancer). "collective" is the baseline every speedup is over.
SERIES = (("collective", *HEADLINE_BASELINE), ("odc_lb_mini", *HEADLINE_ODC), ("odc_lb_micro", *ODC_LB_MICRO))
# The reference's LB-Micro (DynamicSameMicro), as balancers/verl.py reproduces it.
REFERENCE_LB_MICRO = {"workload": "cost", "refine": True}


@dataclass(frozen=True)
class Point:
    study: str
    label: str
    profile: LengthProfile
    cell: Cell = CELL
    packing_ratio: float = 1.0
    length_scale: float = 1.0
    cost_model: CostModelName = "quadratic"
    quadratic_fit: QuadraticFit = "1p5b"
    attention_efficiency: float | None = None  # None: the A100 profile's own
    lb_micro: str = "ours"  # or "reference": the reference's DynamicSameMicro, for both engines

    def key(self) -> str:
        fields = {k: v for k, v in asdict(self).items() if k not in ("study", "label")}
        return json.dumps(fields, sort_keys=True, default=str)


def _profile(sigma: float = 0.60, floor: int = 1 * K, peak: float = 0.0, name: str = "longalign") -> LengthProfile:
    return LengthProfile(name, mean=16_500, sigma=sigma, min_len=floor, max_len=64 * K, num_samples=10_000,
                         peak_fraction=peak, peak_from=56 * K if peak else None)


def one_factor_points() -> list[Point]:
    study = "one factor"
    points = [Point(study, "before this study", BEFORE)]
    points += [Point(study, f"sigma={s:g}", replace(BEFORE, sigma=s)) for s in (0.3, 0.45, 0.8, 1.0)]
    points += [Point(study, f"floor={f // K}K", replace(BEFORE, min_len=f)) for f in (4 * K, 6 * K, 8 * K)]
    points += [Point(study, f"{p:.0%} in 56-64K", replace(BEFORE, peak_fraction=p, peak_from=56 * K))
               for p in (0.01, 0.02, 0.04)]
    points += [Point(study, f"packing ratio {r:g}", BEFORE, packing_ratio=r) for r in (1.25, 1.5, 2.0)]
    points += [Point(study, "plan with linear", BEFORE, cost_model="linear"),
               Point(study, "plan with quadratic 7B fit", BEFORE, quadratic_fit="7b"),
               Point(study, "plan with the model's FLOPs", BEFORE, cost_model="flops")]
    points += [Point(study, f"attention efficiency {a:g}", BEFORE, attention_efficiency=a) for a in (0.3, 0.6, 0.8)]
    points += [Point(study, "the reference's LB-Micro", BEFORE, lb_micro="reference"),
               Point(study, "floor=8K and the reference's LB-Micro", replace(BEFORE, min_len=8 * K),
                     lb_micro="reference")]
    return points


def candidate_profiles() -> list[LengthProfile]:
    """Profiles consistent with the published facts: mean 16.5K, maximum 64K, a floor near 8K."""
    return [_profile(sigma, floor, peak) for floor in (6 * K, 7 * K, 8 * K) for sigma in (0.45, 0.6, 0.8, 1.0)
            for peak in (0.0, 0.01)]


def describe(profile: LengthProfile) -> str:
    text = f"log-normal sigma {profile.sigma:g} on [{profile.min_len // K}K, {profile.max_len // K}K]"
    if profile.peak_fraction:
        text += f" + {profile.peak_fraction:.0%} in [{(profile.peak_from or profile.max_len) // K}K, " \
                f"{profile.max_len // K}K]"
    return text


def candidate_points() -> list[Point]:
    return [Point("candidates", describe(p), p, cell) for p in candidate_profiles() for cell in (CELL, GOLDEN)]


def max_length_points() -> list[Point]:
    profiles = {"before this study": BEFORE, "adopted": PROFILES["longalign"]}
    return [Point("max length", f"{name}, {int(64 * s)}K", prof, GOLDEN, length_scale=s)
            for name, prof in profiles.items() for s in (0.125, 0.25, 0.5, 1.0, 2.0)]


def study_points() -> list[Point]:
    return one_factor_points() + candidate_points() + max_length_points()


@cache
def _base(model: str, world: int, mb: int, engine: str, balancer: str) -> RunConfig:
    return compose_run([*PAPER_SETTINGS, f"model={model}", f"world_size={world}", f"minibatch_size={mb}",
                        "dataset=longalign", "dataset.length_scale=1", f"engine={engine}", f"balancer={balancer}"])


def point_config(point: Point, engine: str, balancer: str, seed: int, minibatches: int, warmup: int) -> RunConfig:
    """The run config of one series at a point: the cell's, with the point's knobs turned."""
    if balancer == "lb_micro" and point.lb_micro == "reference":
        balancer = "verl"
    base = _base(point.cell.model, point.cell.world_size, point.cell.minibatch_size, engine, balancer)
    options = REFERENCE_LB_MICRO if balancer == "verl" else base.balancer.options
    backend = base.backend
    assert isinstance(backend, SimBackendConfig) and isinstance(backend.hardware, GpuHardwareConfig)
    hardware = backend.hardware
    if point.attention_efficiency is not None:
        hardware = replace(hardware, attention_efficiency=point.attention_efficiency)
    max_len = max(2, round(point.profile.max_len * point.length_scale))
    return replace(base, seed=seed, num_minibatches=minibatches, warmup_minibatches=warmup,
                   packing_ratio=point.packing_ratio, max_tokens=int(max_len * point.packing_ratio),
                   dataset=replace(base.dataset, length_scale=point.length_scale),
                   balancer=replace(base.balancer, cost_model=point.cost_model, quadratic_fit=point.quadratic_fit,
                                    options=dict(options)),
                   backend=replace(backend, hardware=hardware))


def pool(point: Point, seed: int) -> np.ndarray:
    """The point's length pool for a seed, as profile_lengths draws a profile's."""
    raw = point.profile.sample(point.profile.num_samples, np.random.default_rng(seed))
    return np.maximum(2, np.rint(raw * point.length_scale)).astype(np.int64)


def run_point(point: Point, seed: int, minibatches: int = MINIBATCHES, warmup: int = WARMUP) -> dict:
    """One row: the point, the pool's shape and every series' samples/s and bubble rates."""
    lengths = pool(point, seed)
    top = point.profile.max_len * point.length_scale
    row = {"study": point.study, "label": point.label, "key": point.key(), "cell": point.cell.name, "seed": seed,
           "len_mean": float(lengths.mean()), "len_p50": float(np.median(lengths)),
           "share_over_half_max": float((lengths > top / 2).mean()),
           "share_top_eighth": float((lengths >= top * 7 / 8).mean())}
    planner = Planner()  # series with the same balancer plan the same minibatches
    for label, engine, balancer in SERIES:
        spec = planner.resolve(point_config(point, engine, balancer, seed, minibatches, warmup), lengths=lengths)
        result = sim_timing(spec, simulate(spec, trace=False))
        row[f"{label}_samples_per_s"] = result["samples_per_s"]
        row[f"{label}_bubble"] = result["bubble_rate"]
        row[f"{label}_predicted_bubble"] = spec.predicted_bubble_rate()
    return row


def run(points: Sequence[Point], path: Path, seeds: Iterable[int] = range(SEEDS), minibatches: int = MINIBATCHES,
        warmup: int = WARMUP, echo: bool = True) -> pd.DataFrame:
    """Every (point, seed) not yet in `path`, appended after each point; the whole table."""
    table = pd.read_csv(path) if path.exists() else pd.DataFrame()
    done = set(zip(table["key"], table["seed"], strict=True)) if not table.empty else set()
    for point in points:
        rows = [run_point(point, s, minibatches, warmup) for s in seeds if (point.key(), s) not in done]
        if not rows:
            continue
        table = pd.concat([table, pd.DataFrame(rows)], ignore_index=True)
        done |= {(point.key(), r["seed"]) for r in rows}
        buf = io.StringIO()
        table.to_csv(buf, index=False)
        atomic_write_text(path, buf.getvalue())
        if echo:
            last = pd.DataFrame(rows)
            print(f"{point.study:11s} {point.cell.name:16s} {point.label:48s} collective bubble "
                  f"{last['collective_bubble'].mean():.0%}, LB-Mini speedup "
                  f"{(last['odc_lb_mini_samples_per_s'] / last['collective_samples_per_s']).mean() - 1:+.1%}",
                  flush=True)
    return table


# --- the table -----------------------------------------------------------------------------------------------

def derived(table: pd.DataFrame) -> pd.DataFrame:
    """Speedups over the collective baseline and bubbles as idle over busy time, per row."""
    t = table.copy()
    for s in ("odc_lb_mini", "odc_lb_micro"):
        t[f"{s}_speedup"] = t[f"{s}_samples_per_s"] / t["collective_samples_per_s"] - 1
        # The speedup the two bubbles imply when both series do the same work: busy time is then
        # equal, and each wall time is busy / (world x (1 - bubble)).
        t[f"{s}_implied"] = (1 - t[f"{s}_bubble"]) / (1 - t["collective_bubble"]) - 1
    for s, _, _ in SERIES:
        t[f"{s}_bubble_busy"] = t[f"{s}_bubble"] / (1 - t[f"{s}_bubble"])
    return t


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Mean, min and max over seeds of every measured column, indexed by the point's key (a point
    that two studies share ran once, under the first)."""
    t = derived(table)
    numeric = [c for c in t.columns if c not in ("study", "label", "key", "cell", "seed")]
    g = t.groupby("key", sort=False)[numeric]
    out = g.mean()
    for stat in ("min", "max"):
        out = out.join(getattr(g, stat)().add_suffix(f"_{stat}"))
    return out


def _rows(s: pd.DataFrame, points: Sequence[Point]) -> list[tuple[Point, pd.Series]]:
    """The points that have rows, with their summaries."""
    return [(p, s.loc[p.key()]) for p in points if p.key() in s.index]


PAPER_COLL_BUSY = CELL_14B["bubble_collective_lb_micro"]
PAPER_MINI_BUSY = CELL_14B["bubble_odc_lb_mini"]


def distance(row: pd.Series) -> float:
    """Mean absolute difference, in percentage points, from the paper's four numbers at the 14B cell,
    bubbles read as idle over busy time."""
    pairs = [(row["collective_bubble_busy"], PAPER_COLL_BUSY), (row["odc_lb_mini_bubble_busy"], PAPER_MINI_BUSY),
             (row["odc_lb_mini_speedup"], CELL_14B["speedup_odc_lb_mini"]),
             (row["odc_lb_micro_speedup"], CELL_14B["speedup_odc_lb_micro"])]
    return 100 * sum(abs(a - b) for a, b in pairs) / len(pairs)


def identity(table: pd.DataFrame) -> dict:
    """The paper's bubble rates read both ways, and how far this study's speedups are from the ones
    their bubbles imply."""
    t = derived(table)
    worst = max((t[f"{s}_speedup"] - t[f"{s}_implied"]).abs().max() for s in ("odc_lb_mini", "odc_lb_micro"))
    b_c, b_m = PAPER_COLL_BUSY, PAPER_MINI_BUSY
    return {"worst": worst, "collective": b_c, "lb_mini": b_m, "speedup": CELL_14B["speedup_odc_lb_mini"],
            "collective_of_all": b_c / (1 + b_c), "lb_mini_of_all": b_m / (1 + b_m),
            "implied_of_all": (1 - b_m) / (1 - b_c) - 1, "implied_of_busy": (1 + b_c) / (1 + b_m) - 1}


def candidates(s: pd.DataFrame, points: Sequence[Point]) -> dict:
    """The candidate profiles' rows at the 14B cell, nearest to the paper first, each with its
    summary at the golden cell (None where it has none) and its distance."""
    golden = {p.label: r for p, r in _rows(s, [p for p in points if p.cell != CELL])}
    cell = sorted(((p.label, r) for p, r in _rows(s, [p for p in points if p.cell == CELL])),
                  key=lambda lr: distance(lr[1]))
    return {"paper_golden_lb_mini": SFT_SPEEDUP[(GOLDEN.model, "longalign", 4,
                                                 comparison_key(HEADLINE_ODC, HEADLINE_BASELINE))],
            "paper_golden_lb_micro": SFT_SPEEDUP[(GOLDEN.model, "longalign", 4,
                                                  comparison_key(ODC_LB_MICRO, HEADLINE_BASELINE))],
            "rows": [{"label": label, "cell": r, "golden": golden.get(label), "distance": distance(r)}
                     for label, r in cell]}


def table(rows: Path, docs: Path, points: Sequence[Point] | None = None) -> str:
    """docs/sensitivity.md (templates/sensitivity.md.j2) from the rows of `points` (default: the
    whole study) found in `rows`."""
    points = study_points() if points is None else points
    t = pd.read_csv(rows)
    s = summary(t)
    seeds = sorted(t["seed"].unique())
    studies = {study: [p for p in points if p.study == study] for study in ("one factor", "candidates", "max length")}
    text = render("sensitivity", source=_shown(rows), seeds=seeds, minibatches=MINIBATCHES, warmup=WARMUP,
                  identity=identity(t), cell=CELL, golden_cell=GOLDEN, before=describe(BEFORE),
                  paper=CELL_14B, one_factor=_rows(s, studies["one factor"]),
                  candidates=candidates(s, studies["candidates"]) if _rows(s, studies["candidates"]) else None,
                  max_length=_rows(s, studies["max length"]))
    atomic_write_text(docs, text)
    return text


def _shown(path: Path) -> Path:
    path = path.resolve()
    return path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path


# What run_point writes that run (resuming) and table read.
ROW_COLUMNS = ("study", "label", "key", "seed", *(f"{label}_{what}" for label, _, _ in SERIES
                                                  for what in ("samples_per_s", "bubble", "predicted_bubble")))


def _check_rows(path: Path, ap: CommandParser) -> None:
    try:
        header = pd.read_csv(path, nrows=0).columns
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        ap.error(f"--rows {path} is not a CSV table ({said(e) or type(e).__name__}); "
                 f"move it away, and `{ap.prog} run` writes it")
    if missing := [c for c in ROW_COLUMNS if c not in header]:
        ap.error(f"--rows {path} lacks {some_of(missing)}, so it is not the rows `{ap.prog} run` writes; move it away, "
                 f"and `{ap.prog} run` writes it")


def main(argv: list[str] | None = None) -> None:
    ap = CommandParser(command_name(__spec__.name), description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("run", "table"), help="run: simulate every point; table: the page from their "
                    "rows")
    ap.add_argument("--rows", type=Path, default=ROWS, help="the points' rows (CSV) `run` writes and `table` reads")
    ap.add_argument("--docs", type=writable_file, default=DOCS, help="the page `table` writes")
    ap.add_argument("--seeds", type=positive_int, default=SEEDS, help="length pools drawn per point")
    args = ap.parse_args(argv)
    if args.command == "table" and not args.rows.is_file():
        ap.error(f"--rows {args.rows}: no such file; `{ap.prog} run` writes it")
    if args.rows.is_file():  # `run` resumes from it, `table` reads it: a file of another kind was a KeyError
        _check_rows(args.rows, ap)
    if args.command == "run":
        run(study_points(), args.rows, range(args.seeds))
    else:
        print(table(args.rows, args.docs))


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
