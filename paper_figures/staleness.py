"""Stale-synchronous ODC's convergence cost: loss curves against steps and against wall-clock time.

Drawn from the runs of sweep=ssp_convergence (the learnable token source, whose loss floor is
known: odc_bench/data/learnable.py): Collective + LB-Micro and ODC at staleness 0, 1 and 2, one
panel of loss per step and one of loss per second since the run's start. With staleness s,
minibatch k computes on the weights after k - s steps, so a stale series can need more steps
to a loss and still reach it sooner. The table beside it gives, per series, the final loss (mean
of the last WINDOW steps), the steps and seconds to a target loss, and their gaps to ODC at
staleness 0; the target is the loss ODC at staleness 0 reaches (smoothed over WINDOW steps) at
half of its run, a loss every series reaches unless staleness costs more than half a run.

Steps and losses do not depend on timing; seconds do, on a 2-core host by more than the gaps in
question. Where the series ran as side-by-side sets (set i: each series' i-th ok run, as
sweep=ssp_convergence runs them), the seconds are the median over the complete sets, each set's
gap to ODC at staleness 0 taken within the set, with the range of those gaps; the time panel
draws every set.

Loss of minibatch k: the ranks' loss sums over its labelled tokens (its microbatches' tokens
less one per sample); its time: when the last rank left minibatch k.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure

from odc_bench.record.metrics import sum_kept_nan
from paper_figures.inputs import Inputs, Skip, per_source, read_trace, with_traces
from paper_figures.series import BALANCER_NAMES, describe_setting, ordered, palette, with_series

NAME = "staleness"
WINDOW = 25
# Loss curves need a run long enough to converge somewhere; shorter learnable runs are checks.
MIN_STEPS = 100
REFERENCE = "odc", "0"  # engine, staleness: what gaps are measured against
# ODC's series by staleness: the synchronous one in the figures' ODC red, staler ones lighter.
STALENESS_COLORS = ("#a50f15", "#e6550d", "#fdae6b", "#fdd0a2")


def loss_curve(trace: pd.DataFrame) -> pd.DataFrame:
    """step, loss (per labelled token) and seconds (since the run's first minibatch began) of every minibatch."""
    spans = trace[trace["kind"] == "minibatch"]
    micro = trace[trace["kind"] == "microbatch"]
    labelled = (micro["tokens"] - micro["samples"]).groupby(micro["minibatch"]).sum()
    steps = spans.groupby("minibatch")
    per_step = pd.DataFrame({"loss_sum": sum_kept_nan(steps["loss_sum"]), "t1": steps["t1"].max()})
    start = float(spans["t0"].min())
    return pd.DataFrame({"step": per_step.index.astype(int),
                         "loss": (per_step["loss_sum"] / labelled.reindex(per_step.index)).to_numpy(),
                         "seconds": (per_step["t1"] - start).to_numpy()})


def smoothed(curve: pd.DataFrame) -> pd.Series:
    return curve["loss"].rolling(WINDOW, min_periods=1).mean()


# Engines that compute the same gradients agree on a loss to this relative precision (fp32
# sums in different orders), and reach a target together.
SAME_LOSS = 1e-4


def first_below(curve: pd.DataFrame, target: float) -> tuple[float, float]:
    """(step, seconds) where the smoothed loss first reaches `target`; NaN when it never does."""
    below = np.flatnonzero(smoothed(curve).to_numpy() <= target * (1 + SAME_LOSS))
    if below.size == 0:
        return float("nan"), float("nan")
    i = int(below[0])
    return float(curve["step"].iloc[i]), float(curve["seconds"].iloc[i])


def convergence_table(curves: dict[str, pd.DataFrame], reference: str) -> pd.DataFrame:
    """Per series: final loss, steps and seconds to the target, and their gaps to `reference`."""
    ref = curves[reference]
    target = float(smoothed(ref).iloc[len(ref) // 2])
    rows = []
    for label, curve in curves.items():
        step, seconds = first_below(curve, target)
        rows.append(dict(series=label, final_loss=float(curve["loss"].tail(WINDOW).mean()), steps_to_target=step,
                         seconds_to_target=seconds, total_seconds=float(curve["seconds"].iloc[-1])))
    table = pd.DataFrame(rows).set_index("series")
    base = table.loc[reference]
    table["final_loss_gap"] = table["final_loss"] - base["final_loss"]
    table["steps_gap"] = table["steps_to_target"] / base["steps_to_target"] - 1
    table["seconds_gap"] = table["seconds_to_target"] / base["seconds_to_target"] - 1
    return table.assign(target=target)


def learnable_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs on the learnable token source long enough to draw, with the trace they need."""
    if runs.empty or "config" not in runs:
        return runs.iloc[0:0]

    def learnable(config: object) -> bool:
        data = yaml.safe_load(config) if isinstance(config, str) else None
        return isinstance(data, dict) and data.get("dataset", {}).get("tokens") == "learnable"

    keep = runs[(runs["status"] == "ok") & runs["config"].map(learnable) & (runs["num_minibatches"] >= MIN_STEPS)]
    return with_traces(keep)


def series_label(engine: str, balancer: str, staleness: str, collective_label: str) -> str:
    if engine != "odc":
        return collective_label
    return f"ODC s={staleness} + {BALANCER_NAMES.get(balancer, balancer)}"


def colors_of(series: pd.DataFrame) -> dict[str, object]:
    """The figures' colour for collective series; ODC's by staleness. `series`: one row per
    series with its `series` label, `root`, `engine` and `staleness`."""
    colors = palette(series)
    for row in series[series["engine"] == "odc"].itertuples():
        colors[row.series] = STALENESS_COLORS[min(int(row.staleness), len(STALENESS_COLORS) - 1)]
    return colors


def plot(sets: list[dict[str, pd.DataFrame]], series: pd.DataFrame, title: str = "") -> Figure:
    """Loss against steps (the first set: steps do not depend on timing) and against seconds
    (every set, the later ones fainter); `series` as for colors_of."""
    order = ordered(series)
    colors = colors_of(series)
    fig = Figure(figsize=(12, 4.4))
    by_step, by_time = fig.subplots(1, 2, sharey=True)
    for label in order:
        curve = sets[0][label]
        by_step.plot(curve["step"], smoothed(curve), color=colors[label], label=label, gid=label)
        for i, curves in enumerate(sets):
            curve = curves[label]
            by_time.plot(curve["seconds"], smoothed(curve), color=colors[label], gid=label,
                         alpha=1.0 if i == 0 else 0.35, linewidth=1.5 if i == 0 else 0.8)
    for ax, xlabel in ((by_step, "optimizer step"), (by_time, "wall-clock time since the run's start (s)")):
        ax.set_xlabel(xlabel)
    by_step.set_ylabel(f"training loss per token (mean of {WINDOW} steps)")
    by_step.legend(title="series")
    if title:
        fig.suptitle(title)
    return fig


def over_sets(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """The median of each column over the sets' tables, with the range of the seconds gap
    (seconds_gap_lo, seconds_gap_hi) and the number of sets."""
    every = pd.concat(tables)
    by_series = every.groupby(level=0, sort=False)
    return by_series.median().assign(seconds_gap_lo=by_series["seconds_gap"].min(),
                                     seconds_gap_hi=by_series["seconds_gap"].max(), sets=len(tables))


def markdown(table: pd.DataFrame) -> str:
    target = float(table["target"].iloc[0])
    sets = int(table["sets"].iloc[0])
    lines = [f"Target loss {target:.3f} (ODC at staleness 0, smoothed over {WINDOW} steps, at half its run)."]
    if sets > 1:
        lines.append(f"Seconds: the median of {sets} side-by-side sets; a seconds gap is taken within each set, "
                     "its range over the sets in brackets.")
    lines += ["", "| series | final loss | gap | steps to target | gap | seconds to target | gap | run's seconds |",
              "|---|---|---|---|---|---|---|---|"]
    for series, r in table.iterrows():
        # The reference's gap is zero in every set: no range to give.
        spread = f" ({r.seconds_gap_lo:+.1%} to {r.seconds_gap_hi:+.1%})" \
            if sets > 1 and (r.seconds_gap_lo, r.seconds_gap_hi) != (0, 0) else ""
        lines.append(f"| {series} | {r.final_loss:.3f} | {r.final_loss_gap:+.3f} | {r.steps_to_target:.0f} "
                     f"| {r.steps_gap:+.1%} | {r.seconds_to_target:.1f} | {r.seconds_gap:+.1%}{spread} "
                     f"| {r.total_seconds:.1f} |")
    return "\n".join(lines) + "\n"


def _draw(runs: pd.DataFrame) -> dict[str, object]:
    runs = with_series(runs).assign(staleness=lambda r: r["staleness"].fillna(0).astype(int).astype(str))
    if not (runs["staleness"] != REFERENCE[1]).any():
        # Synchronous runs only (sweep=convergence): the convergence figure draws them.
        raise Skip("no ODC run at engine.staleness >= 1")
    # The setting with the most series (then the first).
    keys = ["model", "dataset", "world_size", "minibatch_size", "length_scale", "num_minibatches", "seed"]
    setting = max(runs.groupby(keys, dropna=False), key=lambda kv: (kv[1]["series"].nunique(), -len(kv[1])))[1]
    setting = setting.assign(label=[series_label(r.engine, r.balancer, r.staleness, r.series)
                                    for r in setting.itertuples()])
    reference = setting[(setting["engine"] == REFERENCE[0]) & (setting["staleness"] == REFERENCE[1])]
    if reference.empty:
        raise Skip("no ODC run at staleness 0 to measure the others against")
    sets = side_by_side(setting)
    curves = [{row["label"]: loss_curve(read_trace(row)) for _, row in part.iterrows()} for part in sets]
    table = over_sets([convergence_table(c, str(reference["label"].iloc[0])) for c in curves])
    labelled = setting.drop(columns="series").rename(columns={"label": "series"}).drop_duplicates("series")
    table = table.loc[ordered(labelled)]  # the legend's order, whichever ran first
    first = setting.iloc[0]
    title = f"Loss with staleness: {describe_setting(first)}, seed {first['seed']}"
    if len(sets) > 1:
        title += f", {len(sets)} side-by-side sets"
    return {"figure": plot(curves, labelled, title), "table": markdown(table)}


def side_by_side(setting: pd.DataFrame) -> list[pd.DataFrame]:
    """Set i: each series' i-th ok run (in the order of its rows' attempts, as a sweep of rounds
    runs them); only the sets every series has a run in."""
    attempts = setting["attempt"].fillna(0) if "attempt" in setting else pd.Series(0, index=setting.index)
    ordered_runs = setting.assign(_attempt=attempts).sort_values("_attempt", kind="stable")
    numbered = ordered_runs.assign(_set=ordered_runs.groupby("label").cumcount())
    complete = int(numbered.groupby("label")["_set"].max().min()) + 1
    return [part.drop(columns=["_attempt", "_set"]) for i, part in numbered.groupby("_set") if i < complete]


def render(inputs: Inputs) -> dict[str, object]:
    runs = learnable_runs(inputs.runs)
    out: dict[str, object] = {}
    for key, item in per_source(runs, NAME, _draw, f"runs on the learnable token source of {MIN_STEPS}+ steps "
                                "(sweep=ssp_convergence)").items():
        if isinstance(item, Skip):
            out[key] = item
        else:
            assert isinstance(item, dict)
            out[key] = item["figure"]
            out[key.replace(NAME, f"{NAME}_table", 1)] = item["table"]
    return out


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
