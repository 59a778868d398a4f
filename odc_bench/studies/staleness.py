"""Stale-synchronous ODC's runs against the plan model: `python -m odc_bench.studies.staleness DIR...`

Reads the runs below the folders (sweep=ssp on CPU, sweep=ssp_sim in the simulator) and, for
every set of runs made side by side (one setting and seed, one attempt), takes the throughput
of ODC at each staleness s over ODC at staleness 0 with the same balancer, and over Collective
+ LB-Micro, beside the speedup the plan model predicts for the same pair (each run planned
again from its config: RunSpec.predicted_time, balancers/quality.py). Per workload and series
it prints, as a Markdown table for docs/staleness.md, the median over the sets with their
range, and the share of the predicted gain the runs reached, (measured - 1) / (predicted - 1)
of the medians.

`--simulate CALIBRATION` validates the simulator's stale timeline the way docs/simulator.md
validates the synchronous one: every real run is simulated again with the CPU profile fitted
on this machine (python -m odc_bench.calibrate.cpu_profile --engines collective odc), and the
simulated speedup of each pair stands beside the measured one.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pandas as pd
import yaml

from odc_bench.config.backend import CalibratedHardwareConfig
from odc_bench.config.run import run_config
from odc_bench.errors import CommandParser, ConfigError, command_name, ends_cleanly, fail
from odc_bench.plan.spec import resolve
from odc_bench.record.row import timing
from odc_bench.results.collect import merged, tables_under
from odc_bench.results.series import (
    DERIVED,
    HEADLINE_BASELINE,
    SETTING,
    WORKLOAD,
    balancer_options,
    engine_options,
    with_workload,
)
from odc_bench.sim import simulate
from odc_bench.sim.hardware import load_profile

BASELINE = HEADLINE_BASELINE


@cache
def predicted_time(config_yaml: str) -> float:
    """The plan model's time for a run's measured minibatches, from the config its row records."""
    return resolve(run_config(yaml.safe_load(config_yaml))).predicted_time()


@cache
def simulated_speed(config_yaml: str, calibration: str) -> float:
    """Samples/s the simulator predicts for a run's config on the calibrated CPU profile; NaN for
    a run it does not model (engine.prefetch=false) or the profile does not describe (another
    precision, unit, world size, compilation or threads per rank than its calibration's)."""
    values = yaml.safe_load(config_yaml)
    values["backend"] = {"name": "sim", "write_trace": False,
                         "hardware": {"name": "cpu", "kind": "calibrated", "calibration": calibration}}
    # What a real run did beside its training, which a simulated one has nothing for.
    values["profile_minibatch"] = None
    values["checkpoint"] = {**(values.get("checkpoint") or {}), "every": 0}
    try:
        spec = resolve(run_config(values))
        return float(timing(spec, simulate(spec).events)["samples_per_s"])
    except ConfigError:
        return float("nan")


def side_by_side(runs: pd.DataFrame, calibration: str | None = None) -> pd.DataFrame:
    """One row per ODC run that has an ODC staleness-0 partner (same set, same balancer, same
    engine and balancer options; the partner itself included): its measured and predicted speedup
    over it, and over Collective + LB-Micro where that ran."""
    ok = with_workload(runs[runs["status"] == "ok"])
    options = [", ".join(o for o in pair if o) for pair in zip(engine_options(ok), balancer_options(ok), strict=True)]
    ok = ok.assign(staleness=ok["staleness"].fillna(0).astype(int).astype(str), options=options)
    ok = ok.assign(predicted=[predicted_time(c) for c in ok["config"]])
    if calibration is not None:
        ok = ok.assign(simulated=[simulated_speed(c, calibration) if b == "local" else float("nan")
                                  for c, b in zip(ok["config"], ok["backend"], strict=True)])
    key = [*SETTING, "attempt"]
    out = []
    for _, group in ok.groupby(key, dropna=False):
        odc = group[group["engine"] == "odc"]
        collective = group[(group["engine"] == BASELINE[0]) & (group["balancer"] == BASELINE[1])]
        for _, run in odc.iterrows():
            base = odc[(odc["balancer"] == run["balancer"]) & (odc["staleness"] == "0")
                       & (odc["options"] == run["options"])]
            if base.empty:
                continue
            b = base.iloc[0]
            row = dict(run[[*WORKLOAD, "seed", "balancer", "options", "staleness", "bubble_rate"]],
                       measured=run["samples_per_s"] / b["samples_per_s"], predicted=b["predicted"] / run["predicted"],
                       base_bubble=b["bubble_rate"])
            if calibration is not None:
                row["simulated"] = run["simulated"] / b["simulated"]
            if not collective.empty:
                c = collective.iloc[0]
                row.update(over_collective=run["samples_per_s"] / c["samples_per_s"],
                           predicted_over_collective=c["predicted"] / run["predicted"])
            out.append(row)
    if not out:
        raise ConfigError("no stale ODC run with an ODC staleness-0 partner of the same setting, seed and balancer; "
                          "give the results of sweep=ssp or sweep=ssp_sim")
    return pd.DataFrame(out)


def _spread(values: pd.Series) -> str:
    if len(values) == 1:
        return f"{values.iloc[0]:.3f}"
    return f"{values.median():.3f} ({values.min():.3f}-{values.max():.3f})"


def _named(key: str, value: object) -> str:
    """A workload's value as the summary names it: the derived columns as they read, others as key=value."""
    if key in (*DERIVED, "options"):
        return f"activation checkpointing {value}" if key == "checkpointing" and value else str(value or "")
    return f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"


def summary(pairs: pd.DataFrame) -> str:
    """The Markdown table: per workload and series, medians over the sets with their ranges."""
    simulated = "simulated" in pairs
    lines = ["| backend | model | dataset | ranks | minibatch | max tokens | packing | series | sets "
             "| bubble (s = 0 -> s) "
             f"| over ODC s = 0: measured | predicted | share of predicted gain {'| simulated ' if simulated else ''}"
             "| over Collective + LB-Micro: measured | predicted |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if simulated else "")]
    keys = ["backend", "model", "dataset", "world_size", "minibatch_size", "max_tokens", "packing_ratio", "balancer",
            "staleness"]
    # The same in every row of a sweep; kept apart all the same. The engine and balancer options
    # that differ between runs (side_by_side's `options`) are always named.
    rest = [k for k in [*WORKLOAD, "options"] if k not in keys and k in pairs]
    # Those of them that rows alike in the table's columns differ in, named beside the series.
    alike = pairs.groupby(keys, dropna=False)
    shown = [k for k in rest if k == "options" or (alike[k].nunique(dropna=False) > 1).any()]
    for (backend, model, dataset, world, minibatch, max_tokens, packing, balancer, staleness, *others), g in \
            pairs.groupby([*keys, *rest], sort=True, dropna=False):
        apart = ", ".join(_named(k, v) for k, v in zip(rest, others, strict=True) if k in shown and _named(k, v))
        gain = g["predicted"].median() - 1
        # No share of a gain the model does not predict.
        reached = f"{(g['measured'].median() - 1) / gain:.0%}" if gain > 0.001 else "-"
        has_base = "over_collective" in g and g["over_collective"].notna().any()
        lines.append(
            f"| {backend} | {model} | {dataset} | {world} | {minibatch} | {max_tokens} | {packing:g} "
            f"| odc s={staleness} + {balancer}{f' ({apart})' if apart else ''} | {len(g)} "
            f"| {g['base_bubble'].median():.1%} -> {g['bubble_rate'].median():.1%} | {_spread(g['measured'])} "
            f"| {_spread(g['predicted'])} | {reached} "
            f"{'| ' + _spread(g['simulated']) + ' ' if simulated else ''}"
            f"| {_spread(g['over_collective'].dropna()) if has_base else '-'} "
            f"| {_spread(g['predicted_over_collective'].dropna()) if has_base else '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(command_name(__spec__.name), description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="results folders (or runs.csv tables)")
    parser.add_argument("--simulate", metavar="CALIBRATION", type=Path, default=None,
                        help="also simulate every real run with this CPU profile (results/calibration/sim-*-cpu.json)")
    args = parser.parse_args(argv)
    try:
        missing = [str(d) for d in args.dirs if not d.exists()]
        if missing:
            raise ConfigError(f"no such folder or table: {', '.join(missing)}")
        calibration = None
        if args.simulate is not None:
            if not args.simulate.exists():
                raise ConfigError(f"no calibration at {args.simulate}; run `python -m odc_bench.calibrate.cpu_profile "
                                  "--engines collective odc` first")
            # Read once here, so that a file that cannot be read is one line, not a NaN for every run.
            calibration = str(args.simulate.resolve())
            load_profile(CalibratedHardwareConfig(name="cpu", calibration=calibration), "")
        print(summary(side_by_side(merged(tables_under(args.dirs)), calibration)))
    except ConfigError as e:
        fail(e, parser.prog)
    return 0


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        status = main()
    sys.exit(status)
