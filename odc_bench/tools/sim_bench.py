"""Benchmark planning and simulation at scale: `python -m odc_bench.tools.sim_bench`.

The targets (issue 24): a 32B, LongAlign, 100-minibatch simulation (4 samples per rank,
lengths at full scale, no trace) in under 10 s at 1,024 ranks and under 60 s at 4,096,
planning included, for both engines (Collective + LB-Micro and ODC + LB-Mini). For each case
it prints the wall and CPU seconds of planning (config resolution and the balancer),
simulation (the timeline) and summary (the row's timing columns), the process's peak memory,
and a digest of the plans (one seed, one plan: the digest is the same on every run). This
machine is shared, so the CPU seconds are the steadier number.
"""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable
from typing import TypeVar

from odc_bench.config.compose import compose_run
from odc_bench.plan.spec import plan_digest, resolve
from odc_bench.record.row import sim_timing
from odc_bench.results.series import HEADLINE_BASELINE, HEADLINE_ODC
from odc_bench.sim import simulate

CASE = ("backend=sim", "backend/hardware=a100", "backend.recompute=true", "backend.write_trace=false",
        "model=qwen2_32b", "dataset=longalign", "dataset.length_scale=1", "minibatch_size=4", "warmup_minibatches=0",
        "precision=bf16")
SERIES = (HEADLINE_BASELINE, HEADLINE_ODC)
# LongAlign-10k has 10,000 samples; a minibatch of more draws a larger pool from its profile.
PROFILE_SAMPLES = 10_000

T = TypeVar("T")


def timed(fn: Callable[..., T], *args: object) -> tuple[T, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - w, time.process_time() - c


def case(ranks: int, minibatches: int, engine: str, balancer: str, extra: list[str]) -> list[str]:
    pool = [] if 4 * ranks <= PROFILE_SAMPLES else [f"dataset.num_samples={16 * ranks}"]
    return [*CASE, f"world_size={ranks}", f"num_minibatches={minibatches}", f"engine={engine}",
            f"balancer={balancer}", *pool, *extra]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096], help="world sizes (default: 1024 4096)")
    ap.add_argument("--minibatches", type=int, default=100)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every case")
    args = ap.parse_args(argv)
    for ranks in args.ranks:
        for engine, balancer in SERIES:
            config = compose_run(case(ranks, args.minibatches, engine, balancer, args.overrides))
            spec, w0, c0 = timed(resolve, config, False)
            sim, w1, c1 = timed(simulate, spec, False)
            row, w2, c2 = timed(sim_timing, spec, sim)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(f"{ranks:5d} ranks {engine}+{balancer:9s} plan {w0:6.2f}s (cpu {c0:5.2f})  simulate {w1:6.2f}s "
                  f"(cpu {c1:5.2f})  summary {w2:5.2f}s  total {w0 + w1 + w2:6.2f}s (cpu {c0 + c1 + c2:5.2f})  "
                  f"peak {peak:4.1f} GiB  {row['samples_per_s']:.3f} samples/s, bubble {row['bubble_rate']:.3f}  "
                  f"plans {plan_digest(spec)}", flush=True)


if __name__ == "__main__":
    main()
