"""Fig. 1/2 analog: per-rank timeline of one minibatch, collective FSDP beside ODC.

Each rank's row shows its unit compute (forward and backward spans), the optimizer step, the
minibatch sync (finish_minibatch), and, in grey, the rest: time the rank was not computing
because it waited at a barrier or moved data that no compute overlapped. Under collective
FSDP the grey is spread through the minibatch (every layer is a barrier); under ODC it
gathers at the one sync point. The time saved is the difference of the two minibatch spans.

The runs drawn are the pair at the golden setting (paper_figures.series.golden), preferring
Collective + LB-Micro and ODC + LB-Mini, planned with the same cost model (like for like: the
title names it); the minibatch is the first measured one (after warm-up). With only one
engine in the results, that engine is drawn alone and the title says so.
"""

from __future__ import annotations

import sys

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from paper_figures.inputs import NO_RUNS, Inputs, Skip, per_source, read_trace, with_traces
from paper_figures.series import ENGINE_NAMES, PREFERRED, describe_setting, golden, measured_or_simulated

NAME = "fig1_timeline"
KINDS = {  # gid of the drawn spans -> (trace kinds, colour, legend label)
    "compute": (("fwd", "bwd"), "#4c72b0", "compute (forward, backward)"),
    "optimizer": (("optimizer",), "#55a868", "optimizer step"),
    "sync": (("sync",), "#c44e52", "sync (finish minibatch)"),
}
IDLE = ("#dddddd", "not computing (waiting or communicating)")
X_LABEL = "time since minibatch start (s)"
Y_LABEL = "rank"


def minibatch_spans(trace: pd.DataFrame, minibatch: int) -> tuple[pd.DataFrame, float]:
    """The minibatch's events with times relative to its start on the earliest rank, and its span."""
    events = trace[trace["minibatch"] == minibatch]
    whole = events[events["kind"] == "minibatch"]
    if whole.empty:
        raise Skip(f"the trace has no minibatch event for minibatch {minibatch}")
    start, end = float(whole["t0"].min()), float(whole["t1"].max())
    return events.assign(t0=events["t0"] - start, t1=events["t1"] - start), end - start


def plot(traces: list[tuple[str, pd.DataFrame]], minibatch: int, title: str = "") -> Figure:
    """One panel per (label, trace), sharing the time axis; the time saved marked when there are two."""
    fig = Figure(figsize=(10, 1.2 + 1.6 * len(traces) + 0.25 * sum(t["rank"].nunique() for _, t in traces)))
    axes = fig.subplots(len(traces), 1, sharex=True, squeeze=False)[:, 0]
    spans = []
    for ax, (label, trace) in zip(axes, traces, strict=True):
        events, span = minibatch_spans(trace, minibatch)
        spans.append(span)
        ranks = sorted(events["rank"].unique())
        for rank in ranks:
            ax.broken_barh([(0.0, span)], (rank - 0.4, 0.8), facecolors=IDLE[0], edgecolors="none", gid="idle")
            mine = events[events["rank"] == rank]
            for gid, (kinds, color, _) in KINDS.items():
                sel = mine[mine["kind"].isin(kinds)]
                if not sel.empty:
                    ax.broken_barh(list(zip(sel["t0"], sel["t1"] - sel["t0"], strict=True)),
                                   (rank - 0.4, 0.8), facecolors=color, edgecolors="none", gid=gid)
        ax.axvline(span, color="black", lw=1, ls="--", gid="end")
        ax.set_yticks(ranks)
        ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
        ax.set_ylabel(Y_LABEL)
        ax.set_title(f"{label}: minibatch takes {span:.3g} s", loc="left")
        ax.grid(False, axis="y")
    if len(traces) == 2:
        _mark_difference(axes, spans, [label for label, _ in traces])
    axes[-1].set_xlabel(X_LABEL)
    handles = [Patch(color=color, label=text) for _, color, text in KINDS.values()] + [Patch(color=IDLE[0],
                                                                                             label=IDLE[1])]
    fig.legend(handles=handles, loc="lower center", ncol=4, bbox_to_anchor=(0.5, -0.02), frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def _mark_difference(axes, spans: list[float], labels: list[str]) -> None:
    """Shade the gap between the two minibatch ends on the slower panel, saying what it is:
    the time the second saves over the first, or how much longer the second takes."""
    slow = 0 if spans[0] >= spans[1] else 1
    fast = 1 - slow
    diff = spans[slow] - spans[fast]
    text = (f"time saved {diff:.3g} s ({diff / spans[slow]:.0%})" if slow == 0
            else f"no time saved: {labels[1]} takes {diff:.3g} s ({diff / spans[fast]:.0%}) longer")
    ax = axes[slow]
    ax.axvspan(spans[fast], spans[slow], color="#f2c14e", alpha=0.35, gid="difference")
    ax.annotate(text, xy=(spans[fast], 0.5), xycoords=("data", "axes fraction"), xytext=(4, 0),
                textcoords="offset points", ha="left", va="center", fontsize=9, weight="bold")
    axes[fast].axvline(spans[slow], color="grey", lw=1, ls=":", gid="other_end")


# Cost models in the order a like-for-like pair prefers them: a model of the real cost first.
COST_PREFERENCE = ("calibrated", "flops", "quadratic", "linear")


def _pick(rows: pd.DataFrame, engine: str) -> pd.Series | None:
    mine = rows[rows["engine"] == engine]
    if mine.empty:
        return None
    rank = {b: i for i, b in enumerate(PREFERRED.get(engine, []))}
    return mine.assign(_r=mine["balancer"].map(lambda b: rank.get(b, len(rank)))).sort_values(["_r", "run_id"]).iloc[0]


def _cost_rank(cost_model: str) -> int:
    kind = str(cost_model).split(":")[0]
    return COST_PREFERENCE.index(kind) if kind in COST_PREFERENCE else len(COST_PREFERENCE)


def pair(rows: pd.DataFrame) -> list[pd.Series]:
    """The collective and the ODC run to draw: planned with the same cost model when the two
    engines share one (the preferred balancers first, then the cost model closest to the real
    cost), so the figure compares engines and balancers, not cost models."""
    if "cost_model" in rows:
        costs = rows["cost_model"].fillna("none").astype(str)
        shared = set(costs[rows["engine"] == "collective"]) & set(costs[rows["engine"] == "odc"])
        if shared:
            def score(cost: str) -> tuple:
                picked = [_pick(rows[costs == cost], e) for e in ("collective", "odc")]
                ranks = [PREFERRED[e].index(p["balancer"]) if p["balancer"] in PREFERRED[e] else 9
                         for e, p in zip(("collective", "odc"), picked, strict=True) if p is not None]
                return (sum(ranks), _cost_rank(cost), cost)

            best = min(shared, key=score)
            return [r for r in (_pick(rows[costs == best], e) for e in ("collective", "odc")) if r is not None]
    return [r for r in (_pick(rows, e) for e in ("collective", "odc")) if r is not None]


def draw(runs: pd.DataFrame) -> Figure:
    """The Fig. 1 panel pair for one source's runs (only runs whose trace file exists count)."""
    runs = with_traces(runs)
    if runs.empty:
        raise Skip("no run with a trace file")
    rows = golden(runs)  # labelled among all the source's traced runs
    picked = pair(rows)
    if not picked:
        raise Skip(f"no collective or odc run; engines found: {', '.join(sorted(rows['engine'].unique()))}")
    minibatch = int(picked[0].get("warmup_minibatches", 0) or 0)
    traces = [(r["series"], read_trace(r)) for r in picked]
    setting = describe_setting(picked[0])
    word = measured_or_simulated(runs)
    if len(picked) == 2:
        costs = {str(r.get("cost_model")) for r in picked}
        planned = (f"both planned with the {costs.pop()} cost model" if len(costs) == 1
                   else f"cost models differ: {' vs '.join(str(r.get('cost_model')) for r in picked)}")
        title = f"One minibatch ({word}), {setting}\n{planned}"
    else:
        engine = ENGINE_NAMES.get(picked[0]["engine"], picked[0]["engine"])
        title = f"One minibatch ({word}), {setting}\n(only {engine} runs in these results: nothing to compare against)"
    return plot(traces, minibatch, title)


def render(inputs: Inputs) -> dict[str, object]:
    return per_source(inputs.runs, NAME, draw, NO_RUNS)


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
