"""Fit the `calibrated` cost model: time microbatches of the chosen model on this machine.

`python -m odc_bench.tools.calibrate [hydra overrides]` uses the run config (model, device,
threads per rank, dataset and max_tokens), so a calibration describes what a rank of that
run computes. It times forward plus backward of single documents across the length range
up to max_tokens and of packed microbatches of several documents (interleaved, median of
repeats), fits time = a x^2 + b x + c with x = (sum over documents of length) / 1000 for b,
the sum of squared document lengths for a, and c once per microbatch, by least squares with
non-negative coefficients, and writes them, with the raw timings and where they came from,
to results/calibration/<model>-<device>.json (or balancer.calibration), atomically. Later
runs with balancer.cost_model=calibrated load that file.

Timings are per-rank compute only (no communication, fp32), which is what balancers
distribute; on the tiny model it takes seconds.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig

from odc_bench.balancers.cost import CALIBRATION_UNIT, calibration_path, load_calibration
from odc_bench.config.run import RunConfig, load
from odc_bench.data.batches import packed_batch
from odc_bench.data.lengths import dataset_lengths, dataset_max_len
from odc_bench.data.tokens import sample_tokens
from odc_bench.errors import ConfigError, fail
from odc_bench.files import atomic_write_text
from odc_bench.models.decoder import build_model
from odc_bench.plan.device import device_type_of, hardware_tag
from odc_bench.provenance import git_commit


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


def calibrate(config: RunConfig, repeats: int = 5) -> Path:
    lengths = dataset_lengths(config.dataset, config.seed)
    max_tokens = config.max_tokens or int(dataset_max_len(config.dataset, lengths) * config.packing_ratio)
    device = torch.device(device_type_of(config))
    threads = config.threads_per_rank or max(1, (os.cpu_count() or 1) // config.world_size)
    if device.type == "cpu":
        torch.set_num_threads(threads)
    model = build_model(config.model, config.seed, device)
    shapes = microbatch_shapes(int(max_tokens))
    seconds = time_microbatches(model, device, shapes, config.model.vocab_size, repeats)
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
                        command=" ".join([Path(sys.executable).name, "-m", "odc_bench.tools.calibrate", *sys.argv[1:]]),
                        torch=torch.__version__, threads=threads if device.type == "cpu" else None,
                        max_tokens=int(max_tokens), repeats=repeats, precision="fp32"),
        timings=[dict(doc_lens=sh, seconds=s, median=m) for sh, s, m in zip(shapes, seconds, medians, strict=True)],
    )
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    load_calibration(path)  # what later runs will read must load
    return path


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        path = calibrate(load(cfg))
    except ConfigError as e:
        fail(e, "odc_bench.tools.calibrate")
    data = json.loads(path.read_text())
    print(f"wrote {path}: a={data['a']:.4g} b={data['b']:.4g} c={data['c']:.4g} "
          f"(x = length/{data['unit']}, seconds; worst fit error {data['max_rel_error']:.1%})")


if __name__ == "__main__":
    main()
