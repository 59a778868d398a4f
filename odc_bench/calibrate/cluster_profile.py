"""A GPU hardware profile fitted to a few runs measured on the user's own cluster.

    python -m odc_bench.calibrate.cluster_profile RUNS.csv [--base a100] [--name mine] [--out DIR]

RUNS.csv holds one measured run of collective FSDP per row (docs/calibrate.md gives the
format). Each run is planned and simulated as `python -m odc_bench backend=sim` would, on the
base profile with some of its efficiency constants free; the constants are fitted (least
squares on log tokens/s) so that the simulated tokens/s per GPU meet the measured ones. Only
constants the runs can tell apart are fitted (see `choose`), never more than the runs less one,
so every fit leaves a residual to judge it by. The profile goes to
DIR/backend/hardware/NAME.yaml, where the what-if (`--hardware PATH`) and
`python -m odc_bench backend=sim 'hydra.searchpath=[file://DIR]' backend/hardware=NAME` read it,
and each run's residual, with what was fitted, to NAME-fit.csv beside it: the what-if's band on the
profile (whatif/accuracy.py).

Input the fit cannot use is refused in one line, before anything is written: a file without
the columns, a number it cannot read as tokens per second per GPU, one run only, the same setting
measured twice with throughputs far apart, or runs no profile of this form meets (naming the run
without which the others fit, and whether it looks like the whole job's tokens/s).
"""

from __future__ import annotations

import csv
import io
import math
import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from odc_bench.config.backend import GpuHardwareConfig, SimBackendConfig
from odc_bench.config.compose import hydra_quote
from odc_bench.config.fields import require
from odc_bench.data.profiles import PROFILES
from odc_bench.errors import CommandParser, ConfigError, ends_cleanly, fail
from odc_bench.files import atomic_write_text, text_encoding, writable_folder
from odc_bench.plan.spec import Planner, RunSpec
from odc_bench.record.row import sim_timing
from odc_bench.sim import simulate
from odc_bench.whatif.accuracy import fit_table_path
from odc_bench.whatif.answer import compose_config
from odc_bench.whatif.question import HARDWARE, MODELS, Question, Series

PROG = "python -m odc_bench.calibrate.cluster_profile"
REQUIRED = ("model", "lengths", "gpus", "gpus_per_node", "minibatch_size", "tokens_per_s_per_gpu")
OPTIONAL = {"recompute": True, "precision": "bf16", "max_tokens": None, "balancer": "local_sort"}
# What the fit may move, in the order it is tried: compute first (every run shows it), then the
# links that only some runs exercise. Each gets the bounds of config/backend.py's ranges.
FREE = ("matmul_efficiency", "attention_efficiency", "nic_efficiency", "link_efficiency", "memory_efficiency",
        "unit_overhead_s")
BOUNDS = {"unit_overhead_s": (1e-7, 1e-2)}
# A constant is fitted only if the runs' predicted tokens/s move with it (see `sensitivity`) by
# at least SENSITIVE (root mean square over the runs), and, beside those chosen before it, keeps the runs' sensitivity
# matrix this far from singular (smallest over largest singular value, columns normalised): below
# it the runs cannot tell the constant from the others and its value would be noise.
SENSITIVE = 0.02
DISTINCT = 0.1
# A constant added after the first fit must take at least this much off the log residual (rms).
IMPROVES = 0.01
# The same setting measured twice: throughputs further apart than this are contradictory.
SAME_SETTING_SPREAD = 0.2
# After the fit: a run this far off means no profile of this form describes the runs.
WORST_RESIDUAL = 0.5
MINIBATCHES = 8
# A run this close to its GPU count (or GPUs per node) times what the others' profile gives looks
# like a number of the whole job (or node): the others' profile is itself off by tens of percent.
PER_GPU_SLACK = 1.5


@dataclass(frozen=True)
class Measured:
    """One measured run, planned: `row` names it to the user (a runs file's 1-based data row, a
    published point's id); `setting` is what its caller groups runs by (here the row's inputs,
    for repeats; published.py: its source and GPU profile)."""

    row: int
    spec: RunSpec
    tokens_per_s_per_gpu: float
    setting: tuple


def _number(value: object, column: str, row: int, integer: bool = False) -> float:
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        raise ConfigError(f"row {row}: {column} is {text!r}, not a number; give {_UNITS[column]} as a plain number "
                          f"(no units or thousands separators)") from None
    require(math.isfinite(number) and number > 0 and (not integer or number.is_integer()),
            f"row {row}: {column} must be a positive {'whole ' if integer else ''}number, got {text}")
    return number


_UNITS = {"tokens_per_s_per_gpu": "tokens per second per GPU", "gpus": "the run's GPU count",
          "gpus_per_node": "GPUs per node", "minibatch_size": "samples per GPU per optimizer step",
          "max_tokens": "tokens per microbatch"}


def _flag(value: object, row: int) -> bool:
    text = str(value).strip().lower()
    require(text in ("true", "false", "1", "0", "yes", "no"),
            f"row {row}: recompute must be true or false, got {text!r}")
    return text in ("true", "1", "yes")


def _beside(csv: Path, value: str, names: Collection[str]) -> str:
    """A lengths file or model folder named relative to the runs file, where one is there; one of
    `names` (a length profile's, a model config's) stays that name, as the what-if reads it."""
    if value in names or Path(value).is_absolute() or not (csv.parent / value).exists():
        return value
    return str(csv.parent / value)


def read_runs(path: Path, base: str) -> list[Measured]:
    """The measured runs, each planned on the base profile; ConfigError for anything unreadable."""
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False, encoding=text_encoding(path),
                            skipinitialspace=True)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise ConfigError(f"cannot read {path} as CSV ({str(e).splitlines()[0]}); give a CSV file with a header row "
                          f"(docs/calibrate.md)") from None
    header = _header(path)
    twice = sorted({c for c in header if header.count(c) > 1})
    require(not twice, f"{path}: the column{'s' * (len(twice) > 1)} {', '.join(twice)} appear{'s' * (len(twice) == 1)} "
                       f"twice in its header; keep one of each")
    separator = next((sep for sep in (";", "\t") if len(header) == 1 and sep in header[0]), None)
    require(separator is None, f"{path} is separated by {separator!r}, not commas (its header reads as one column); "
                               f"save it as comma-separated values, with decimal points")
    table.columns = [c.strip() for c in table.columns]
    missing = [c for c in REQUIRED if c not in table.columns]
    require(not missing, f"{path} lacks the column{'s' * (len(missing) > 1)} {', '.join(missing)}; its header must "
                         f"name {', '.join(REQUIRED)} (docs/calibrate.md)")
    unknown = [c for c in table.columns if c not in REQUIRED and c not in OPTIONAL]
    require(not unknown, f"{path}: unknown column{'s' * (len(unknown) > 1)} {', '.join(unknown)}; the columns are "
                         f"{', '.join(REQUIRED)} and optionally {', '.join(OPTIONAL)}")
    runs = []
    planner = Planner()  # repeated settings plan the same minibatches
    for i, r in enumerate(table.to_dict("records"), start=1):
        gpus = int(_number(r["gpus"], "gpus", i, integer=True))
        per_node = int(_number(r["gpus_per_node"], "gpus_per_node", i, integer=True))
        require(gpus % per_node == 0, f"row {i}: gpus ({gpus}) must be a multiple of gpus_per_node ({per_node})")
        minibatch = int(_number(r["minibatch_size"], "minibatch_size", i, integer=True))
        measured = _number(r["tokens_per_s_per_gpu"], "tokens_per_s_per_gpu", i)
        recompute = _flag(r.get("recompute") or OPTIONAL["recompute"], i)
        precision = str(r.get("precision") or OPTIONAL["precision"]).strip()
        balancer = str(r.get("balancer") or OPTIONAL["balancer"]).strip()
        max_tokens = r.get("max_tokens") or None
        extra = [f"backend.recompute={str(recompute).lower()}", f"precision={precision}"]
        if max_tokens is not None:
            extra.append(f"max_tokens={int(_number(max_tokens, 'max_tokens', i, integer=True))}")
        lengths = _beside(path, str(r["lengths"]).strip(), PROFILES)
        model = _beside(path, str(r["model"]).strip(), MODELS)
        try:
            question = Question(lengths=lengths, model=model, hardware=base, nodes=gpus // per_node,
                                devices_per_node=per_node, minibatch_sizes=(minibatch,), num_minibatches=MINIBATCHES,
                                overrides=tuple(extra))
            spec = planner.resolve(compose_config(question.run(Series("collective", balancer, 0), minibatch)))
        except ConfigError as e:
            raise ConfigError(f"row {i}: {e}") from None
        setting = (question.model, lengths, gpus, per_node, minibatch, recompute, precision, balancer, max_tokens)
        runs.append(Measured(i, spec, measured, setting))
    # After the rows are checked: a file of one bad row says what is wrong with it first.
    require(len(runs) >= 2, f"{path} holds {len(runs)} run{'s' * (len(runs) != 1)}; a fit needs at least two "
                            f"measured runs (more settings: more constants it can fit)")
    _check_repeats(runs)
    return runs


def _header(path: Path) -> list[str]:
    """The header row's column names as written (pandas renames a repeated one, gpus to gpus.1)."""
    with open(path, encoding=text_encoding(path), newline="") as f:
        return [c.strip() for c in next(csv.reader(f), [])]


def _check_repeats(runs: Sequence[Measured]) -> None:
    by_setting: dict[tuple, list[Measured]] = {}
    for run in runs:
        by_setting.setdefault(run.setting, []).append(run)
    for same in by_setting.values():
        values = [r.tokens_per_s_per_gpu for r in same]
        if len(same) > 1 and max(values) / min(values) - 1 > SAME_SETTING_SPREAD:
            rows = " and ".join(str(r.row) for r in same)
            raise ConfigError(f"rows {rows} are the same setting measured {min(values):g} to {max(values):g} tokens/s "
                              f"per GPU ({max(values) / min(values) - 1:.0%} apart); check those runs, or keep the one "
                              f"you trust")


def with_hardware(spec: RunSpec, hardware: GpuHardwareConfig) -> RunSpec:
    backend = spec.config.backend
    assert isinstance(backend, SimBackendConfig)
    return replace(spec, config=replace(spec.config, backend=replace(backend, hardware=hardware)))


def with_constants(spec: RunSpec, hardware: GpuHardwareConfig) -> RunSpec:
    """The run on its own hardware (node size, memory, network: what it was measured on) with
    `hardware`'s efficiency constants."""
    backend = spec.config.backend
    assert isinstance(backend, SimBackendConfig) and isinstance(backend.hardware, GpuHardwareConfig)
    own = backend.hardware
    return with_hardware(spec, replace(own, **{name: getattr(hardware, name) for name in FREE}))


def predict(runs: Sequence[Measured], hardware: GpuHardwareConfig) -> np.ndarray:
    """Simulated tokens/s per GPU of every run with `hardware`'s efficiency constants."""
    out = []
    for run in runs:
        spec = with_constants(run.spec, hardware)
        out.append(sim_timing(spec, simulate(spec, trace=False))["tokens_per_s"] / spec.world_size)
    return np.array(out)


def _at(base: GpuHardwareConfig, names: Sequence[str], log_values: np.ndarray) -> GpuHardwareConfig:
    values: dict[str, Any] = {n: float(np.exp(v)) for n, v in zip(names, log_values, strict=True)}
    return replace(base, **values)


def sensitivity(runs: Sequence[Measured], base: GpuHardwareConfig) -> np.ndarray:
    """How far each free constant can move every run's throughput: the change of log(tokens/s)
    over the change of log(constant) when the constant goes to a quarter of its value (costs up:
    an overhead four times over), runs as rows, constants as columns. A large move, because a
    link the profile hides behind compute shows only once it is slow enough to be waited for."""
    at = np.log(predict(runs, base))
    columns = []
    for name in FREE:
        factor = 4.0 if name in BOUNDS else 0.25  # overheads cost more as they grow, efficiencies as they shrink
        moved = np.log(predict(runs, replace(base, **{name: getattr(base, name) * factor})))
        columns.append((moved - at) / math.log(factor))
    return np.array(columns).T


def choose(jac: np.ndarray, most: int, pinned: Collection[str] = ()) -> list[str]:
    """The constants the runs can tell apart, in FREE's order, at most `most` of them, none of
    those `pinned` (set by a measurement the fit must keep)."""
    chosen: list[int] = []
    for j in range(len(FREE)):
        if len(chosen) >= most:
            break
        if FREE[j] in pinned:
            continue
        column = jac[:, j]
        if np.sqrt(np.mean(column**2)) < SENSITIVE:
            continue
        cols = jac[:, [*chosen, j]]
        cols = cols / np.linalg.norm(cols, axis=0)
        s = np.linalg.svd(cols, compute_uv=False)
        if s[-1] / s[0] >= DISTINCT:
            chosen.append(j)
    return [FREE[j] for j in chosen]


@dataclass(frozen=True)
class Fit:
    hardware: GpuHardwareConfig
    base: GpuHardwareConfig
    fitted: list[str]
    runs: list[Measured]
    predicted: np.ndarray

    @property
    def residuals(self) -> np.ndarray:
        """Simulated over measured tokens/s per GPU, minus 1, per run."""
        return self.predicted / np.array([r.tokens_per_s_per_gpu for r in self.runs]) - 1

    @property
    def at_bound(self) -> list[str]:
        """The fitted constants that ended at a bound of their range: the runs asked for more than the
        base profile allows, so the residuals understate the error."""
        return [n for n in self.fitted
                if any(abs(getattr(self.hardware, n) / bound - 1) < 1e-6 for bound in BOUNDS.get(n, (1e-3, 1.0)))]


def _solve(runs: Sequence[Measured], base: GpuHardwareConfig, start: GpuHardwareConfig, names: Sequence[str]
           ) -> tuple[GpuHardwareConfig, float]:
    """`names` fitted from `start` (the rest as in `start`); the root mean square log residual."""
    measured = np.log([r.tokens_per_s_per_gpu for r in runs])
    low = [math.log(BOUNDS.get(n, (1e-3, 1.0))[0]) for n in names]
    high = [math.log(BOUNDS.get(n, (1e-3, 1.0))[1]) for n in names]
    x0 = np.clip([math.log(getattr(start, n)) for n in names], low, high)
    result = least_squares(lambda x: np.log(predict(runs, _at(start, names, x))) - measured, x0,
                           bounds=(low, high), diff_step=1e-3, xtol=1e-10, ftol=1e-10)
    return _at(start, names, result.x), float(np.sqrt(np.mean(result.fun**2)))


def fit(runs: list[Measured], base: GpuHardwareConfig, name: str, most: int | None = None,
        worst_residual: float | None = WORST_RESIDUAL, pinned: Collection[str] = ()) -> Fit:
    """The base profile with the constants the runs can tell apart fitted to them: at most
    `most` (default: one fewer than the runs, so that residuals remain to judge the fit by),
    never one `pinned` (the base profile's value comes from a measurement); refused when a run
    stays further off than `worst_residual`.

    The constants that move the runs at the base profile are fitted first. A link the base
    profile hides behind compute can still be what the measured runs waited for, so each other
    constant is then tried in turn and kept when it at least halves the remaining error (and
    takes off at least IMPROVES of it)."""
    most = len(runs) - 1 if most is None else most
    names = choose(sensitivity(runs, base), most, pinned)
    require(bool(names), "no constant of the profile moves these runs' simulated throughput; measure runs whose "
                         "compute time changes with the setting")
    hardware, rms = _solve(runs, base, base, names)
    for extra in FREE:
        if extra in names or extra in pinned or len(names) >= most:
            continue
        trial = [n for n in FREE if n in names or n == extra]
        candidate, trial_rms = _solve(runs, base, hardware, trial)
        if trial_rms <= rms / 2 and rms - trial_rms >= IMPROVES and \
                choose(sensitivity(runs, candidate), most, pinned) == trial:
            names, hardware, rms = trial, candidate, trial_rms
    hardware = replace(hardware, name=name)
    done = Fit(hardware, base, names, runs, predict(runs, hardware))
    worst = int(np.argmax(np.abs(done.residuals)))
    if worst_residual is not None and abs(done.residuals[worst]) > worst_residual:
        raise ConfigError(_misfit(runs, base, name, worst_residual)
                          or f"no profile fits these runs: after fitting {', '.join(names)}, row {runs[worst].row} is "
                             f"still off by {done.residuals[worst]:+.0%}; check that run's numbers and units (tokens "
                             f"per second per GPU)")
    return done


def _misfit(runs: list[Measured], base: GpuHardwareConfig, name: str, worst_residual: float) -> str | None:
    """The refusal naming the one run without which the others fit, if there is one (the runs furthest
    from the rest at the base profile tried first: the run a fit misses is not always the one that is
    off, as the constants bend towards it), and saying when its number looks like the whole job's or
    a node's instead of one GPU's; None when no single run explains the misfit."""
    if len(runs) < 3:
        return None
    measured = np.array([r.tokens_per_s_per_gpu for r in runs])
    ratio = np.log(measured / predict(runs, base))
    apart = [abs(ratio[i] - np.median(np.delete(ratio, i))) for i in range(len(runs))]
    for i in np.argsort(apart)[::-1]:
        odd, rest = runs[i], [r for j, r in enumerate(runs) if j != i]
        try:
            others = fit(rest, base, name, worst_residual=None)
        except ConfigError:
            continue
        if np.abs(others.residuals).max() > worst_residual:
            continue
        expected = float(predict([odd], others.hardware)[0])
        off = odd.tokens_per_s_per_gpu / expected
        gpus, per_node = odd.spec.world_size, odd.setting[3]
        unit = next((f"{what} ({count} GPUs)" for what, count in (("the whole job", gpus), ("one node", per_node))
                     if count > 1 and abs(math.log(off / count)) < math.log(PER_GPU_SLACK)), None)
        hint = (f"; at {off:.1f}x it looks like tokens/s of {unit}: divide it by {gpus if 'job' in unit else per_node}"
                if unit else "; check its numbers and units (tokens per second per GPU)")
        r = others.residuals
        return (f"no profile fits these runs: without row {odd.row} the other {len(rest)} fit (residuals "
                f"{r.min():+.1%} to {r.max():+.1%}), and row {odd.row} measured {odd.tokens_per_s_per_gpu:g} tokens/s "
                f"per GPU where their profile gives {expected:.4g}{hint}")
    return None


def profile_yaml(result: Fit, source: Path) -> str:
    """The fitted profile as a backend/hardware config file, saying where it came from."""
    moved = ", ".join(f"{n} {getattr(result.base, n):g} -> {getattr(result.hardware, n):.4g}" for n in result.fitted)
    r = result.residuals
    header = (f"# Fitted by `python -m odc_bench.calibrate.cluster_profile {source}` to {len(result.runs)} measured "
              f"runs\n# of collective FSDP, from the {result.base.name} profile: {moved}.\n"
              f"# Simulated over measured tokens/s per GPU: {r.min():+.1%} to {r.max():+.1%} "
              f"(each run: {result.hardware.name}-fit.csv, beside this file).\n")
    values = {f.name: getattr(result.hardware, f.name) for f in fields(GpuHardwareConfig)}
    return header + yaml.safe_dump(values, sort_keys=False)


def fit_table(result: Fit) -> pd.DataFrame:
    rows = []
    for run, predicted, residual in zip(result.runs, result.predicted, result.residuals, strict=True):
        _, lengths, gpus, per_node, minibatch, recompute, precision, balancer, max_tokens = run.setting
        rows.append(dict(row=run.row, model=run.spec.config.model.name, lengths=lengths, gpus=gpus,
                         gpus_per_node=per_node, minibatch_size=minibatch, recompute=recompute, precision=precision,
                         balancer=balancer,
                         measured_tokens_per_s_per_gpu=run.tokens_per_s_per_gpu,
                         simulated_tokens_per_s_per_gpu=float(predicted), residual=float(residual),
                         # The fit's own record, on every row: what the what-if's band says of it.
                         base=result.base.name, fitted=" ".join(result.fitted), at_bound=" ".join(result.at_bound),
                         constants=len(FREE)))
    return pd.DataFrame(rows)


def base_profile(name: str) -> GpuHardwareConfig:
    hardware = compose_config(["backend=sim", f"backend/hardware={name}"]).backend
    assert isinstance(hardware, SimBackendConfig)
    require(isinstance(hardware.hardware, GpuHardwareConfig),
            f"--base {name} is not a GPU profile; use a100, h100 or h200")
    assert isinstance(hardware.hardware, GpuHardwareConfig)
    return hardware.hardware


def main(argv: Sequence[str] | None = None) -> None:
    ap = CommandParser(PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, help="the measured runs, a CSV file (docs/calibrate.md)")
    ap.add_argument("--base", default="a100", help="the profile to start from and keep unfitted constants of "
                                                   "(a100, h100, h200; default: %(default)s)")
    ap.add_argument("--name", default="cluster", help="the profile's name (default: %(default)s)")
    ap.add_argument("--out", type=writable_folder, default="results/local/cluster",
                    help="folder for backend/hardware/NAME.yaml and NAME-fit.csv beside it (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        require(args.name.replace("_", "").replace("-", "").isalnum(),
                f"--name {args.name!r}: use letters, digits, - and _ (it becomes a file and config name)")
        require(args.name not in HARDWARE,
                f"--name {args.name}: a stock profile's name, which the harness and the what-if would read instead of "
                f"this one (Hydra finds the stock one first); give the profile a name of its own (--name "
                f"{args.name}_cluster)")
        base = base_profile(args.base)
        result = fit(read_runs(args.runs, args.base), base, args.name)
    except ConfigError as e:
        fail(e, PROG)
    profile = args.out / "backend" / "hardware" / f"{args.name}.yaml"
    atomic_write_text(profile, profile_yaml(result, args.runs))
    table = fit_table(result)
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    table_path = fit_table_path(profile)
    atomic_write_text(table_path, buf.getvalue())
    print(f"fitted {', '.join(result.fitted)} to {len(result.runs)} runs (the rest as in {base.name}):")
    for n in result.fitted:
        print(f"  {n}: {getattr(base, n):g} -> {getattr(result.hardware, n):.4g}"
              + (" (at its bound: the runs ask for more than this profile allows; check their numbers, or use "
                 "another --base)" if n in result.at_bound else ""))
    shown = table[["row", "model", "gpus", "minibatch_size", "measured_tokens_per_s_per_gpu",
                   "simulated_tokens_per_s_per_gpu", "residual"]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"wrote {profile} and {table_path} (the what-if's band on this profile: the residuals)")
    print(f"use it: python -m odc_bench.whatif LENGTHS --hardware {profile}")
    search = shlex.quote(f"hydra.searchpath=[{hydra_quote(f'file://{args.out.resolve()}')}]")
    print(f"    or: python -m odc_bench backend=sim {search} backend/hardware={args.name}")


if __name__ == "__main__":
    with ends_cleanly(PROG):
        main()
