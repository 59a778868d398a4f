"""Benchmark the simulator: `python -m odc_bench.tools.sim_bench` times the paper-scale case.

The target (issue 8): a 32-rank, 14B, 100-minibatch simulation in under 2 seconds. Prints
the wall and CPU seconds of planning (config resolution and the balancer), simulation
(timelines and the event trace) and summary (metrics.summarize), for both engines. This
machine is shared, so the CPU seconds are the steadier number.
"""

from __future__ import annotations

import argparse
import time

from odc_bench.config.compose import compose_run
from odc_bench.plan.spec import resolve
from odc_bench.record.row import timing
from odc_bench.sim import simulate

CASE = ("backend=sim", "backend/hardware=a100", "backend.recompute=true", "model=qwen2_14b", "world_size=32",
        "minibatch_size=4", "num_minibatches=100", "warmup_minibatches=0", "dataset.length_scale=1",
        "precision=bf16")


def timed(fn, *args):
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - w, time.process_time() - c


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for the benchmarked case")
    args = ap.parse_args(argv)
    for engine in ("collective", "odc"):
        config = compose_run([*CASE, f"engine={engine}", *args.overrides])
        spec, w0, c0 = timed(resolve, config)
        sim, w1, c1 = timed(simulate, spec)
        row, w2, c2 = timed(timing, spec, sim.events)
        print(f"{engine:10s} plan {w0:5.2f}s (cpu {c0:4.2f})  simulate {w1:5.2f}s (cpu {c1:4.2f})  "
              f"summary {w2:5.2f}s (cpu {c2:4.2f})  total {w0 + w1 + w2:5.2f}s (cpu {c0 + c1 + c2:4.2f})  "
              f"{len(sim.events)} events, {row['samples_per_s']:.3f} samples/s, bubble {row['bubble_rate']:.2f}")


if __name__ == "__main__":
    main()
