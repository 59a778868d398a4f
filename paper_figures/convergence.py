"""Appendix analog: loss curves of every series on the learnable token source, against the step
and against wall-clock time, and the largest per-step gap between series.

Only runs on `dataset.tokens=learnable` or on real token ids (`dataset.tokens=data`: a JSONL or
hf_disk source's own ids) are drawn (random ids give a loss curve that says nothing;
data/learnable.py): the loss of a minibatch is read from the run's trace, its ranks' `loss_sum`
over its labelled tokens (every token but the last of each document, counted from the trace's
microbatch events), every minibatch warm-up included; its time is when its last rank finished,
from the start of the run's first minibatch. The learnable source's floor, its entropy rate
(data/chain.py), is drawn as a dashed line; real data has no known floor, and its panels are
titled with the file the ids came from.

Runs that computed the same minibatches (one setting: workload, precision, seed, token source
and data file) share a row
of panels; one line per series. A series is engine x balancer and the engine's variant (ODC's
staleness: `ODC [s=1]`), with any other engine or balancer option whose value differs between
the row's runs (say `balancer.options.equal_samples`), so variants appear side by side without
this module knowing them (every run of that engine is labelled
with the option, so the legend reads alike in every panel). The table gives, per setting, each series'
largest absolute and relative per-step gap from the baseline (Collective + LB-Micro where it ran,
else the first series), at which step, and the final losses.
"""

from __future__ import annotations

import sys
from pathlib import PurePath

import pandas as pd
from matplotlib.figure import Figure

from odc_bench.data.chain import entropy_rate
from odc_bench.record.metrics import sum_kept_nan
from odc_bench.results.series import SETTING, config_value
from paper_figures.inputs import NO_RUNS, Inputs, Skip, by_source, read_trace, with_traces
from paper_figures.series import (
    BALANCER_NAMES,
    BASELINE,
    ENGINE_NAMES,
    describe_setting,
    ordered,
    palette,
    series_root,
    with_series,
)

NAME = "convergence"
STEP_LABEL = "step (minibatch)"
TIME_LABEL = "wall-clock time (s)"
Y_LABEL = "loss (nats per token)"
BASELINE_LABEL = f"{ENGINE_NAMES[BASELINE[0]]} + {BALANCER_NAMES[BASELINE[1]]}"


def loss_curve(trace: pd.DataFrame) -> pd.DataFrame:
    """step, loss and time of every minibatch in a run's trace (see the module's docstring)."""
    mbs = trace[trace["kind"] == "minibatch"]
    micro = trace[trace["kind"] == "microbatch"]
    labelled = (micro["tokens"] - micro["samples"]).groupby(micro["minibatch"]).sum()
    loss_sum = sum_kept_nan(mbs.groupby("minibatch")["loss_sum"])  # a diverged run's NaN is not a loss of 0
    end = mbs.groupby("minibatch")["t1"].max()
    start = mbs.loc[mbs["minibatch"] == mbs["minibatch"].min(), "t0"].min()
    steps = sorted(loss_sum.index)
    return pd.DataFrame({"step": steps, "loss": [loss_sum[k] / labelled[k] for k in steps],
                         "time": [end[k] - start for k in steps]})


def label(runs: pd.DataFrame) -> pd.Series:
    """Series labels: engine + balancer, and the options that tell this setting's runs apart
    (results/series.py series_names)."""
    return with_series(runs)["series"]


# The token sources whose loss curves say something, and what each setting's title says of them.
DRAWN_TOKENS = ("learnable", "data")


def loss_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs on the learnable token source or on real ids, with a trace, each with its setting key
    and its `tokens` (and `data_path`: the file real ids came from)."""
    if runs.empty:
        return runs
    runs = runs.assign(tokens=config_value(runs, "dataset.tokens"), data_path=config_value(runs, "dataset.path"))
    runs = with_traces(runs[runs["tokens"].isin(DRAWN_TOKENS)])
    if runs.empty:
        return runs
    runs = runs.assign(data_path=runs["data_path"].where(runs["tokens"] == "data", ""))
    cols = [c for c in [*SETTING, "tokens", "data_path"] if c in runs]
    return runs.assign(setting=runs[cols].astype(str).agg("|".join, axis=1))


def curves(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run and step: setting, series, step, loss, time (repeats of a series averaged)."""
    frames = []
    labels, roots = label(runs), series_root(runs)
    for i, row in runs.iterrows():
        frames.append(loss_curve(read_trace(row)).assign(setting=row["setting"], series=labels[i], root=roots[i]))
    data = pd.concat(frames, ignore_index=True)
    return data.groupby(["setting", "series", "root", "step"], as_index=False)[["loss", "time"]].mean()


def gaps(data: pd.DataFrame) -> pd.DataFrame:
    """Per setting and non-baseline series: the largest per-step gap from the baseline series."""
    rows = []
    for setting, part in data.groupby("setting", sort=True):
        loss = part.pivot(index="step", columns="series", values="loss")
        series = ordered(part)
        roots = dict(zip(part["series"], part["root"], strict=True))
        base = next((s for s in series if roots[s] == BASELINE_LABEL), series[0])
        for s in series:
            if s == base:
                continue
            both = loss[[s, base]].dropna()
            diff = (both[s] - both[base]).abs()
            if diff.empty:
                continue
            worst = int(diff.idxmax())
            rows.append({"setting": setting, "series": s, "baseline": base, "steps": len(both),
                         "max |gap|": float(diff.max()), "at step": worst,
                         "max relative gap": float((diff / both[base].abs()).max()),
                         "mean |gap|": float(diff.mean()), "final loss": float(both[s].iloc[-1]),
                         "baseline final loss": float(both[base].iloc[-1])})
    return pd.DataFrame(rows)


def plot(data: pd.DataFrame, titles: dict[str, str], floors: dict[str, float | None]) -> Figure:
    """Two panels per setting: loss against step and against wall-clock time; the floor where it is known."""
    settings = sorted(data["setting"].unique())
    fig = Figure(figsize=(11, 3.6 * len(settings)))
    axes = fig.subplots(len(settings), 2, squeeze=False)
    hue_order = ordered(data)
    colors = palette(data)
    for (ax_step, ax_time), setting in zip(axes, settings, strict=True):
        part = data[data["setting"] == setting]
        for s in hue_order:
            line = part[part["series"] == s].sort_values("step")
            if line.empty:
                continue
            ax_step.plot(line["step"], line["loss"], label=s, color=colors[s], lw=1.2)
            ax_time.plot(line["time"], line["loss"], label=s, color=colors[s], lw=1.2)
        for ax, xlabel in ((ax_step, STEP_LABEL), (ax_time, TIME_LABEL)):
            floor = floors[setting]
            if floor is not None:
                ax.axhline(floor, color="black", ls="--", lw=0.8, gid="floor")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(Y_LABEL)
            ax.set_title(titles[setting], fontsize=9)
        ax_step.legend(fontsize=7)
    known = {f for f in floors.values() if f is not None}
    floor_note = f" (the learnable source's floor {known.pop():.2f} nats, dashed)" if known else ""
    fig.suptitle(f"Loss per minibatch{floor_note}")
    fig.tight_layout()
    return fig


def table_text(table: pd.DataFrame, titles: dict[str, str]) -> str:
    shown = table.assign(setting=table["setting"].map(titles))
    body = shown.to_markdown(index=False, floatfmt=".4g")
    return ("## Convergence: the largest per-step loss gap between series\n\n"
            "Per setting, each series against the baseline on the same minibatches: the largest absolute "
            "difference of the minibatch loss (nats per labelled token) over all steps, where it falls, the "
            f"largest relative difference, the mean absolute one and both final losses; the learnable source's "
            f"floor {entropy_rate():.3f} (real token ids have no known floor).\n\n"
            f"{body}\n")


def _title(row: pd.Series) -> str:
    # a line of its own: a path beside the setting runs into the next panel's title
    ids = f"\ntoken ids of {PurePath(row['data_path']).name}" if row.get("tokens") == "data" else ""
    return f"{describe_setting(row)}, {row.get('precision')}, seed {row.get('seed')}{ids}"


def render(inputs: Inputs) -> dict[str, object]:
    if inputs.runs.empty:
        raise Skip(f"no {NO_RUNS} found below the results root")
    out: dict[str, object] = {}
    for source, part in by_source(inputs.runs).items():
        runs = loss_runs(part)
        if runs.empty:
            continue
        firsts = runs.drop_duplicates("setting")
        titles = {r["setting"]: _title(r) for _, r in firsts.iterrows()}
        floors = {r["setting"]: entropy_rate() if r["tokens"] == "learnable" else None for _, r in firsts.iterrows()}
        data = curves(runs)
        out[f"{NAME}-{source}"] = plot(data, titles, floors)
        table = gaps(data)
        out[f"{NAME}_gap-{source}"] = table_text(table, titles) if not table.empty else Skip(
            "one series per setting: no gap to report")
    if not out:
        raise Skip("no run on dataset.tokens=learnable or on real token ids (dataset.tokens=data) with a trace: run "
                   "sweep=convergence, or a run on a JSONL file of token ids")
    return out


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
