"""The simulator's validated error, read from the committed validation results.

`python -m odc_bench.studies.validation` measures real runs beside their simulation and writes
results/validation/ (docs/simulator.md, "Validation on this machine"). The verdict quotes its
range rather than a number typed into code: re-running the validation updates what every
verdict says. That validation is of the calibrated CPU profile on this repository's host. The
GPU profiles are held to published GPU measurements by `python -m odc_bench.studies.published`
(docs/gpu_validation.md): a stock profile's errors on them, or a fitted profile's
leave-one-source-out errors, are the band of a GPU verdict. A profile fitted to the user's own
runs (`python -m odc_bench.calibrate.cluster_profile`) has the fit's residuals as its band, read from the fit
table written beside it. A band always says where it comes from (`Accuracy.origin`).
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from odc_bench.provenance import REPO_ROOT

VALIDATION = REPO_ROOT / "results" / "validation"
# The share of a GPU profile's errors the band spans, from the 10th to the 90th percentile: the
# published table gives hundreds of within-source pairs, whose extremes are single points a
# source leaves unexplained; the CPU validation has six configs and its band spans them all.
GPU_BAND = (0.1, 0.9)


def _read(path: Path) -> pd.DataFrame:
    """A validation table, parsed once per content: a what-if quotes several profiles' bands (its
    --hardware help names every one). Keyed by the bytes, not the file's time, which a rewrite
    within the clock's tick leaves unchanged. Not to be modified."""
    return _parse(path.read_bytes())


@functools.lru_cache(maxsize=16)
def _parse(content: bytes) -> pd.DataFrame:
    return pd.read_csv(io.BytesIO(content))


def _span(low: float, high: float) -> str:
    return f"{low:g}" if low == high else f"{low:g} to {high:g}"


@dataclass(frozen=True)
class GpuValidation:
    """What the published GPU measurements say of one GPU profile (odc_bench.studies.published)."""

    points: int
    sources: int
    params: tuple[float, float]  # the validated models' parameter counts
    gpus: tuple[int, int]
    seq_len: tuple[int, int]
    gpus_per_node: tuple[int, ...]  # the node sizes the points ran on
    network_gbps: tuple[float, float] | None  # Gbps per node, of the points whose source states it

    def outside(self, params: float, gpus: int, longest: int, gpus_per_node: int, network_gbps: float) -> list[str]:
        """What of a configuration lies outside the validated range, in words; `network_gbps`:
        its nodes' network (Gbps per node), which matters only when the run spans nodes."""
        out = []
        if not self.params[0] <= params <= self.params[1]:
            out.append(f"a {params / 1e9:.1f}B-parameter model (validated: {self.params[0] / 1e9:.1f}B to "
                       f"{self.params[1] / 1e9:.1f}B)")
        if not self.gpus[0] <= gpus <= self.gpus[1]:
            out.append(f"{gpus} GPUs (validated: {self.gpus[0]} to {self.gpus[1]})")
        if longest > self.seq_len[1]:
            out.append(f"samples of up to {longest} tokens (validated: sequences of {_span(*self.seq_len)})")
        if gpus_per_node not in self.gpus_per_node:
            out.append(f"{gpus_per_node} GPUs per node (validated: {' and '.join(map(str, self.gpus_per_node))})")
        if gpus > gpus_per_node:
            if self.network_gbps is None:
                out.append(f"a network of {network_gbps:g} Gbps per node (no validated source states its network)")
            elif not self.network_gbps[0] <= network_gbps <= self.network_gbps[1]:
                out.append(f"a network of {network_gbps:g} Gbps per node (validated: {_span(*self.network_gbps)}, "
                           f"where the sources state theirs)")
        return out


@dataclass(frozen=True)
class FitRecord:
    """What calibrate's fit table says of a profile fitted to the user's runs."""

    table: Path
    base: str
    fitted: tuple[str, ...]
    at_bound: tuple[str, ...]
    constants: int  # how many the fit could have moved (calibrate.FREE)

    def weaknesses(self, runs: int) -> list[str]:
        """What makes the fit's residuals a floor of its error rather than an estimate, in words."""
        out = []
        if runs < self.constants:
            out.append(f"{runs} runs for the profile's {self.constants} constants ({len(self.fitted)} fitted, the "
                       f"rest as in {self.base})")
        out += [f"{name} at its bound" for name in self.at_bound]
        return out


@dataclass(frozen=True)
class Accuracy:
    """Predicted over measured, minus 1, over the validated configs (None: no validation found)."""

    ratio: tuple[float, float] | None  # the odc/collective throughput ratio
    throughput: tuple[float, float] | None  # each engine's samples/s
    configs: int
    source: Path
    gpu: GpuValidation | None = None  # a GPU profile's band: its errors on published GPU runs
    origin: str = "the CPU host's validated error"  # where the band comes from, as the verdict line names it
    fit: FitRecord | None = None  # a profile fitted to the user's runs: its fit table

    def band(self) -> str:
        """Where the band comes from, for the verdict line: `within <band>`; with what makes it a floor."""
        weak = self.fit.weaknesses(self.configs) if self.fit is not None else []
        return self.origin + (f" ({'; '.join(weak)}: read it as a floor)" if weak else "")

    def measured_range(self, predicted_ratio: float) -> tuple[float, float] | None:
        """The ratios a measurement would give if the simulator errs as it did in validation."""
        if self.ratio is None:
            return None
        low, high = self.ratio
        return predicted_ratio / (1 + high), predicted_ratio / (1 + low)

    def _shown(self, name: str) -> str:
        path = self.source / name
        return str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)

    def describe(self, hardware: str) -> str:
        """The error to quote, and where it comes from."""
        if self.ratio is None or self.throughput is None:
            return f"the simulator's error is unknown here: {self.origin} not found ({self.source})"
        r, t = self.ratio, self.throughput
        if self.fit is not None:
            weak = self.fit.weaknesses(self.configs)
            return (f"the {hardware} profile was fitted to {self.configs} runs measured on its cluster (from "
                    f"{self.fit.base}: {', '.join(self.fit.fitted)}; {self.fit.table}): simulated over measured "
                    f"tokens/s per GPU {t[0]:+.1%} to {t[1]:+.1%}, ratios between its runs {r[0]:+.1%} to {r[1]:+.1%}"
                    f"{'; ' + '; '.join(weak) + ', so the band is a floor' if weak else ''}; collective FSDP only, "
                    f"so ODC's rows are the simulator's, unmeasured there")
        if self.gpu is not None:
            g = self.gpu
            how = ("fitted to them, each source predicted by the fit that did not see it" if hardware.endswith("_fit")
                   else "which never saw them")
            plural = "s" * (g.sources != 1)
            return (f"the {hardware} profile against {g.points} published GPU measurements from {g.sources} "
                    f"source{plural}, {how} ({self._shown('gpu-points.csv')}, docs/gpu_validation.md): "
                    f"tokens/s per GPU {t[0]:+.0%} to {t[1]:+.0%}, ratios between a source's configurations "
                    f"{r[0]:+.0%} to {r[1]:+.0%} (10th to "
                    f"90th percentile); those are collective FSDP runs, so ODC's own costs on GPUs are unmeasured")
        text = (f"validated against real runs on this repository's CPU host ({self.configs} configs, "
                f"{self.source.relative_to(REPO_ROOT) if self.source.is_relative_to(REPO_ROOT) else self.source}): "
                f"speedup (odc/collective) {r[0]:+.1%} to {r[1]:+.1%}, samples/s {t[0]:+.1%} to {t[1]:+.1%}")
        if hardware != "cpu":
            text += (f"; the {hardware} profile comes from datasheets and is not validated against GPU runs "
                     f"(docs/simulator.md), so read the numbers as a model's estimate, the ranges as a floor")
        return text


def fit_table_path(profile_file: Path) -> Path:
    """Where calibrate writes a fitted profile's fit table: beside the profile, so it moves with it."""
    return profile_file.with_name(f"{profile_file.stem}-fit.csv")


def fitted(profile_file: Path) -> Accuracy:
    """The band of a profile fitted to the user's runs: the fit's residuals (throughput) and the
    ratios between its runs' residuals (a speedup is a ratio of two configurations); unknown when the
    fit table is not beside the profile."""
    table = fit_table_path(profile_file)
    try:
        fit = pd.read_csv(table, keep_default_na=False)
        residual = fit["residual"].astype(float)
        first = fit.iloc[0]
        record = FitRecord(table, str(first["base"]), tuple(str(first["fitted"]).split()),
                           tuple(str(first["at_bound"]).split()), int(first["constants"]))
    except (OSError, KeyError, IndexError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return Accuracy(None, None, 0, table, origin=f"the {profile_file.stem} profile's fit residuals (the fit table "
                                                     f"calibrate writes beside the profile)")
    ratio = (1 + residual.to_numpy())[:, None] / (1 + residual.to_numpy())[None, :] - 1
    pairs = ratio[~np.eye(len(residual), dtype=bool)]
    return Accuracy((float(pairs.min()), float(pairs.max())), (float(residual.min()), float(residual.max())),
                    len(residual), table, origin=f"the {profile_file.stem} profile's fit residuals", fit=record)


def spread(accuracy: Accuracy) -> float:
    """How wide a profile's GPU band is: the spans of its throughput and ratio errors together (both
    matter: a verdict's range is the ratios', its samples/s the throughput's); infinite without a GPU
    validation."""
    if accuracy.gpu is None or accuracy.ratio is None or accuracy.throughput is None:
        return math.inf
    return (accuracy.throughput[1] - accuracy.throughput[0]) + (accuracy.ratio[1] - accuracy.ratio[0])


def gpu_of(profile: str) -> str:
    """The GPU a stock profile describes: a100_fit and a100 are both A100 profiles."""
    return profile.removesuffix("_fit")


def best_validated(gpu: str, profiles: Sequence[str], folder: Path = VALIDATION) -> str | None:
    """The profile of `gpu` with the narrowest validated band on published GPU runs (None: none validated)."""
    scored = [(spread(validated(folder, p)), p) for p in profiles if p != "cpu" and gpu_of(p) == gpu]
    scored = [(score, p) for score, p in scored if math.isfinite(score)]
    return min(scored)[1] if scored else None


def summary(accuracy: Accuracy) -> str:
    """A profile's validated error in a few words: `--hardware list` and the what-if's advice."""
    if accuracy.ratio is None or accuracy.throughput is None:
        return "error unknown"
    t, r = accuracy.throughput, accuracy.ratio
    if accuracy.gpu is None:
        return f"CPU host: samples/s {t[0]:+.1%} to {t[1]:+.1%}, speedups {r[0]:+.1%} to {r[1]:+.1%}"
    g = accuracy.gpu
    how = "held out" if "held-out" in accuracy.origin else "never seen by the profile"
    return (f"tokens/s per GPU {t[0]:+.0%} to {t[1]:+.0%}, ratios {r[0]:+.0%} to {r[1]:+.0%} ({g.points} published "
            f"points from {g.sources} source{'s' * (g.sources != 1)}, {how})")


def validated(folder: Path = VALIDATION, hardware: str = "cpu", profile_file: Path | None = None) -> Accuracy:
    """The band a verdict on `hardware` quotes: a profile fitted to the user's runs (`profile_file`)
    its fit's residuals; a GPU profile's from the published GPU measurements where they validate it;
    else the CPU host's validation (for a GPU profile without validation, said as such)."""
    if profile_file is not None:
        return fitted(profile_file)
    gpu = gpu_validated(folder, hardware)
    if gpu is not None:
        return gpu
    ratios, runs = folder / "sim-cpu-ratios.csv", folder / "sim-cpu.csv"
    origin = ("the CPU host's validated error" if hardware == "cpu" else
              f"the CPU host's validated error (the {hardware} profile has no GPU validation)")
    try:
        r = _read(ratios)
        t = _read(runs)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return Accuracy(None, None, 0, folder, origin=origin)
    throughput = t["predicted_samples_per_s"] / t["measured_samples_per_s"] - 1
    return Accuracy((float(r["error"].min()), float(r["error"].max())),
                    (float(throughput.min()), float(throughput.max())), len(r), folder, origin=origin)


def calibrated_elsewhere(calibration: dict, path: Path, here: dict[str, object]) -> str | None:
    """A line saying the CPU profile was measured on another machine, with the command that
    calibrates this one; None when its fingerprint is this machine's."""
    recorded = calibration.get("fingerprint")
    if recorded == here:
        return None
    where = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    this = f"{here['cpu_model']}, {here['logical_cores']} logical cores"
    command = (f"python -m odc_bench.calibrate.cpu_profile model={calibration.get('model', 'tiny')} "
               f"--engines collective odc")
    if not isinstance(recorded, dict):
        whose = (f"was calibrated on host {calibration.get('host', '?')} on {calibration.get('date', '?')} and records "
                 f"no hardware fingerprint, so nothing shows that it describes this machine ({this})")
    else:
        whose = (f"was calibrated on another machine ({recorded.get('cpu_model')}, {recorded.get('logical_cores')} "
                 f"logical cores; this one: {this}): its samples/s and the validated error describe that machine")
    return f"The cpu profile ({where}) {whose}. To calibrate this machine (a few minutes): {command}"


def gpu_validated(folder: Path, hardware: str) -> Accuracy | None:
    """The GPU band of a profile from odc_bench.studies.published's files, or None without them:
    a stock profile's (a100) own errors on the published points, which it never saw; a fitted
    one's (a100_fit) leave-one-source-out errors."""
    try:
        points = _read(folder / "gpu-points.csv")
        pairs = _read(folder / "gpu-ratios.csv")
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None
    profile = hardware.removesuffix("_fit")
    column = "held_out_error" if hardware.endswith("_fit") else "stock_error"
    points = points[(points["profile"] == profile) & points[column].notna()]
    pairs = pairs[(pairs["profile"] == profile) & pairs[column].notna()]
    if points.empty or pairs.empty:
        return None
    low, high = GPU_BAND
    throughput = points[column].quantile([low, high])
    ratio = pairs[column].quantile([low, high])
    stated = points["network_gbps"].dropna()
    gpu = GpuValidation(len(points), points["source_id"].nunique(),
                        (float(points["params"].min()), float(points["params"].max())),
                        (int(points["gpus"].min()), int(points["gpus"].max())),
                        (int(points["seq_len"].min()), int(points["seq_len"].max())),
                        tuple(sorted(int(g) for g in points["gpus_per_node"].unique())),
                        (float(stated.min()), float(stated.max())) if len(stated) else None)
    origin = (f"the {hardware} profile's held-out error on published GPU runs" if hardware.endswith("_fit")
              else f"the {hardware} profile's error on published GPU runs")
    return Accuracy((float(ratio[low]), float(ratio[high])), (float(throughput[low]), float(throughput[high])),
                    len(points), folder, gpu, origin)
