"""The paper's experiments (Figs. 8, 9 and 10) in simulation, and their table beside the paper.

    python -m odc_bench.studies.paper run     # the sweeps fig8_sft, fig10 and fig9_rl at the paper's settings
    python -m odc_bench.studies.paper table   # write docs/simulator_paper.md from their rows
                                                # (and the sim_scaling sweep's, results/sim_scaling)

`run` is the Hydra multiruns `python -m odc_bench sweep=fig8_sft`, `sweep=fig10` and
`sweep=fig9_rl` (the grids live in sweeps/*.yaml) with the paper's settings added: A100 profile,
bf16 compute with fp32 reduction, activation recomputation, no trace files; rows go to
results/sim_paper/runs.csv.
A sweep skips rows already there, so re-running `run` after a balancer lands adds only its
rows; `table` compares whatever is there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml
from omegaconf import OmegaConf

from odc_bench.config.compose import string_override
from odc_bench.errors import CommandParser, command_name, ends_cleanly
from odc_bench.files import atomic_write_text, writable_file
from odc_bench.provenance import REPO_ROOT
from odc_bench.results.paper import FIG10_TRENDS, RL_RANGE_TEXT, SFT_BUBBLE, SFT_SPEEDUP
from odc_bench.results.scaling import acceleration
from odc_bench.results.series import (
    HEADLINE_BASELINE,
    HEADLINE_ODC,
    LAYOUTS,
    ODC_LB_MICRO,
    VERL_BASELINE,
    series_key,
)
from odc_bench.results.table import read_table
from odc_bench.studies.pages import render

RESULTS = REPO_ROOT / "results" / "sim_paper"
SCALING = REPO_ROOT / "results" / "sim_scaling"
DOCS = REPO_ROOT / "docs" / "simulator_paper.md"
SWEEPS = REPO_ROOT / "sweeps"
SWEEPS_RUN = ("fig8_sft", "fig10", "fig9_rl")
PAPER_SETTINGS = ("backend=sim", "backend/hardware=a100", "precision=bf16", "backend.recompute=true",
                  "backend.write_trace=false")


def run(results_dir: Path) -> None:
    for sweep in SWEEPS_RUN:
        cmd = [sys.executable, "-m", "odc_bench", f"sweep={sweep}", *PAPER_SETTINGS,
               string_override("results_dir", results_dir)]
        print("+", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=REPO_ROOT, check=True)


def sweeper(name: str) -> dict:
    sweep = OmegaConf.to_container(OmegaConf.load(SWEEPS / f"{name}.yaml"))
    assert isinstance(sweep, dict)
    settings: dict = sweep["hydra"]["sweeper"]
    return settings


def fig8_devices() -> dict[str, int]:
    """Model -> device count, from the fig8_sft sweep's grids."""
    out = {}
    for grid in sweeper("fig8_sft")["grids"]:
        for model in str(grid["model"]).split(","):
            out[model.strip()] = int(grid["world_size"])
    return out


def fig10_setting() -> tuple[dict, dict[str, list]]:
    """The golden point and, per varied factor, its values, from the fig10 sweep."""
    s = sweeper("fig10")
    params = s["params"]
    golden = {k: params[k] for k in ("model", "dataset", "minibatch_size", "world_size", "packing_ratio",
                                     "dataset.length_scale")}
    factors = {k: [float(x) if "." in x else int(x) for x in str(v).split(",")]
               for grid in s["grids"] for k, v in grid.items()}
    return golden, factors


COMPARISONS = (("odc", "local_sort", "collective", "local_sort"), ("odc", "lb_micro", "collective", "lb_micro"),
               ("odc", "lb_mini", "collective", "lb_micro"))


def _key_columns(table: pd.DataFrame) -> pd.DataFrame:
    t = table[(table["status"] == "ok") & (table["backend"] == "sim")].copy()
    t["series"] = t["engine"] + "+" + t["balancer"]
    return t


def _series(s: pd.DataFrame, series: list[str], column: str) -> list[float | None]:
    """A column's value per series from rows indexed by series (None where a series did not run)."""
    return [s.loc[x, column] if x in s.index else None for x in series]


def fig8(t: pd.DataFrame) -> dict:
    """Fig. 8's cells: per model, dataset and minibatch size, every series' samples/s and bubble
    rate, the speedups of ODC's series over their baselines and what the paper reports there."""
    devices = fig8_devices()
    params = sweeper("fig8_sft")["params"]
    sizes = [int(x) for x in str(params["minibatch_size"]).split(",")]
    datasets = [x.strip() for x in str(params["dataset"]).split(",")]
    f8 = t[t["model"].isin(devices) & (t["packing_ratio"] == 1) & (t["length_scale"] == 1)
           & t["minibatch_size"].isin(sizes) & t["dataset"].isin(datasets)]
    f8 = f8[f8["world_size"] == f8["model"].map(devices)]
    series = sorted(set(f8["series"]))
    present = [c for c in COMPARISONS if {f"{c[0]}+{c[1]}", f"{c[2]}+{c[3]}"} <= set(series)]
    order = {m: i for i, m in enumerate(devices)}
    f8 = f8.sort_values(["model", "dataset", "minibatch_size"], key=lambda c: c.map(order) if c.name == "model" else c)
    rows = []
    for (model, dataset, mb), g in f8.groupby(["model", "dataset", "minibatch_size"], sort=False):
        s = g.set_index("series")
        notes = [f"{cmp}: {v}" for (m2, d2, mb2, cmp), v in SFT_SPEEDUP.items()
                 if (m2, d2, mb2) == (model, dataset, mb)]
        if (model, dataset, mb) in SFT_BUBBLE:
            notes.append("bubble " + SFT_BUBBLE[(model, dataset, mb)])
        rows.append({"model": model, "devices": devices[model], "dataset": dataset, "mb": mb,
                     "samples": _series(s, series, "samples_per_s"),
                     "speedups": [_speedup(s, f"{a}+{b}", f"{c}+{d}") for a, b, c, d in present],
                     "bubbles": _series(s, series, "bubble_rate"), "paper": notes})
    return {"series": series, "comparisons": [f"{a}+{b} vs {c}+{d}" for a, b, c, d in present], "rows": rows}


def _speedup(s: pd.DataFrame, x: str, y: str) -> float | None:
    """Series x's samples/s over series y's, minus 1, from rows indexed by series (None if either is missing)."""
    if x not in s.index or y not in s.index:
        return None
    return float(s.loc[x, "samples_per_s"] / s.loc[y, "samples_per_s"] - 1)


# Fig. 9's series (sweeps/fig9_rl.yaml): ODC's two against both collective ones.
RL_COMPARISONS = tuple((series_key(ours), series_key(baseline)) for ours, baseline in (
    (HEADLINE_ODC, VERL_BASELINE), (HEADLINE_ODC, HEADLINE_BASELINE), (ODC_LB_MICRO, VERL_BASELINE),
    (ODC_LB_MICRO, HEADLINE_BASELINE), (HEADLINE_BASELINE, VERL_BASELINE)))


def fig9(t: pd.DataFrame) -> dict:
    """Samples/s and speedups of the RL sweep (dataset=grpo rows), with the range of ODC's best
    speedups over the best collective series."""
    rl = t[t["dataset"] == "grpo"]
    series = sorted(set(rl["series"]))
    present = [c for c in RL_COMPARISONS if set(c) <= set(series)]
    order = {m: i for i, m in enumerate(fig8_devices())}
    rl = rl.sort_values(["model", "minibatch_size"], key=lambda c: c.map(order) if c.name == "model" else c)
    rows, best = [], []
    for (model, devices, mb), g in rl.groupby(["model", "world_size", "minibatch_size"], sort=False):
        s = g.set_index("series")
        group = (yaml.safe_load(g["config"].iloc[0]) or {}).get("dataset", {}).get("grpo", {}).get("group_size")
        rows.append({"model": model, "devices": devices, "mb": mb,
                     "prompts": devices * mb // group if group else None,
                     "samples": _series(s, series, "samples_per_s"),
                     "speedups": [_speedup(s, x, y) for x, y in present],
                     "bubbles": _series(s, series, "bubble_rate")})
        odc = s[s.index.str.startswith("odc+")]["samples_per_s"]
        coll = s[s.index.str.startswith("collective+")]["samples_per_s"]
        if not odc.empty and not coll.empty:
            best.append(odc.max() / coll.max() - 1)
    return {"series": series, "comparisons": [f"{x} vs {y}" for x, y in present], "rows": rows,
            "best": (min(best), max(best)) if best else None}


FIG10_COLUMN = {"minibatch_size": "minibatch_size", "dataset.length_scale": "length_scale",
                "packing_ratio": "packing_ratio", "world_size": "world_size"}


def fig10(t: pd.DataFrame) -> dict:
    """Fig. 10's axes around the golden point: per factor and value, the speedups and bubbles."""
    golden, factors = fig10_setting()
    present = [c for c in COMPARISONS if {f"{c[0]}+{c[1]}", f"{c[2]}+{c[3]}"} <= set(t["series"])]
    g = t[(t["model"] == golden["model"]) & (t["dataset"] == golden["dataset"])]
    series = sorted(set(g["series"]))
    axes = []
    for key, values in factors.items():
        rows = []
        for v in values:
            point = {**golden, key: v}
            sel = g[(g["minibatch_size"] == point["minibatch_size"]) & (g["world_size"] == point["world_size"])
                    & (g["packing_ratio"] == point["packing_ratio"])
                    & (g["length_scale"] == point["dataset.length_scale"])].set_index("series")
            rows.append({"value": 64 * v if key == "dataset.length_scale" else v,
                         "speedups": [_speedup(sel, f"{a}+{b}", f"{c}+{d}") for a, b, c, d in present],
                         "bubbles": _series(sel, series, "bubble_rate")})
        axes.append({"column": FIG10_COLUMN[key], "k_tokens": key == "dataset.length_scale",
                     "paper": FIG10_TRENDS[key], "rows": rows})
    return {"golden": golden, "series": series, "comparisons": [f"{a}+{b} vs {c}+{d}" for a, b, c, d in present],
            "axes": axes}


def scaling(scaling_dir: Path) -> dict:
    """The sim_scaling sweep: acceleration by device count, per layout (odc_bench/results/scaling.py)."""
    path = scaling_dir / "runs.csv"
    if not path.is_file():
        return {"path": _shown(path), "dir": _shown(scaling_dir), "layouts": None, "rows": []}
    t = acceleration(_key_columns(read_table(path)))
    present = [k for k in LAYOUTS if k in set(t["layout"])]
    rows = []
    for (model, dataset, devices), g in t.groupby(["model", "dataset", "world_size"], sort=True):
        by = g.set_index("layout")
        rows.append({"model": model, "dataset": dataset, "devices": devices,
                     "cells": [{"acceleration": by.loc[k, "acceleration"], "fits": bool(by.loc[k, "fits"]),
                                "samples_per_s": by.loc[k, "samples_per_s"]} if k in by.index else None
                               for k in present]})
    return {"path": _shown(path), "dir": _shown(scaling_dir), "layouts": [LAYOUTS[k] for k in present],
            "rows": rows}


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def table(results_dir: Path, docs: Path, scaling_dir: Path = SCALING) -> str:
    """docs/simulator_paper.md (templates/simulator_paper.md.j2) from the sweeps' rows; ValueError
    where they hold none of the figures' series (a page of empty tables was written)."""
    t = _key_columns(read_table(results_dir / "runs.csv"))
    f8, f10, f9 = fig8(t), fig10(t), fig9(t)
    if not (f8["series"] or f10["series"] or f9["series"]):
        raise ValueError(f"--results-dir {results_dir}'s runs.csv holds no successful simulated run of the sweeps "
                         f"{', '.join(SWEEPS_RUN)}")
    text = render("simulator_paper", source=_shown(results_dir.resolve() / "runs.csv"), sweeps=SWEEPS_RUN,
                  settings=PAPER_SETTINGS, fig8=f8, fig10=f10, fig9=f9, rl_range=RL_RANGE_TEXT,
                  scaling=scaling(scaling_dir))
    atomic_write_text(docs, text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = CommandParser(command_name(__spec__.name), description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("run", "table"),
                    help="run: the paper's sweeps in the simulator; table: the page from their rows")
    ap.add_argument("--results-dir", type=Path, default=RESULTS, help="where the sweeps' rows go and are read from")
    ap.add_argument("--docs", type=writable_file, default=DOCS, help="the page `table` writes")
    ap.add_argument("--scaling-dir", type=Path, default=SCALING, help="the sim_scaling sweep's rows")
    args = ap.parse_args(argv)
    if args.command == "table" and not (args.results_dir / "runs.csv").is_file():
        ap.error(f"--results-dir {args.results_dir} holds no runs.csv; `{ap.prog} run` writes it")
    if args.command == "run":
        run(args.results_dir)
        return
    try:
        text = table(args.results_dir, args.docs, args.scaling_dir)
    except ValueError as e:
        ap.error(f"{e}; `{ap.prog} run` writes them")
    print(text)


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
