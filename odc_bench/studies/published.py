"""The GPU profiles held to published GPU measurements: fitted, and validated leave-one-source-out.

    python -m odc_bench.studies.published    # -> results/validation/gpu-*.csv, docs/gpu_validation.md

Every point of results/published/points.csv that the simulator can run as published is
simulated as collective FSDP on its GPU's stock profile (a100, h100, h200): its model's family and
shape, its sequence length (every sample that long), samples per GPU per step, GPUs and GPUs per
node, the network and sharding it states, bf16 and its activation checkpointing. Per GPU type
the profile's efficiency constants are fitted to its points as odc_bench.calibrate.cluster_profile fits a
user's runs (least squares on log tokens/s, only the constants the points can tell apart), once
on every point and once per source with that source left out; a source's leave-one-source-out
error is its points' error under the fit that did not see them. The what-if quotes those errors
as its GPU band (accuracy.py).

Points left out, each with its reason in the output: float8 runs (not bf16), block-level
selective checkpointing whose share of blocks the source does not state, GPUs without a stock
profile, and shapes the harness cannot hold.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from odc_bench.calibrate.cluster_profile import FREE, Measured, base_profile, fit, predict, with_hardware
from odc_bench.config.backend import GpuHardwareConfig, SimBackendConfig
from odc_bench.errors import CommandParser, ConfigError, command_name, ends_cleanly, said
from odc_bench.files import atomic_write_text, missing_inputs, readable_file, writable_file, writable_folder
from odc_bench.models.memory import unit_params
from odc_bench.plan.spec import resolve
from odc_bench.provenance import REPO_ROOT
from odc_bench.record.row import sim_timing
from odc_bench.results.series import HEADLINE_BASELINE, HEADLINE_ODC, SETTING, with_workload
from odc_bench.results.table import some_of
from odc_bench.sim import simulate
from odc_bench.studies.pages import render
from odc_bench.whatif.answer import compose_config

POINTS = REPO_ROOT / "results" / "published" / "points.csv"
# results/sim_paper's sweeps as tools/sim_paper runs them, on the stock and on the fitted A100 profile
SIM_PAPER = REPO_ROOT / "results" / "sim_paper" / "runs.csv"
SIM_PAPER_FIT = REPO_ROOT / "results" / "sim_paper_fit" / "runs.csv"
OUT = REPO_ROOT / "results" / "validation"
DOC = REPO_ROOT / "docs" / "gpu_validation.md"
CONF = REPO_ROOT / "odc_bench" / "conf" / "backend" / "hardware"
FITTED = "_fit"  # a100_fit, h100_fit: the stock profiles with the constants fitted to every point
# The published GPU names and the stock profile each is simulated on. The HBM2e H100 (torchtitan's
# 500 W cap) runs on the H100 profile with its stated bandwidth (HBM): its cap is what that
# source's error shows.
PROFILE = {"A100-SXM": "a100", "H100-SXM": "h100", "H100-SXM (HBM2e)": "h100", "H200": "h200"}
# Where a source states its GPU's memory bandwidth and it differs from the stock profile's:
# torchtitan's Grand Teton H100s, "96GB HBM2e with 2.4 TB/sec peak memory bandwidth"
# (github.com/pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, "Hardware"). Their
# 500 W cap is not here: the source says their peak FLOP/s lies between the SXM's and the NVL's
# and that it does not know the number.
HBM = {"H100-SXM (HBM2e)": ["backend.hardware.hbm_gbps=2400"]}
SHARDING = {"HSDP": ["engine.shard=hybrid"]}
CHECKPOINTING = {"none": ["backend.recompute=false"], "full": ["backend.recompute=true"],
                 "selective (op)": ["backend.recompute=true", "backend.recompute_mode=op"]}
FIXED_LENGTH = 65_536  # the `fixed` length profile's; dataset.length_scale brings it to seq_len
MINIBATCHES = 1  # every sample alike: one minibatch is the steady state


def left_out(point: pd.Series) -> str | None:
    """Why the simulator cannot run a point as published, or None."""
    if "float8" in str(point["precision"]):
        return "float8 linears: not a bf16 run"
    if point["gpu"] not in PROFILE:
        return f"no stock profile for {point['gpu']}"
    if point["activation_checkpointing"] not in CHECKPOINTING:
        return f"{point['activation_checkpointing']}: the share of blocks checkpointed is not stated"
    if pd.isna(point["tokens_per_s_per_gpu"]):
        return "no tokens/s per GPU"
    return None


def network(point: pd.Series) -> list[str]:
    """The network a point states, as the profile's numbers: `nic_gbps` is a node's, in GB/s each
    way. "per GPU" gives one NIC (rail) per GPU; a rate stated per node, or without saying which,
    is the node's (the smaller reading: docs/published.md); none stated keeps the profile's."""
    rate = re.match(r"(\d+) Gb(?:ps|/s)", str(point["network"]) if pd.notna(point["network"]) else "")
    if rate is None:
        return []
    per_node, rails = int(point["gpus_per_node"]), 1
    if "per GPU" in str(point["network"]):
        rails = per_node
    return [f"backend.hardware.nic_gbps={int(rate.group(1)) * rails / 8:g}", f"backend.hardware.nic_rails={rails}"]


def overrides(point: pd.Series) -> list[str]:
    """The `python -m odc_bench` settings that simulate a point as published."""
    family = "mpt" if point["mlp"] == "gelu" else "llama"
    seq, micro = int(point["seq_len"]), int(point["microbatch_per_gpu"])
    return ["backend=sim", f"backend/hardware={PROFILE[point['gpu']]}", "backend.write_trace=false",
            f"backend.hardware.gpus_per_node={int(point['gpus_per_node'])}",
            f"backend.hardware.memory_gb={float(point['gpu_memory_gb']):g}", *network(point),
            *HBM.get(str(point["gpu"]), []),
            *SHARDING.get(str(point["sharding"]), []),
            *CHECKPOINTING[point["activation_checkpointing"]],
            "model=tiny", f"model.name=published-{int(point['point_id'])}", f"model.family={family}",
            f"model.vocab_size={int(point['vocab'])}", f"model.hidden_size={int(point['d_model'])}",
            f"model.intermediate_size={int(point['ffn_hidden'])}", f"model.num_layers={int(point['n_layers'])}",
            f"model.num_heads={int(point['n_heads'])}", f"model.num_kv_heads={int(point['n_kv_heads'])}",
            # MPT ties its embeddings (the parameter count llm-foundry prints says so: conf/model/mpt_7b.yaml)
            f"model.tie_embeddings={str(family == 'mpt').lower()}",
            "dataset=fixed", f"dataset.length_scale={seq / FIXED_LENGTH!r}", f"world_size={int(point['gpus'])}",
            f"dataset.num_samples={int(point['gpus']) * micro * int(point['grad_accum']) * MINIBATCHES}",
            f"minibatch_size={micro * int(point['grad_accum'])}", f"max_tokens={micro * seq}",
            f"num_minibatches={MINIBATCHES}", "warmup_minibatches=0", "precision=bf16", "engine=collective",
            "balancer=lb_micro", "balancer.cost_model=flops"]


def measured_points(points: pd.DataFrame) -> tuple[list[Measured], pd.DataFrame]:
    """The points the simulator runs, planned, and the ones left out with their reasons."""
    runs, dropped = [], []
    for _, point in points.iterrows():
        reason = left_out(point)
        if reason is None:
            try:
                spec = resolve(compose_config(overrides(point)))
            except ConfigError as e:
                reason = f"the harness cannot run it: {e}"
        if reason is not None:
            dropped.append({"point_id": point["point_id"], "source_id": point["source_id"], "reason": reason})
            continue
        runs.append(Measured(int(point["point_id"]), spec, float(point["tokens_per_s_per_gpu"]),
                             (point["source_id"], PROFILE[point["gpu"]])))
    return runs, pd.DataFrame(dropped, columns=["point_id", "source_id", "reason"])


Fitted = dict[str, dict[str, GpuHardwareConfig]]  # per GPU profile: "every point", "without SOURCE"
# Constants a GPU's profile takes from a measurement of its own kernels, which its fits keep: the
# H100's matrix multiplies and attention (results/gpu/h100-2026-11-26; docs/simulator.md), so that
# the published points fit what they can tell apart (the network, links, overheads).
PINNED = {"h100": ("matmul_efficiency", "attention_efficiency")}
EVERY = "every point"


def validate(runs: list[Measured]) -> tuple[pd.DataFrame, Fitted]:
    """Per point: measured, simulated on the stock profile, on the profile fitted to every point
    of its GPU, and on the one fitted without its source; and those fits. A GPU whose points
    come from one source gets no fitted profile: no source would be left to validate it."""
    rows, fitted = [], {}
    for profile in sorted({r.setting[1] for r in runs}):
        group = [r for r in runs if r.setting[1] == profile]
        base = base_profile(profile)
        sources = {r.setting[0] for r in group}
        pinned = PINNED.get(profile, ())
        every = fit(group, base, f"{profile}{FITTED}", worst_residual=None, pinned=pinned) if len(sources) > 1 else None
        if every is not None:
            fitted[profile] = {EVERY: every.hardware}
        stock = predict(group, base)
        held_out = np.full(len(group), np.nan)
        for source in sorted({r.setting[0] for r in group}):
            train = [r for r in group if r.setting[0] != source]
            if not train:
                continue
            without = fit(train, base, "loso", most=max(1, len(train) - 1), worst_residual=None, pinned=pinned)
            idx = [i for i, r in enumerate(group) if r.setting[0] == source]
            held_out[idx] = predict([group[i] for i in idx], without.hardware)
            if every is not None:
                fitted[profile][f"without {source}"] = without.hardware
        for i, r in enumerate(group):
            backend = r.spec.config.backend
            assert isinstance(backend, SimBackendConfig) and isinstance(backend.hardware, GpuHardwareConfig)
            hw = backend.hardware  # the point's own: its node size and network (GB/s per node)
            rows.append({"point_id": r.row, "source_id": r.setting[0], "profile": profile,
                         "params": sum(unit_params(r.spec.config.model)), "gpus": r.spec.world_size,
                         "seq_len": max(r.spec.minibatches[0].lengths),
                         "gpus_per_node": hw.gpus_per_node, "network_gbps": 8 * hw.nic_gbps,
                         "model": r.spec.config.model.name,
                         "measured": r.tokens_per_s_per_gpu, "stock": stock[i],
                         "fitted": np.nan if every is None else every.predicted[i],
                         "held_out": held_out[i]})
    table = pd.DataFrame(rows)
    for col in ("stock", "fitted", "held_out"):
        table[f"{col}_error"] = table[col] / table["measured"] - 1
    return table, fitted


def stated_networks(table: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """The validation table with each point's network (Gbps per node, as simulated) kept only where
    its source states one: a network the stock profile assumed validates nothing about networks."""
    stated = {int(p["point_id"]) for _, p in points.iterrows() if network(p)}
    return table.assign(network_gbps=table["network_gbps"].where(table["point_id"].isin(stated)))


def ratio_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """Every pair of one source's points on one model: the measured ratio of their throughputs
    and the error of each simulated ratio (what the what-if's speedups are), held out and not."""
    rows = []
    for (profile, source, _), part in table.groupby(["profile", "source_id", "params"], sort=True):
        part = part.reset_index(drop=True)
        for i in range(len(part)):
            for j in range(i + 1, len(part)):
                a, b = part.loc[i], part.loc[j]
                measured = a["measured"] / b["measured"]
                row = {"profile": profile, "source_id": source, "point_a": a["point_id"], "point_b": b["point_id"],
                       "measured_ratio": measured}
                for col in ("stock", "fitted", "held_out"):
                    row[f"{col}_error"] = (a[col] / b[col]) / measured - 1
                rows.append(row)
    return pd.DataFrame(rows)


def profiles_table(fitted: Fitted) -> pd.DataFrame:
    """Each constant: the datasheet's, fitted to every point, and fitted without each source."""
    rows = []
    for profile, fits in fitted.items():
        base = base_profile(profile)
        for name in FREE:
            row = {"profile": profile, "constant": name, "datasheet": getattr(base, name)}
            row.update({"fitted" if label == EVERY else label: getattr(hw, name) for label, hw in fits.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def paper_cells(fitted: dict[str, GpuHardwareConfig]) -> pd.DataFrame:
    """The paper's two headline cells (results/paper.py) on the stock A100 profile, the fitted
    one, and the stock one with each fitted constant alone (what moves them, measured): ODC +
    LB-Mini over Collective + LB-Micro, and both bubble rates."""
    stock = base_profile("a100")
    variants = [("stock", stock)]
    if "a100" in fitted:
        moved = [n for n in FREE if getattr(fitted["a100"], n) != getattr(stock, n)]
        variants += [("fitted", fitted["a100"])]
        variants += [(f"stock, {n} fitted", replace(stock, **{n: getattr(fitted["a100"], n)})) for n in moved]
    rows = []
    for model, world, minibatch in (("qwen2_14b", 16, 4), ("qwen2_32b", 32, 2)):
        specs = {engine: resolve(compose_config([
            "backend=sim", "backend/hardware=a100", "precision=bf16", "backend.recompute=true",
            "backend.write_trace=false", f"model={model}", "dataset=longalign", "dataset.length_scale=1",
            f"world_size={world}", f"minibatch_size={minibatch}", "num_minibatches=50", "warmup_minibatches=2",
            f"engine={engine}", f"balancer={balancer}"])) for engine, balancer in (("collective", "lb_micro"),
                                                                                   ("odc", "lb_mini"))}
        for label, hardware in variants:
            out = {}
            for engine, spec in specs.items():
                spec = with_hardware(spec, hardware)
                out[engine] = sim_timing(spec, simulate(spec, trace=False))
            rows.append({"cell": f"{model} longalign minibatch {minibatch}, {world} GPUs", "profile": label,
                         "speedup": out["odc"]["samples_per_s"] / out["collective"]["samples_per_s"] - 1,
                         "bubble_collective": out["collective"]["bubble_rate"],
                         "bubble_odc": out["odc"]["bubble_rate"]})
    return pd.DataFrame(rows)


def profile_file(hardware: GpuHardwareConfig, points: int) -> str:
    """A fitted profile as a backend/hardware config file."""
    base = base_profile(hardware.name.removesuffix(FITTED))
    moved = ", ".join(f"{n} {getattr(base, n):g} -> {getattr(hardware, n):.4g}" for n in FREE
                      if getattr(base, n) != getattr(hardware, n))
    header = (f"# Written by `python -m odc_bench.studies.published`; do not edit. The {base.name} profile with the\n"
              f"# constants fitted to its {points} published GPU measurements (docs/gpu_validation.md): {moved}.\n")
    values = {f.name: getattr(hardware, f.name) for f in fields(GpuHardwareConfig)}
    return header + yaml.safe_dump(values, sort_keys=False)


def headline_speedups(runs: pd.DataFrame) -> pd.Series:
    """ODC + LB-Mini over Collective + LB-Micro (results/series.py's headline pair) per setting."""
    ok = with_workload(runs[runs["status"] == "ok"])
    keys = [c for c in SETTING if c in ok]
    rate = ok.groupby([*keys, "engine", "balancer"], dropna=False)["samples_per_s"].mean()
    ours = rate.xs(HEADLINE_ODC, level=["engine", "balancer"])
    base = rate.xs(HEADLINE_BASELINE, level=["engine", "balancer"])
    return (ours / base - 1).dropna()


def paper_moves(stock: Path, fitted: Path) -> pd.DataFrame:
    """Every setting of the paper-scale sweeps with its headline speedup on the stock A100 profile
    (results/sim_paper) and on the fitted one (results/sim_paper_fit)."""
    both = pd.concat({"stock": headline_speedups(pd.read_csv(stock)),
                      "fitted": headline_speedups(pd.read_csv(fitted))}, axis=1).dropna()
    both["move"] = both["fitted"] - both["stock"]
    return both.reset_index()


def _csv(table: pd.DataFrame, path: Path) -> None:
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    atomic_write_text(path, buf.getvalue())


def by_source(table: pd.DataFrame) -> pd.DataFrame:
    """Per GPU profile and source: points, and the median and worst |error| stock, fitted and held out."""
    rows = []
    for (profile, source), part in table.groupby(["profile", "source_id"], sort=True):
        row = {"profile": profile, "source_id": source, "points": len(part)}
        for col in ("stock", "fitted", "held_out"):
            err = part[f"{col}_error"].abs()
            row[f"{col}_median"], row[f"{col}_worst"] = err.median(), err.max()
        rows.append(row)
    return pd.DataFrame(rows)


def _run(r: pd.Series) -> dict:
    """How a published point ran, for the page."""
    return {"gpus": r["gpus"], "memory_gb": r["gpu_memory_gb"], "seq_len": r["seq_len_published"],
            "samples": int(r["microbatch_per_gpu"]), "microbatches": int(r["grad_accum"]),
            "checkpointing": r["activation_checkpointing"]}


def worst_point(points: pd.DataFrame, table: pd.DataFrame, profiles: pd.DataFrame, profile: str) -> dict:
    """A profile's worst held-out point beside the same model's other runs in its source, and the
    fit that held it out (`held_out_fit`)."""
    part = table[table["profile"] == profile].merge(points, on="point_id", suffixes=("", "_published"))
    worst = part.loc[part["held_out_error"].abs().idxmax()]
    same = part[(part["source_id"] == worst["source_id"]) & (part["model_published"] == worst["model_published"])
                & (part["point_id"] != worst["point_id"])]
    return {"profile": profile, "point_id": worst["point_id"], "source": worst["source_id"],
            "model": worst["model_published"], "run": _run(worst), "measured": worst["measured"],
            "held_out": worst["held_out_error"], "stock": worst["stock_error"],
            "others": [{"point_id": r["point_id"], "run": _run(r), "measured": r["measured"],
                        "held_out": r["held_out_error"]} for _, r in same.iterrows()],
            "fit": held_out_fit(part, profiles, profile, worst)}


def held_out_fit(part: pd.DataFrame, profiles: pd.DataFrame, profile: str, worst: pd.Series) -> dict:
    """What the fit that held a point's source out saw, and the constants where it parts from the
    fit to every point."""
    source = worst["source_id"]
    seen = part[part["source_id"] != source]
    constants = profiles[profiles["profile"] == profile].set_index("constant")
    without = constants[f"without {source}"]
    # A constant the held-out fit left a tenth or more from the every-point fit is where the
    # other sources pulled it; smaller differences are the fit's own noise.
    apart = [(name, without[name], constants.loc[name, "fitted"]) for name in constants.index
             if abs(without[name] / constants.loc[name, "fitted"] - 1) >= 0.1]
    return {"source": source, "points": len(seen), "by_source": list(seen["source_id"].value_counts().sort_index()
                                                                     .items()),
            "seq_len": (seen["seq_len"].min(), seen["seq_len"].max()), "gpus": (seen["gpus"].min(), seen["gpus"].max()),
            "apart": apart, "fitted_error": worst["fitted_error"]}


TARGET = (0.10, 0.25)  # issue 32's bar for held-out tokens/s error: median and worst |error|


def unstated_networks(table: pd.DataFrame, profiles: pd.DataFrame) -> list[dict]:
    """Per profile whose NIC efficiency a held-out fit moves: which of its sources state no
    network, and what the fit that learned the constant from them made of a stated one."""
    out = []
    for profile, part in table.groupby("profile", sort=True):
        unstated = sorted(part.loc[part["network_gbps"].isna(), "source_id"].unique())
        nic = profiles[(profiles["profile"] == profile) & (profiles["constant"] == "nic_efficiency")]
        if not unstated or nic.empty:
            continue
        nic = nic.iloc[0]
        assumed = 8 * base_profile(profile).nic_gbps
        for source, sub in part[part["network_gbps"].notna()].groupby("source_id"):
            without = nic.get(f"without {source}")
            if pd.isna(without) or abs(without / nic["fitted"] - 1) < 0.25:
                continue
            stated, fitted = float(sub["network_gbps"].iloc[0]), nic["fitted"]
            out.append({"profile": profile, "source": source,
                        "held_out": sub.loc[sub["held_out_error"].abs().idxmax(), "held_out_error"],
                        "unstated": unstated, "others": sorted(set(part["source_id"]) - {source}),
                        "assumed_gbps": assumed, "stated_gbps": stated, "without": without, "fitted": fitted,
                        "without_on_assumed": without * assumed, "without_on_stated": without * stated,
                        "fitted_on_stated": fitted * stated, "fitted_on_assumed": fitted * assumed})
    return out


def _span(points: pd.DataFrame, mode: str) -> tuple[int, int]:
    sizes = points.loc[points["activation_checkpointing"] == mode, "microbatch_per_gpu"]
    return sizes.min(), sizes.max()


def against_the_bar(table: pd.DataFrame) -> list[dict]:
    """Per GPU profile: its held-out |error| against TARGET, or, where one source gives all its
    points (no fit, nothing held out), the stock profile's |error|."""
    out = []
    for profile, part in table.groupby("profile", sort=True):
        err = part["held_out_error"].abs()
        if err.isna().all():
            stock = part["stock_error"].abs()
            out.append({"profile": profile, "sources": sorted(part["source_id"].unique()), "points": len(part),
                        "held_out": False, "median": stock.median(), "worst": stock.max()})
        else:
            out.append({"profile": profile, "points": len(part), "held_out": True, "median": err.median(),
                        "worst": err.max(), "ok": err.median() <= TARGET[0] and err.max() <= TARGET[1]})
    return out


def misses(points: pd.DataFrame, table: pd.DataFrame, profiles: pd.DataFrame) -> dict:
    """The numbers behind the page's account of where the profiles miss: the stock error by
    source and checkpointing mode, torch.compile's effect in torchtitan-2412, llm-foundry's H100
    rows, unstated networks, tinyllama and KempnerForge (None where a source has no points)."""
    joined = table.merge(points[["point_id", "activation_checkpointing", "compile"]], on="point_id")
    by_mode = joined.groupby(["profile", "source_id", "activation_checkpointing"])["stock_error"].median()
    out: dict = {"by_mode": [(*key, v) for key, v in by_mode.items()], "compile": None, "tinyllama": None,
                 "kempnerforge": None}
    compiled = points[(points["source_id"] == "torchtitan-2412") & ~points["precision"].str.contains("float8")]
    on = compiled[compiled["compile"] == "on"]["tokens_per_s_per_gpu"].to_numpy()
    off = compiled[compiled["compile"] == "off"]["tokens_per_s_per_gpu"].to_numpy()
    if len(on) and len(off):
        out["compile"] = {"effect": on.mean() / off.mean() - 1, "on": len(on), "off": len(off)}
    h100 = table[table["profile"] == "h100"]
    foundry = points[(points["source_id"] == "llm-foundry") & (points["gpu"] == "H100-SXM")]
    out["llm_foundry"] = {"others": int((h100["source_id"] != "llm-foundry").sum()),
                          "none": _span(foundry, "none"), "full": _span(foundry, "full")}
    out["networks"] = unstated_networks(table, profiles)
    tiny = table[table["source_id"] == "tinyllama"]
    if not tiny.empty:
        out["tinyllama"] = {"held_out": tiny["held_out_error"].median(), "gpus": int(tiny["gpus"].iloc[0]),
                            "gpus_per_node": int(tiny["gpus_per_node"].iloc[0]),
                            "assumed_gbps": 8 * base_profile("a100").nic_gbps, "fitted": tiny["fitted_error"].median()}
    kempner = points[points["source_id"] == "kempnerforge"]
    if not kempner.empty and "h200" in set(table["profile"]):
        out["kempnerforge"] = {"stock": table[table["profile"] == "h200"]["stock_error"].median(),
                               "mfu": kempner["mfu"].max()}
    return out


def every_point(points: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Per point: how it ran as published, measured tokens/s per GPU and each simulation's error."""
    joined = table.merge(points[["point_id", "activation_checkpointing", "compile"]], on="point_id")
    each = joined.merge(points[["point_id", "model", "seq_len"]], on="point_id", suffixes=("", "_published"))
    each = each[["point_id", "source_id", "profile", "model_published", "gpus", "seq_len_published",
                 "activation_checkpointing", "compile", "measured", "stock_error", "fitted_error", "held_out_error"]]
    return each.rename(columns=lambda c: c.removesuffix("_published"))


def ratio_spread(pairs: pd.DataFrame) -> pd.DataFrame:
    """The 10th, 50th and 90th percentile of the ratio errors per profile, stock and held out."""
    spread = []
    for col, label in (("stock", "stock"), ("held_out", "held out")):
        q = pairs.groupby("profile")[f"{col}_error"].quantile([0.1, 0.5, 0.9]).unstack()
        q.columns = ["10th percentile", "median", "90th percentile"]
        spread.append(q.reset_index().assign(profile=lambda f, label=label: f["profile"] + f" ({label})"))
    return pd.concat(spread, ignore_index=True)


def cell_moves(cells: pd.DataFrame) -> list[dict]:
    """Per paper cell with a fitted profile: its speedup stock and fitted, and the move of each
    fitted constant alone, in points."""
    out = []
    for cell, part in cells.groupby("cell", sort=False):
        by = part.set_index("profile")["speedup"]
        if "fitted" not in by:
            continue
        alone = [(label.split(", ")[1].removesuffix(" fitted"), 100 * (v - by["stock"]))
                 for label, v in by.items() if label.startswith("stock, ")]
        out.append({"cell": cell, "stock": by["stock"], "fitted": by["fitted"],
                    "move": 100 * (by["fitted"] - by["stock"]), "alone": alone})
    return out


def paper_table_moves(moves: pd.DataFrame) -> dict | None:
    """How the headline speedups of results/sim_paper moved on the fitted profile: the spread,
    the largest moves down and up, and the table (None before results/sim_paper_fit exists)."""
    if moves.empty:
        return None
    move = 100 * moves["move"]
    shown = moves.assign(stock=moves["stock"].map(_pct), fitted=moves["fitted"].map(_pct),
                         move=move.map(lambda v: f"{v:+.1f}"))
    columns = ["model", "dataset", "world_size", "minibatch_size", "packing_ratio", "length_scale", "stock", "fitted",
               "move"]
    return {"settings": len(moves), "median": move.median(), "min": move.min(), "max": move.max(),
            "down": moves.loc[move.idxmin()], "up": moves.loc[move.idxmax()],
            "table": shown[columns].rename(columns=lambda c: c.replace("_", " "))}


def _pct(v: float) -> str:
    return "-" if pd.isna(v) else f"{v:+.1%}"


def doc(points: pd.DataFrame, table: pd.DataFrame, pairs: pd.DataFrame, dropped: pd.DataFrame,
        profiles: pd.DataFrame, cells: pd.DataFrame, moves: pd.DataFrame) -> str:
    """docs/gpu_validation.md (templates/gpu_validation.md.j2) from the validation files."""
    held_out = [profile for profile in sorted(table["profile"].unique())
                if table.loc[table["profile"] == profile, "held_out_error"].notna().any()]
    return render("gpu_validation", used=len(table), dropped=len(dropped),
                  reasons=list(dropped["reason"].value_counts().items()),
                  by_source=by_source(table).rename(columns=lambda c: c.replace("_", " ")), target=TARGET,
                  bar=against_the_bar(table), worst=[worst_point(points, table, profiles, p) for p in held_out],
                  misses=misses(points, table, profiles), profiles=profiles,
                  every_point=every_point(points, table).rename(columns=lambda c: c.replace("_", " ")),
                  ratio_spread=ratio_spread(pairs), cells=cells, cell_moves=cell_moves(cells),
                  paper_moves=paper_table_moves(moves),
                  pinned=[(p, names) for p, names in PINNED.items() if p in set(table["profile"])])


def moves() -> pd.DataFrame:
    """paper_moves of the committed folders; empty before results/sim_paper_fit exists."""
    return paper_moves(SIM_PAPER, SIM_PAPER_FIT) if SIM_PAPER_FIT.exists() else pd.DataFrame()


def _points(path: Path, ap: CommandParser) -> pd.DataFrame:
    """The points file, or one line (ap.error) where it is not one: the committed file's columns
    are the schema (docs/published.md says what each means); a file without them was a
    KeyError's traceback, after the simulations of those it could read."""
    try:
        points = pd.read_csv(path)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        ap.error(f"--points {path} is not a CSV table ({said(e) or type(e).__name__})")
    missing = [c for c in pd.read_csv(POINTS, nrows=0).columns if c not in points]
    if missing:
        ap.error(f"--points {path} lacks the column{'s' if len(missing) > 1 else ''} {some_of(missing)} of "
                 f"{POINTS.relative_to(REPO_ROOT)} (docs/published.md says what each holds)")
    return points


def main(argv: Sequence[str] | None = None) -> None:
    ap = CommandParser(command_name(__spec__.name), description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=readable_file, default=POINTS,
                    help="the published GPU measurements (docs/published.md)")
    ap.add_argument("--out", type=writable_folder, default=OUT, help="where the errors per point and source go (CSV)")
    ap.add_argument("--doc", type=writable_file, default=DOC, help="the page written from them")
    ap.add_argument("--conf", type=writable_folder, default=CONF, help="where the fitted profiles go (NAME_fit.yaml)")
    ap.add_argument("--doc-only", action="store_true", help="write the page again from the files in --out")
    args = ap.parse_args(argv)
    written = [f"gpu-{n}.csv" for n in ("points", "ratios", "left-out", "profiles", "paper-cells")]
    if args.doc_only and (missing := missing_inputs(args.out, written)):
        ap.error(f"--doc-only: {args.out} lacks {', '.join(missing)}; run {ap.prog} without it first")
    points = _points(args.points, ap)
    if args.doc_only:
        read = {n: pd.read_csv(args.out / f"gpu-{n}.csv") for n in ("points", "ratios", "left-out", "profiles",
                                                                     "paper-cells")}
        atomic_write_text(args.doc, doc(points, read["points"], read["ratios"], read["left-out"], read["profiles"],
                                        read["paper-cells"], moves()))
        return
    runs, dropped = measured_points(points)
    table, fitted = validate(runs)
    table = stated_networks(table, points)
    every = {profile: fits[EVERY] for profile, fits in fitted.items()}
    pairs, profiles, cells = ratio_pairs(table), profiles_table(fitted), paper_cells(every)
    _csv(table, args.out / "gpu-points.csv")
    _csv(pairs, args.out / "gpu-ratios.csv")
    _csv(dropped, args.out / "gpu-left-out.csv")
    _csv(profiles, args.out / "gpu-profiles.csv")
    _csv(cells, args.out / "gpu-paper-cells.csv")
    atomic_write_text(args.doc, doc(points, table, pairs, dropped, profiles, cells, moves()))
    for profile, hardware in every.items():
        count = int((table["profile"] == profile).sum())
        atomic_write_text(args.conf / f"{hardware.name}.yaml", profile_file(hardware, count))
    print(by_source(table).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {args.out}/gpu-points.csv, gpu-ratios.csv, gpu-left-out.csv, gpu-profiles.csv, "
          f"gpu-paper-cells.csv")


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
