"""The scaling study's numbers (sweeps/sim_scaling.yaml): ODC's acceleration over the collective
baseline per layout and device count, shared by its figure (paper_figures/scaling.py) and its
table (odc_bench.studies.paper table).

Acceleration at a device count = ODC + LB-Mini samples/s / Collective + LB-Micro samples/s - 1,
in %, both runs at the same setting and seed. The baseline runs the same layout (series.layouts):
hybrid-sharded ODC against FSDP2's HSDP, full sharding against full sharding; topology-aware
fetch changes ODC's gathers only, so its baseline is the full-sharding collective run. A setting
fits when both runs' memory estimates are within the device's memory.
"""

from __future__ import annotations

import pandas as pd

from odc_bench.results.series import HEADLINE_BASELINE, HEADLINE_ODC, SETTING, layouts, with_workload

ODC, BASELINE = HEADLINE_ODC, HEADLINE_BASELINE
# What stays fixed along one line besides the layout and the device count.
KEYS = [c for c in SETTING if c != "world_size"]


def acceleration(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per layout, setting and device count with an ODC + LB-Mini run and its baseline:
    `acceleration` (%), both throughputs, and `fits`."""
    runs = with_workload(runs).assign(layout=layouts(runs))
    keys = [k for k in KEYS if k in runs] + ["world_size"]
    limit = runs["mem_limit_mb"] if "mem_limit_mb" in runs else pd.Series(float("nan"), index=runs.index)
    estimate = runs["mem_estimate_mb"] if "mem_estimate_mb" in runs else pd.Series(0.0, index=runs.index)
    runs = runs.assign(fits=estimate.le(limit) | limit.isna())

    def series(engine: str, balancer: str) -> pd.DataFrame:
        part = runs[(runs["engine"] == engine) & (runs["balancer"] == balancer)]
        return (part.groupby([*keys, "layout"], dropna=False)
                .agg(samples_per_s=("samples_per_s", "mean"), fits=("fits", "all")).reset_index())

    odc, base = series(*ODC), series(*BASELINE)
    odc["base_layout"] = odc["layout"].where(odc["layout"] != "nearest", "")
    base = base.rename(columns={"layout": "base_layout", "samples_per_s": "baseline_samples_per_s",
                                "fits": "baseline_fits"})
    table = odc.merge(base, on=[*keys, "base_layout"], how="inner")
    table["acceleration"] = 100 * (table["samples_per_s"] / table["baseline_samples_per_s"] - 1)
    table["fits"] = table["fits"] & table["baseline_fits"]
    table = table.drop(columns=["base_layout", "baseline_fits"])
    return table.sort_values(["model", "dataset", "layout", "world_size"]).reset_index(drop=True)
