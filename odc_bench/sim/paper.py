"""The paper's SFT experiments (Figs. 8 and 10) in simulation, and their table beside the paper.

    python -m odc_bench.sim.paper run     # simulate every grid point not yet in the table
    python -m odc_bench.sim.paper table   # write docs/simulator_paper.md from the table

`run` appends rows to results/sim/paper/runs.csv (backend=sim, A100 profile, bf16 with fp32
reduction, activation recomputation, length_scale 1, max_tokens = the longest sample times
the packing ratio), one per engine x balancer x setting, skipping rows already there. It uses
every balancer registered in odc_bench.balancers at the time, so re-running it after new
balancers land adds their rows; `table` then compares what is there.

Device counts per model for Fig. 8 are our assumption (docs/simulator.md): the shared paper
notes give only "up to 32 A100s" and 8 devices for the golden setting.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pandas as pd

from odc_bench.balancers import BALANCERS, UNEQUAL_COUNTS
from odc_bench.config import resolve
from odc_bench.results import atomic_write_text, completed_keys, read_table
from odc_bench.sim.calibrate import compose_config
from odc_bench.sim.hardware import REPO_ROOT

RESULTS = REPO_ROOT / "results" / "sim" / "paper"
DOCS = REPO_ROOT / "docs" / "simulator_paper.md"
COMMON = ("backend=sim", "backend/hardware=a100", "backend.recompute=true", "backend.write_trace=false",
          "precision=bf16", "dataset.length_scale=1", "max_tokens=null", "num_minibatches=40",
          "warmup_minibatches=0")
FIG8_WORLD = {"qwen2_1p5b": 8, "qwen2_7b": 16, "qwen2_14b": 32, "qwen2_32b": 32}
FIG8_MINIBATCH = (1, 2, 4, 8)
# Fig. 10 varies one factor of the golden setting (1.5B, LongAlign, 4 samples per device,
# 8 devices, packing ratio 1) at a time. Max length is varied through length_scale: LongAlign's
# 64K maximum times 1/8 ... 2 gives 8K ... 128K.
GOLDEN = {"model": "qwen2_1p5b", "dataset": "longalign", "minibatch_size": 4, "world_size": 8,
          "packing_ratio": 1, "dataset.length_scale": 1}
FIG10 = {
    "minibatch_size": (1, 2, 4, 8, 16),
    "dataset.length_scale": (0.125, 0.25, 0.5, 1, 2),
    "packing_ratio": (1, 2, 4, 8),
    "world_size": (8, 16, 32),
}
# Engine x balancer series as in the paper's figures; the ones whose balancer is not
# registered yet are skipped.
SERIES = (("collective", "local_sort"), ("odc", "local_sort"), ("collective", "lb_micro"),
          ("odc", "lb_micro"), ("odc", "lb_mini"))


def series() -> list[tuple[str, str]]:
    return [(e, b) for e, b in SERIES if b in BALANCERS and not (e == "collective" and b in UNEQUAL_COUNTS)]


def settings() -> list[tuple[str, dict]]:
    """(figure, setting) pairs: every Fig. 8 cell and every Fig. 10 point."""
    out = []
    for (model, world), dataset, mb in itertools.product(FIG8_WORLD.items(), ("longalign", "swe_smith"),
                                                         FIG8_MINIBATCH):
        out.append(("fig8", dict(model=model, dataset=dataset, minibatch_size=mb, world_size=world,
                                 packing_ratio=1, **{"dataset.length_scale": 1})))
    for key, values in FIG10.items():
        for v in values:
            out.append((f"fig10:{key}", {**GOLDEN, key: v}))
    return out


def overrides(setting: dict, engine: str, balancer: str) -> list[str]:
    return [*COMMON, *(f"{k}={v}" for k, v in setting.items()), f"engine={engine}", f"balancer={balancer}"]


def run(results_dir: Path) -> None:
    from odc_bench.app import execute_sim

    done = completed_keys(results_dir / "runs.csv")
    todo = [(fig, s, e, b) for fig, s in settings() for e, b in series()]
    for i, (fig, setting, engine, balancer) in enumerate(todo):
        spec = resolve(compose_config(overrides(setting, engine, balancer)))
        if spec.run_id in done:
            continue
        row = execute_sim(spec, results_dir)
        done.add(spec.run_id)
        print(f"[{i + 1}/{len(todo)}] {fig} {engine}+{balancer} {setting}: {row['samples_per_s']:.3f} samples/s, "
              f"bubble {row['bubble_rate']:.2f}", flush=True)


# What the shared paper notes (/work/shared/PAPER.md) report, keyed by setting and comparison.
PAPER = {
    ("qwen2_14b", "longalign", 4, "odc+lb_mini vs collective+lb_micro"): "+36% (45.1 -> 61.4)",
    ("qwen2_14b", "longalign", 4, "odc+lb_micro vs collective+lb_micro"): "+28%",
    ("qwen2_1p5b", "longalign", 4, "odc+lb_mini vs collective+lb_micro"): "+34%",
    ("qwen2_1p5b", "longalign", 4, "odc+lb_micro vs collective+lb_micro"): "+16%",
    ("qwen2_32b", "longalign", 2, "odc+lb_mini vs collective+lb_micro"): "-2% (17.3 -> 17.0)",
}
PAPER_BUBBLE = {("qwen2_14b", "longalign", 4): "collective+lb_micro 57%, odc+lb_mini 14%"}
COMPARISONS = (("odc", "local_sort", "collective", "local_sort"), ("odc", "lb_micro", "collective", "lb_micro"),
               ("odc", "lb_mini", "collective", "lb_micro"))


def _key_columns(table: pd.DataFrame) -> pd.DataFrame:
    t = table[(table["status"] == "ok") & (table["backend"] == "sim")].copy()
    t["series"] = t["engine"] + "+" + t["balancer"]
    return t


def fig8_table(t: pd.DataFrame) -> list[str]:
    lines = ["## Fig. 8: SFT throughput, simulated (A100)", "",
             "Samples/s per series, speedup of each ODC series over its collective baseline, and bubble rates. "
             "Paper column: what the shared paper notes report for that cell (blank: not reported there).", ""]
    present = [c for c in COMPARISONS if {f"{c[0]}+{c[1]}", f"{c[2]}+{c[3]}"} <= set(t["series"])]
    head = ["model", "devices", "dataset", "mb/device"]
    head += [f"{s} samples/s" for s in sorted(set(t["series"]))]
    head += [f"{a}+{b} vs {c}+{d}" for a, b, c, d in present]
    head += [f"bubble {s}" for s in sorted(set(t["series"]))]
    head += ["paper"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    f8 = t[t["model"].isin(FIG8_WORLD) & (t["packing_ratio"] == 1) & (t["length_scale"] == 1)
           & t["minibatch_size"].isin(FIG8_MINIBATCH)]
    f8 = f8[f8.apply(lambda r: r["world_size"] == FIG8_WORLD[r["model"]], axis=1)]
    for (model, dataset, mb), g in f8.groupby(["model", "dataset", "minibatch_size"], sort=False):
        s = g.set_index("series")
        cells = [model, str(FIG8_WORLD[model]), dataset, str(mb)]
        cells += [f"{s.loc[x, 'samples_per_s']:.3f}" if x in s.index else "" for x in sorted(set(t["series"]))]
        for a, b, c, d in present:
            x, y = f"{a}+{b}", f"{c}+{d}"
            ok = x in s.index and y in s.index
            cells.append(f"{s.loc[x, 'samples_per_s'] / s.loc[y, 'samples_per_s'] - 1:+.1%}" if ok else "")
        cells += [f"{s.loc[x, 'bubble_rate']:.0%}" if x in s.index else "" for x in sorted(set(t["series"]))]
        notes = [f"{cmp}: {v}" for (m2, d2, mb2, cmp), v in PAPER.items() if (m2, d2, mb2) == (model, dataset, mb)]
        if (model, dataset, mb) in PAPER_BUBBLE:
            notes.append("bubble " + PAPER_BUBBLE[(model, dataset, mb)])
        cells.append("; ".join(notes))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


FIG10_PAPER = {
    "minibatch_size": "peaks at a moderate minibatch size; about equal at 1",
    "dataset.length_scale": "about +25% at 8K rising to about +35% at 128K",
    "packing_ratio": "falls with packing ratio, about +15% at ratio 8",
    "world_size": "rises with the device count (up to 32)",
}
FIG10_COLUMN = {"minibatch_size": "minibatch_size", "dataset.length_scale": "length_scale",
                "packing_ratio": "packing_ratio", "world_size": "world_size"}


def fig10_table(t: pd.DataFrame) -> list[str]:
    lines = ["## Fig. 10: acceleration of ODC over collective, simulated (A100, 1.5B, LongAlign)", ""]
    present = [c for c in COMPARISONS if {f"{c[0]}+{c[1]}", f"{c[2]}+{c[3]}"} <= set(t["series"])]
    g = t[(t["model"] == GOLDEN["model"]) & (t["dataset"] == GOLDEN["dataset"])]
    for key, values in FIG10.items():
        col = FIG10_COLUMN[key]
        label = "max length (K tokens)" if key == "dataset.length_scale" else col
        lines += [f"### {label} (paper: {FIG10_PAPER[key]})", ""]
        head = [label, *(f"{a}+{b} vs {c}+{d}" for a, b, c, d in present),
                *(f"bubble {s}" for s in sorted(set(t["series"])))]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for v in values:
            point = {**GOLDEN, key: v}
            sel = g[(g["minibatch_size"] == point["minibatch_size"]) & (g["world_size"] == point["world_size"])
                    & (g["packing_ratio"] == point["packing_ratio"])
                    & (g["length_scale"] == point["dataset.length_scale"])].set_index("series")
            shown = f"{64 * v:g}" if key == "dataset.length_scale" else str(v)
            cells = [shown]
            for a, b, c, d in present:
                x, y = f"{a}+{b}", f"{c}+{d}"
                ok = x in sel.index and y in sel.index
                cells.append(f"{sel.loc[x, 'samples_per_s'] / sel.loc[y, 'samples_per_s'] - 1:+.1%}" if ok else "")
            cells += [f"{sel.loc[x, 'bubble_rate']:.0%}" if x in sel.index else "" for x in sorted(set(t["series"]))]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def table(results_dir: Path, docs: Path) -> str:
    t = _key_columns(read_table(results_dir / "runs.csv"))
    missing = [f"{e}+{b}" for e, b in SERIES if b not in BALANCERS]
    lines = ["# The paper's SFT experiments in simulation", "",
             "Generated by `python -m odc_bench.sim.paper table` from "
             f"`{(results_dir / 'runs.csv').relative_to(REPO_ROOT)}`; do not edit by hand. "
             "The model, the settings and why the numbers differ from the paper's: docs/simulator.md.", ""]
    if missing:
        lines += [f"Series not simulated yet (balancer not registered): {', '.join(missing)}. "
                  "Re-run `python -m odc_bench.sim.paper run` and `table` once they land.", ""]
    lines += fig8_table(t) + [""] + fig10_table(t)
    text = "\n".join(lines) + "\n"
    atomic_write_text(docs, text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("run", "table"))
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--docs", type=Path, default=DOCS)
    args = ap.parse_args(argv)
    if args.command == "run":
        run(args.results_dir)
    else:
        print(table(args.results_dir, args.docs))


if __name__ == "__main__":
    main()
