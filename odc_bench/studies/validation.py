"""Validate the simulator against real CPU runs on this machine.

`python -m odc_bench.studies.validation` runs each validation config for real and in simulation,
engine by engine, and writes

- results/validation/sim-cpu.csv: one row per config and engine, measured and predicted
  samples/s and bubble rate (and sim-cpu-ratios.csv: the odc/collective throughput ratios
  when both engines ran);
- sim-cpu-repeatability.csv: the spread of the calibration runs repeated before each config, and
  sim-cpu-provenance.json: machine, commit, time, run lengths and load average;
- docs/simulator_validation.md: the same as tables, with the provenance (`--doc-only` writes it
  again from those files).

The predictions come from the CPU profile fitted (odc_bench.calibrate.cpu_profile) on calibration
runs: LongAlign and SWE-smith at 4 samples per rank, configs the validation does not use
(those have 1, 2 or 8 samples per rank and fresh seeds), so the prediction is out of sample.
Before each validation config one more calibration run per engine is made (the two datasets
alternating), and the profile is refitted on every calibration run made so far: pooling them
averages out one run's noise (identical calibration runs differed by up to 13% on this machine),
which a profile fitted on the latest run only passed on to every prediction. Every run, real
or calibration, covers the same number of samples per rank (`--samples-per-rank`), so a run
at 1 sample per rank is as long as one at 8 and no shorter run carries more of the machine's
jitter; engines are interleaved so a ratio compares runs made side by side.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pandas as pd

from odc_bench.calibrate.cpu_profile import SIM_ENGINES, fit, run_real
from odc_bench.config.compose import compose_run
from odc_bench.errors import CommandParser, command_name, ends_cleanly, positive_int
from odc_bench.files import atomic_write_text, missing_inputs, writable_file, writable_folder
from odc_bench.plan.spec import resolve
from odc_bench.provenance import REPO_ROOT, git_commit
from odc_bench.record.row import timing
from odc_bench.sim import simulate
from odc_bench.studies.pages import render

# (label, overrides): lengths from both dataset profiles, minibatch sizes the calibration
# runs (size 4) did not use, and fresh seeds.
VALIDATION_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("longalign mb1", ("dataset=longalign", "minibatch_size=1", "seed=11")),
    ("longalign mb2", ("dataset=longalign", "minibatch_size=2", "seed=12")),
    ("longalign mb8", ("dataset=longalign", "minibatch_size=8", "seed=13")),
    ("swe_smith mb1", ("dataset=swe_smith", "minibatch_size=1", "seed=14")),
    ("swe_smith mb2", ("dataset=swe_smith", "minibatch_size=2", "seed=15")),
    ("swe_smith mb8", ("dataset=swe_smith", "minibatch_size=8", "seed=16")),
)


def simulate_row(overrides: list[str], calibration: Path) -> dict:
    """The simulator's row for a config, with the CPU profile of the given calibration file."""
    spec = resolve(compose_run([*overrides, "backend=sim", "backend/hardware=cpu",
                                f"backend.hardware.calibration={calibration}"]))
    return timing(spec, simulate(spec).events)


def compare(label: str, overrides: list[str], engines: list[str], calibration: Path, results_dir: Path,
            repeats: int = 1) -> list[dict]:
    """Real runs of every engine (repeated, alternating the engines' order; the median counts)
    beside the simulator's prediction."""
    measured: dict[str, list[dict]] = {e: [] for e in engines}
    self_error: dict[str, list[float]] = {e: [] for e in engines}
    for k in range(repeats):
        for engine in engines if k % 2 == 0 else engines[::-1]:
            spec, events = run_real([*overrides, f"engine={engine}"], results_dir)
            measured[engine].append(timing(spec, events))
            # The model's own error, without the machine's drift: calibrated on this very run.
            own = calibration.with_name(f"{calibration.stem}-self.json")
            atomic_write_text(own, json.dumps(fit({engine: [(spec, events)]})))
            self_error[engine].append(simulate_row([*overrides, f"engine={engine}"], own)["samples_per_s"]
                                      / measured[engine][-1]["samples_per_s"] - 1)
            own.unlink()
    rows = []
    for engine in engines:
        predicted = simulate_row([*overrides, f"engine={engine}"], calibration)
        med = pd.DataFrame(measured[engine]).median()
        rows.append(dict(config=label, engine=engine, overrides=" ".join(overrides), repeats=repeats,
                         measured_samples_per_s=med["samples_per_s"],
                         predicted_samples_per_s=predicted["samples_per_s"],
                         measured_bubble=med["bubble_rate"], predicted_bubble=predicted["bubble_rate"],
                         self_calibrated_error=float(pd.Series(self_error[engine]).median()),
                         runs_samples_per_s=" ".join(f"{r['samples_per_s']:.4f}" for r in measured[engine])))
    return rows


def ratios(table: pd.DataFrame) -> pd.DataFrame:
    """odc/collective throughput, measured and predicted, for configs that ran both.

    The measured ratio is the median over pairs of runs made side by side (the k-th run of
    each engine): the machine's speed drifts over tens of seconds, and a pair shares it, where
    the ratio of the two engines' medians may take its runs from different minutes."""
    if "odc" not in table["engine"].values or "collective" not in table["engine"].values:
        return pd.DataFrame()
    wide = table.set_index(["config", "engine"])
    rows = []
    for config in dict.fromkeys(table["config"]):
        odc, coll = wide.loc[(config, "odc")], wide.loc[(config, "collective")]
        pairs = pd.Series([float(a) / float(b) for a, b in zip(odc["runs_samples_per_s"].split(),
                                                                coll["runs_samples_per_s"].split(), strict=True)])
        rows.append(dict(config=config, measured_ratio=pairs.median(), pair_min=pairs.min(), pair_max=pairs.max(),
                         ratio_of_medians=odc["measured_samples_per_s"] / coll["measured_samples_per_s"],
                         predicted_ratio=odc["predicted_samples_per_s"] / coll["predicted_samples_per_s"]))
    out = pd.DataFrame(rows)
    out["error"] = out["predicted_ratio"] / out["measured_ratio"] - 1
    return out


def repeatability(repeated: list[dict]) -> pd.DataFrame:
    """How much the same real run's throughput moves between repetitions on this machine: the
    calibration runs repeat one fixed config per dataset and engine."""
    t = pd.DataFrame(repeated)
    if t.empty:
        return t
    g = t.groupby(["config", "engine"])["samples_per_s"]
    out = g.agg(["count", "min", "max", "mean", "std"]).reset_index()
    out["cv"] = out["std"] / out["mean"]
    return out


def markdown(table: pd.DataFrame, ratio: pd.DataFrame, provenance: dict, repeat: pd.DataFrame) -> str:
    """docs/simulator_validation.md (templates/simulator_validation.md.j2) from the validation's files."""
    t = table.assign(error=table["predicted_samples_per_s"] / table["measured_samples_per_s"] - 1)
    return render("simulator_validation", provenance=provenance, runs=t.to_dict("records"),
                  repeatability=repeat.to_dict("records"), ratios=ratio.to_dict("records"))


def read_outputs(out: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict, pd.DataFrame]:
    """What the page is rendered from, as the validation wrote it to `out`."""
    ratios = out / "sim-cpu-ratios.csv"
    repeat = out / "sim-cpu-repeatability.csv"
    return (pd.read_csv(out / "sim-cpu.csv"), pd.read_csv(ratios) if ratios.exists() else pd.DataFrame(),
            json.loads((out / "sim-cpu-provenance.json").read_text()),
            pd.read_csv(repeat) if repeat.exists() else pd.DataFrame())


def run_length(samples_per_rank: int, minibatch_size: int) -> list[str]:
    """Overrides for a run of about `samples_per_rank` measured samples on each rank, after 2
    warm-up minibatches."""
    return [f"num_minibatches={2 + -(-samples_per_rank // minibatch_size)}", "warmup_minibatches=2"]


def minibatch_size_of(overrides: tuple[str, ...]) -> int:
    return int(next(o.split("=")[1] for o in overrides if o.startswith("minibatch_size=")))


def main(argv: list[str] | None = None) -> None:
    ap = CommandParser(command_name(__spec__.name), description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", nargs="+", default=["collective", "odc"], choices=SIM_ENGINES,
                    help="the engines validated, each run for real and simulated")
    ap.add_argument("--samples-per-rank", type=positive_int, default=96, help="measured samples per rank in every run")
    ap.add_argument("--repeats", type=positive_int, default=5, help="real runs per config and engine (median)")
    ap.add_argument("--results-dir", type=writable_folder, default=REPO_ROOT / "results" / "local" / "validation",
                    help="where the real runs' rows go")
    ap.add_argument("--out", type=writable_folder, default=REPO_ROOT / "results" / "validation",
                    help="where the measured-against-predicted tables and their provenance go")
    ap.add_argument("--docs", type=writable_file, default=REPO_ROOT / "docs" / "simulator_validation.md",
                    help="the page written from them")
    ap.add_argument("--only", nargs="+", default=None, choices=[label for label, _ in VALIDATION_RUNS],
                    metavar="LABEL", help="the configs to run, by label (quoted: 'longalign mb1'; default: all)")
    ap.add_argument("--doc-only", action="store_true", help="write the page again from the files in --out")
    args = ap.parse_args(argv)
    args.engines = list(dict.fromkeys(args.engines))  # an engine named twice is validated once
    if args.doc_only and (missing := missing_inputs(args.out, ["sim-cpu.csv", "sim-cpu-provenance.json"])):
        ap.error(f"--doc-only: {args.out} lacks {', '.join(missing)}; run {ap.prog} without it first")
    if args.doc_only:
        atomic_write_text(args.docs, markdown(*read_outputs(args.out)))
        return
    base = ["threads_per_rank=1"]
    calibration_base = [*base, "minibatch_size=4", *run_length(args.samples_per_rank, 4)]
    calibration_runs: dict[str, list[tuple]] = {e: [] for e in args.engines}
    calibration = args.out / "sim-cpu-calibration.json"
    datasets = ("dataset=longalign", "dataset=swe_smith")
    rows, loads, repeated = [], [], []
    chosen = [(label, extra) for label, extra in VALIDATION_RUNS if args.only is None or label in args.only]
    for i, (label, extra) in enumerate(chosen):
        for k in ((0, 1) if i == 0 else (i % 2,)):
            for engine in args.engines:
                spec, events = run_real([*calibration_base, datasets[k], f"engine={engine}"],
                                        args.results_dir / "calibration")
                calibration_runs[engine].append((spec, events))
                repeated.append(dict(config=f"calibration {datasets[k].split('=')[1]} mb4", engine=engine,
                                     samples_per_s=timing(spec, events)["samples_per_s"]))
        atomic_write_text(calibration, json.dumps(fit(calibration_runs), indent=2) + "\n")
        loads.append(os.getloadavg()[0])
        length = run_length(args.samples_per_rank, minibatch_size_of(extra))
        rows += compare(label, [*base, *length, *extra], args.engines, calibration, args.results_dir, args.repeats)
    table = pd.DataFrame(rows)
    ratio = ratios(table)
    shown = calibration.relative_to(REPO_ROOT) if calibration.is_relative_to(REPO_ROOT) else calibration
    provenance = {"machine": socket.gethostname(), "commit": git_commit(), "time": time.strftime("%Y-%m-%d %H:%M"),
                  "calibration": str(shown), "samples_per_rank": args.samples_per_rank, "repeats": args.repeats,
                  "load_min": min(loads), "load_max": max(loads), "cores": os.cpu_count()}
    repeat = repeatability(repeated)
    atomic_write_text(args.out / "sim-cpu.csv", table.to_csv(index=False))
    if not ratio.empty:
        atomic_write_text(args.out / "sim-cpu-ratios.csv", ratio.to_csv(index=False))
    atomic_write_text(args.out / "sim-cpu-repeatability.csv", repeat.to_csv(index=False))
    atomic_write_text(args.out / "sim-cpu-provenance.json", json.dumps(provenance, indent=2) + "\n")
    text = markdown(table, ratio, provenance, repeat)
    atomic_write_text(args.docs, text)
    print(text)


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
