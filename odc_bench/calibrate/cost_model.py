"""This machine's compute of the run's model: the `calibrated` cost model, and on CUDA each unit.

`python -m odc_bench.calibrate.cost_model [config overrides]` uses the run config (model, device,
threads per rank, dataset and max_tokens), so a calibration describes what a rank of that
run computes. It times forward plus backward of single documents across the length range
up to max_tokens and of packed microbatches of several documents (interleaved, median of
repeats), fits time = a x^2 + b x + c with x = (sum over documents of length) / 1000 for b,
the sum of squared document lengths for a, and c once per microbatch, by least squares with
non-negative coefficients, and writes them, with the raw timings and where they came from,
to results/calibration/<model>-<device>.json (or balancer.calibration), atomically. Later
runs with balancer.cost_model=calibrated load that file.

Timings are per-rank compute only (no communication; fp32 on CPU, the run's precision on
CUDA), which is what balancers distribute; on the tiny model it takes seconds.

On CUDA it also times every unit kind on its own, as the harness runs it there (bf16, dense
parts compiled, the varlen kernel): the embeddings, one decoder layer (forward, backward, and
backward with its forward recomputed by activation checkpointing) and the head, each with CUDA
events over the same shapes, and adds their fit (sim/unit_fit.py) to the file as `units`: a GPU
profile whose backend.hardware.compute_calibration names the file computes from it.
`--reduced` times fewer unit shapes, three times each, and `--unit-models=A,B` the units of those
models too (one layer each), so that the fit spans model sizes (make gpu-check: both).

`python -m odc_bench.calibrate.cost_model --timings FILE.csv --out FILE.json --device NAME` fits
unit timings measured elsewhere instead (columns model, unit, shape, fwd_ms, bwd_ms and
optionally bwd_recompute_ms; shapes as `NxL` documents of L tokens, L in tokens or `k`, or
`mix16k`): how the H100 profile was seeded (results/gpu/h100-2026-11-26/README.md).
"""

from __future__ import annotations

import itertools
import json
import platform
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
import torch
from torch.utils.checkpoint import noop_context_fn

from odc_bench.balancers.cost import CALIBRATION_UNIT, calibration_path, load_calibration
from odc_bench.config.compose import COMPOSE_ERRORS, compose_run, hydra_error_line
from odc_bench.config.model import ModelConfig
from odc_bench.config.run import RunConfig
from odc_bench.data.batches import packed_batch
from odc_bench.data.lengths import dataset_lengths, dataset_max_len
from odc_bench.data.tokens import sample_tokens
from odc_bench.errors import CommandParser, ConfigError, command_name, ends_cleanly, fail
from odc_bench.files import atomic_write_text, writable_file
from odc_bench.forked import usable_cpus
from odc_bench.models.attention import Documents, kernel_for
from odc_bench.models.checkpointing import run_layer
from odc_bench.models.decoder import DecoderLayer, DecoderModel, build_model, compile_dense, rope_tables
from odc_bench.plan.device import device_type_of, hardware_tag
from odc_bench.provenance import git_commit
from odc_bench.run.trace import CudaClock, DeviceClock
from odc_bench.sim import unit_fit


def microbatch_shapes(max_tokens: int, points: int = 8) -> list[list[int]]:
    """Single documents on a geometric grid up to max_tokens, then packs of 2 to 4 documents."""
    lo = max(8, max_tokens // 32)
    singles = sorted({int(round(x)) for x in np.geomspace(lo, max_tokens, points)})
    packs = [[max_tokens // 2] * 2, [max_tokens // 4] * 4, [max_tokens // 2, max_tokens // 4, max_tokens // 8],
             [max_tokens // 8] * 4]
    return [[s] for s in singles] + [p for p in packs if min(p) >= 2]


def time_microbatches(model: torch.nn.Module, device: torch.device, shapes: list[list[int]], vocab: int,
                      repeats: int, warmup: int = 1) -> list[list[float]]:
    """Seconds of forward + backward per shape and repeat, shapes interleaved within each round."""
    batches = []
    for s, doc_lens in enumerate(shapes):
        docs = [sample_tokens(0, 1000 * s + j, n, vocab) for j, n in enumerate(doc_lens)]
        batches.append({k: v.to(device) if torch.is_tensor(v) else v for k, v in packed_batch(docs).items()})
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seconds: list[list[float]] = [[] for _ in shapes]
    for round_ in range(warmup + repeats):
        for s, batch in enumerate(batches):
            sync()
            t0 = time.perf_counter()
            model(**batch).backward()
            sync()
            if round_ >= warmup:
                seconds[s].append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
    return seconds


def fit_nonnegative(shapes: list[list[int]], seconds: list[float]) -> tuple[float, float, float]:
    """Least squares of seconds ~ a sum(x^2) + b sum(x) + c over microbatches, a, b, c >= 0.

    Three unknowns: the best non-negative fit is the best unconstrained fit over every
    subset of the terms whose coefficients come out non-negative.
    """
    x = [[n / CALIBRATION_UNIT for n in shape] for shape in shapes]
    design = np.array([[sum(v * v for v in xs), sum(xs), 1.0] for xs in x])
    y = np.asarray(seconds)
    best, best_err = (0.0, 0.0, 0.0), float("inf")
    for size in (1, 2, 3):
        for cols in itertools.combinations(range(3), size):
            coef, *_ = np.linalg.lstsq(design[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            err = float(np.sum((design[:, cols] @ coef - y) ** 2))
            if err < best_err:
                full = [0.0, 0.0, 0.0]
                for col, value in zip(cols, coef, strict=True):
                    full[col] = float(value)
                best, best_err = (full[0], full[1], full[2]), err
    return best


# Unit shapes on CUDA: single documents, then packs (mix16k: the probe's 8K+4K+2K+1K+512+256+128+128).
MIX16K = [8192, 4096, 2048, 1024, 512, 256, 128, 128]
UNIT_SHAPES = {
    "full": [[1024], [2048], [4096], [8192], [16384], [512] * 16, [512] * 32, [1024] * 8, [1024] * 16,
             [4096] * 4, [8192] * 2, MIX16K],
    "reduced": [[1024], [4096], [16384], [512] * 16, [4096] * 4, MIX16K],
}
# The shapes of the larger models timed beside the run's (--unit-models): with --reduced, 16K-token
# microbatches only, enough to place their linear and attention terms in the fit and
# to read their layers' share of the device's peak where real trainers run them.
OTHER_MODEL_SHAPES = {"full": UNIT_SHAPES["full"], "reduced": [[4096] * 4, [16384], MIX16K]}
UNIT_MODELS_FLAG = "--unit-models="


def _progress(what: str, since: float) -> None:
    """One line on stderr per stage: a calibration on a GPU takes minutes (building, compiling,
    timing), and a time limit that stops it should show how far it got."""
    print(f"cost_model: {what} ({time.monotonic() - since:.0f} s)", file=sys.stderr, flush=True)


def _device_seconds(prepare: Callable[[], Callable[[], object]], repeats: int, clock: DeviceClock,
                    warmup: int = 2) -> float:
    """Median device seconds over repeats of the call prepare() returns (marks of `clock` around
    it on the current stream; prepare's own work untimed)."""
    times = []
    for i in range(warmup + repeats):
        fn = prepare()
        start = clock.mark()
        fn()
        end = clock.mark()
        clock.synchronize()
        if i >= warmup:
            times.append(clock.elapsed_ms(start, end) / 1e3)
    return statistics.median(times)


def _forward_backward(forward: Callable[[], torch.Tensor], repeats: int, clock: DeviceClock) -> tuple[float, float]:
    """Device seconds of a unit's forward, and of its backward, each backward from a forward of
    its own: compiled code frees the saved tensors its backward donates, so a graph cannot be
    run backward twice (retain_graph)."""
    def backward() -> Callable[[], object]:
        out = forward()
        grad = torch.ones_like(out)
        return lambda: out.backward(grad)

    return _device_seconds(lambda: forward, repeats, clock), _device_seconds(backward, repeats, clock)


def _time_shape(model: DecoderModel, doc_lens: list[int], repeats: int, clock: DeviceClock) -> list[dict]:
    cfg, device = model.cfg, model.head.lm_head.weight.device
    layer = cast(DecoderLayer, model.layers[0])
    batch = packed_batch([sample_tokens(0, j, n, cfg.vocab_size) for j, n in enumerate(doc_lens)])
    ids, labels = cast(torch.Tensor, batch["input_ids"]).to(device), cast(torch.Tensor, batch["labels"]).to(device)
    x = torch.randn(len(ids), cfg.hidden_size, device=device, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = rope_tables(cast(torch.Tensor, batch["position_ids"]).to(device), cfg.head_size, cfg.rope_theta,
                           x.dtype)
    kernel = kernel_for(x, cfg.head_size)
    docs = Documents.of(doc_lens, device, kernel)
    embed = _forward_backward(lambda: model.embed(ids), repeats, clock)
    fwd, bwd = _forward_backward(lambda: layer(x, cos, sin, docs), repeats, clock)
    _, recomputed = _forward_backward(lambda: run_layer(layer, noop_context_fn, x, cos, sin, docs), repeats, clock)
    head = _forward_backward(lambda: model.head(x, labels), repeats, clock)
    model.zero_grad(set_to_none=True)
    return [dict(model=cfg.name, unit="embed", doc_lens=doc_lens, fwd=embed[0], bwd=embed[1]),
            dict(model=cfg.name, unit="layer", doc_lens=doc_lens, fwd=fwd, bwd=bwd, bwd_recompute=recomputed,
                 attention=kernel),
            dict(model=cfg.name, unit="head", doc_lens=doc_lens, fwd=head[0], bwd=head[1])]


def time_units(cfg: ModelConfig, device: torch.device, shapes: list[list[int]], repeats: int,
               clock: DeviceClock | None = None, compiled: bool = True) -> list[dict]:
    """Per shape and unit kind, forward and backward device seconds of one unit as the harness runs
    it on CUDA (bf16, compile_dense, the varlen kernel), and a layer's backward with its forward
    recomputed (activation checkpointing). `clock` (CUDA events unless given) and `compiled` let
    the CPU tests run it."""
    model = build_model(replace(cfg, num_layers=1), 0, device).to(torch.bfloat16)
    if compiled:
        compile_dense(model)
    rows, started = [], time.monotonic()
    for doc_lens in shapes:
        rows += _time_shape(model, doc_lens, repeats, clock or CudaClock())
        _progress(f"{cfg.name} units timed on {len(doc_lens)} document(s) of {sum(doc_lens)} tokens", started)
    return rows


def units_record(rows: list[dict], models: dict[str, ModelConfig], device_name: str) -> dict:
    """What a compute calibration holds of its units: the fit and the timings it came from."""
    return dict(units=unit_fit.fit(rows, models), unit_device=device_name, unit_timings=rows)


def calibrate(config: RunConfig, repeats: int = 5, unit_shapes: str = "full",
              unit_models: Sequence[ModelConfig] = ()) -> Path:
    lengths = dataset_lengths(config.dataset, config.seed)
    max_tokens = config.max_tokens or int(dataset_max_len(config.dataset, lengths) * config.packing_ratio)
    device = torch.device(device_type_of(config))
    if unit_models and device.type != "cuda":
        raise ConfigError(f"{UNIT_MODELS_FLAG.rstrip('=')} times units with CUDA events, and this calibration runs on "
                          f"{device.type}; leave it out, or run on a GPU (device=cuda)")
    threads = config.threads_per_rank or max(1, usable_cpus() // config.world_size)
    if device.type == "cpu":
        torch.set_num_threads(threads)
    started = time.monotonic()
    model = build_model(config.model, config.seed, device)
    if device.type == "cuda":  # as the harness runs it there: in the run's precision
        model = model.to(torch.bfloat16 if config.precision == "bf16" else torch.float32)
    if config.compiles(device.type):  # and compiled as the run would be
        compile_dense(model)
    _progress(f"{config.model.name} built", started)
    shapes = microbatch_shapes(int(max_tokens))
    seconds = time_microbatches(model, device, shapes, config.model.vocab_size, repeats)
    _progress(f"{config.model.name} timed on {len(shapes)} microbatch shapes", started)
    del model
    medians = [statistics.median(s) for s in seconds]
    a, b, c = fit_nonnegative(shapes, medians)
    if a + b <= 0:
        raise ConfigError(f"timings of {config.model.name} do not grow with length (max_tokens={max_tokens} is too "
                          f"small to measure); raise max_tokens or dataset.length_scale")
    predicted = [a * sum((n / CALIBRATION_UNIT) ** 2 for n in sh) + b * sum(n / CALIBRATION_UNIT for n in sh) + c
                 for sh in shapes]
    rel_err = [abs(p - m) / m for p, m in zip(predicted, medians, strict=True)]
    path = calibration_path(config.model.name, hardware_tag(device.type), config.balancer.calibration)
    record = dict(
        model=config.model.name, device=device.type,
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        unit=CALIBRATION_UNIT, a=a, b=b, c=c, max_rel_error=max(rel_err),
        formula="seconds = a * sum((len/unit)^2) + b * sum(len/unit) + c, per microbatch",
        provenance=dict(host=socket.gethostname(), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), commit=git_commit(),
                        command=" ".join([Path(sys.executable).name, "-m", "odc_bench.calibrate.cost_model",
                                          *sys.argv[1:]]),
                        torch=torch.__version__, threads=threads if device.type == "cpu" else None,
                        max_tokens=int(max_tokens), repeats=repeats,
                        precision=config.precision if device.type == "cuda" else "fp32"),
        timings=[dict(doc_lens=sh, seconds=s, median=m) for sh, s, m in zip(shapes, seconds, medians, strict=True)],
    )
    models, rows = {config.model.name: config.model}, []
    if device.type == "cuda":
        rows = time_units(config.model, device, UNIT_SHAPES[unit_shapes], repeats, compiled=config.compiles("cuda"))
        record.update(units_record(rows, models, torch.cuda.get_device_name(device)))
    _write(path, record)
    # The other models after the run's own is written, and the profile again after each: a time
    # limit reached while one is built or timed (make gpu-check's) keeps every model timed before it.
    for other in unit_models:
        if other.name not in models:  # each model timed once
            models[other.name] = other
            rows += time_units(other, device, OTHER_MODEL_SHAPES[unit_shapes], repeats,
                               compiled=config.compiles("cuda"))
            record.update(units_record(rows, models, torch.cuda.get_device_name(device)))
            _write(path, record)
    return path


def _write(path: Path, record: dict) -> None:
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    load_calibration(path)  # what later runs will read must load


def shape_lengths(shape: str) -> list[int]:
    """A timings file's shape name as document lengths: `NxL` (L in tokens, or with k), or mix16k."""
    if shape == "mix16k":
        return list(MIX16K)
    match = re.fullmatch(r"(\d+)x(\d+)(k?)", shape)
    if match is None:
        raise ConfigError(f"unknown shape {shape!r} in the timings; shapes are NxL (L tokens, or Lk) or mix16k")
    count, length, kilo = match.groups()
    if int(count) < 1 or int(length) < 1:
        raise ConfigError(f"shape {shape!r} in the timings holds no tokens; a shape is N documents of L tokens, "
                          f"each at least 1")
    return [int(length) * (1024 if kilo else 1)] * int(count)


def _seconds(value: object, column: str, where: str, optional: bool = False) -> float:
    """A timing's milliseconds as seconds; ConfigError for one that is missing (unless `optional`:
    NaN, a phase not timed), not a number, or not above zero, which the fit would drop unsaid."""
    if optional and (value is None or (isinstance(value, float) and np.isnan(value))):
        return float("nan")
    try:
        ms = float(cast(str, value))
    except (TypeError, ValueError):
        ms = float("nan")
    if not (np.isfinite(ms) and ms > 0):
        shown = "nothing" if isinstance(value, float) and np.isnan(value) else repr(value)
        raise ConfigError(f"{where}: {column} must be a positive number of milliseconds, got {shown}; fix the "
                          f"row or remove it")
    return ms / 1e3


def fit_timings(csv_path: Path, device_name: str) -> dict:
    """A compute calibration's units from unit timings measured elsewhere (module docstring)."""
    try:
        # A byte-order mark, as a spreadsheet may save one; names as text, however they look; only an
        # empty cell is missing (a cell saying n/a is shown as it is when refused).
        table = pd.read_csv(csv_path, encoding="utf-8-sig", dtype=dict.fromkeys(("model", "unit", "shape"), str),
                            keep_default_na=False, na_values=[""])
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read unit timings {csv_path} ({e})") from None
    missing = {"model", "unit", "shape", "fwd_ms", "bwd_ms"} - set(table.columns)
    if missing:
        raise ConfigError(f"{csv_path} lacks the column(s) {', '.join(sorted(missing))}")
    if table.empty:
        raise ConfigError(f"{csv_path} holds no timings, only its header; give a row per unit and shape timed")
    for column in ("model", "unit", "shape"):
        if (empty := table[column].isna().to_numpy()).any():
            raise ConfigError(f"{csv_path}: row {int(empty.argmax()) + 1} (after the header) has no {column}; fill it "
                              f"in or remove the row")
    try:
        models = {name: compose_run([f"model={name}"]).model for name in sorted(set(table["model"]))}
    except COMPOSE_ERRORS as e:
        raise ConfigError(f"{csv_path}: {hydra_error_line(e)}") from None
    rows = []
    for r in table.to_dict("records"):
        where = f"{csv_path}, the row of {r['model']} {r['unit']} {r['shape']}"
        if r["unit"] not in unit_fit.TERMS:
            raise ConfigError(f"{where}: unit {r['unit']!r} is not a unit kind; the kinds are "
                              f"{', '.join(unit_fit.TERMS)}")
        rows.append(dict(model=r["model"], unit=r["unit"], doc_lens=shape_lengths(r["shape"]),
                         fwd=_seconds(r["fwd_ms"], "fwd_ms", where), bwd=_seconds(r["bwd_ms"], "bwd_ms", where),
                         bwd_recompute=_seconds(r.get("bwd_recompute_ms"), "bwd_recompute_ms", where, optional=True)))
    _check_determined(rows, models, csv_path)
    return dict(units_record(rows, models, device_name), provenance=dict(
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), commit=git_commit(), timings=str(csv_path),
        command=" ".join([Path(sys.executable).name, "-m", "odc_bench.calibrate.cost_model", *sys.argv[1:]])))


def _check_determined(rows: list[dict], models: dict[str, ModelConfig], csv_path: Path) -> None:
    """ConfigError where a unit kind's timings are too few to judge its fit: as many shapes as the
    terms they can tell apart fit them exactly, whatever the timings, and the calibration said so
    with a median error of 0 (one layer timing gave a fit of 0.0%)."""
    def rank(points: set[tuple[str, tuple[int, ...]]], kind: str) -> int:
        design = np.array([unit_fit.features(models[m], kind, lens) for m, lens in points])
        return int(np.linalg.matrix_rank(design / np.maximum(np.abs(design).max(axis=0), 1e-300)))

    for kind in unit_fit.TERMS:
        points = {(r["model"], tuple(r["doc_lens"])) for r in rows if r["unit"] == kind}
        # What the GPU calibration's shapes of these models can tell apart (terms move together
        # within one model: a layer's matrix products and attention's per-token part).
        full = rank({(m, tuple(lens)) for m, _ in points for lens in UNIT_SHAPES["full"]}, kind) if points else 0
        if points and len(points) <= min(rank(points, kind), full):
            raise ConfigError(f"{csv_path}: the {kind} timings hold {len(points)} shape(s), which its fit matches "
                              f"exactly whatever they measured; time at least {full + 1} shapes of other token counts "
                              f"and document lengths (the GPU calibration's: 1x1k, 1x4k, 1x16k, 16x512, 4x4k, mix16k)")


def _compose(overrides: list[str]) -> RunConfig:
    """The run config the overrides ask for, as `python -m odc_bench` composes it (without Hydra's
    app: nothing is written but the calibration); ConfigError in one line for a bad one."""
    try:
        return compose_run(overrides)
    except COMPOSE_ERRORS as e:
        raise ConfigError(hydra_error_line(e)) from None


def _calibrate(overrides: list[str], unit_shapes: str, models: str | None) -> None:
    try:
        config = _compose(overrides)
        others = unit_models(models) if models is not None else []
        path = calibrate(config, repeats=3 if unit_shapes == "reduced" else 5, unit_shapes=unit_shapes,
                         unit_models=others)
    except ConfigError as e:
        fail(e, command_name(__spec__.name))
    data = json.loads(path.read_text())
    print(f"wrote {path}: a={data['a']:.4g} b={data['b']:.4g} c={data['c']:.4g} "
          f"(x = length/{data['unit']}, seconds; worst fit error {data['max_rel_error']:.1%})")
    for kind, phases in data.get("units", {}).items():
        for phase, fitted in phases.items():
            print(f"  {kind} {phase}: fixed {fitted['c0'] * 1e3:.3f} ms, median error {fitted['median_error']:.1%} "
                  f"over {fitted['points']} shapes")


def unit_models(names: str) -> list[ModelConfig]:
    """The models --unit-models=A,B names, composed as `model=A` would be; ConfigError naming a
    model that is not one."""
    models = []
    for name in filter(None, names.split(",")):
        try:
            models.append(compose_run([f"model={name}"]).model)
        except COMPOSE_ERRORS as e:
            raise ConfigError(f"{UNIT_MODELS_FLAG}{names}: {hydra_error_line(e)}") from None
    if not models:
        raise ConfigError(f"{UNIT_MODELS_FLAG.rstrip('=')} names no model; give model names, comma-separated "
                          "(e.g. --unit-models=qwen2_7b,qwen2_14b)")
    return models


def main(argv: list[str] | None = None) -> None:
    """`--timings` fits a timings file; otherwise the run's config overrides (`--reduced`: fewer unit
    shapes; `--unit-models=A,B`: those models' units too)."""
    ap = CommandParser(command_name(__spec__.name), description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                    help="the run's config overrides: its model, device, threads per rank, dataset and max_tokens "
                         "decide what a rank computes, balancer.calibration where the file goes")
    ap.add_argument("--reduced", action="store_true", help="on CUDA: fewer unit shapes, three times each")
    ap.add_argument(UNIT_MODELS_FLAG.rstrip("="), dest="unit_models", metavar="A,B",
                    help="on CUDA: one layer of each of these models timed too, so that the fit spans model sizes")
    ap.add_argument("--timings", type=Path, help="instead, fit unit timings measured elsewhere: a CSV with columns "
                                                 "model, unit, shape, fwd_ms, bwd_ms (with --out and --device)")
    ap.add_argument("--out", type=writable_file, help="with --timings: the calibration file to write (JSON)")
    ap.add_argument("--device", help="with --timings: the GPU the timings were taken on, as torch names it")
    # Intermixed: overrides may come before, between or after the options.
    args = ap.parse_intermixed_args(argv)
    if args.timings is None:
        if args.out is not None or args.device is not None:
            ap.error("--out and --device go with --timings")
        _calibrate(args.overrides, "reduced" if args.reduced else "full", args.unit_models)
        return
    if args.out is None or args.device is None:
        ap.error("--timings needs --out FILE and --device NAME")
    if args.overrides or args.reduced or args.unit_models is not None:
        ap.error("--timings fits a file: it takes --out and --device, no config overrides or other options")
    try:
        record = fit_timings(args.timings, args.device)
    except ConfigError as e:
        fail(e, ap.prog)
    atomic_write_text(args.out, json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}: units fitted to {len(record['unit_timings'])} timings of {args.timings}")


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
