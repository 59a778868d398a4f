"""Time the simulator's acceptance commands at the reference speed: `python -m odc_bench.tools.sim_bench`.

The commands (issue 45), each run as a user runs it, in a fresh process writing to a fresh
folder, imports included:

- sim-1024: `python -m odc_bench` simulating 32B on LongAlign at 1,024 ranks, 4 samples per
  rank, 100 minibatches, no trace (ODC + LB-Mini; sim-1024-collective: Collective + LB-Micro);
  target 5 s;
- sim-4096: the same at 4,096 ranks (a pool of 65,536 LongAlign-like samples); target 20 s;
- whatif: `python -m odc_bench.whatif examples/lengths.jsonl --model qwen2_7b --nodes 4` (32
  devices, every verdict series at minibatch sizes 1, 2, 4, 8); target 3 s; whatif-stale:
  the same with `--staleness 1`; target 8 s.

This machine's speed moves within minutes, so before each command the reference loop runs:
the best of 3 CPU timings of `sum(i * i for i in range(10**7))`. A command's time at the
reference speed is its wall time x 0.70 s / that loop's time (0.70 s: the reference machine
on a quiet hour). Each line prints the wall time, the loop's time and the scaled time beside
its target, and the command's CPU seconds, scaled the same way: on a machine shared with
other work the wall time waits for the cores, and the CPU time says what the command costs.

`--stages` prints instead, in this process, the wall and CPU seconds of each stage for both
engines (planning: config resolution, the balancer and the cost model's prediction;
simulation; summary), the peak memory and a digest of the plans (one seed, one plan: the same
digest on every run).
"""

from __future__ import annotations

import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from odc_bench.config.compose import COMPOSE_ERRORS, compose_run, hydra_error_line, string_override
from odc_bench.errors import CommandParser, ConfigError, command_name, ends_cleanly, fail, in_options, positive_int
from odc_bench.plan.spec import plan_digest, resolve
from odc_bench.provenance import REPO_ROOT
from odc_bench.record.row import sim_timing
from odc_bench.results.series import HEADLINE_BASELINE, HEADLINE_ODC
from odc_bench.sim import simulate

CASE = ("backend=sim", "backend/hardware=a100", "backend.recompute=true", "backend.write_trace=false",
        "model=qwen2_32b", "dataset=longalign", "dataset.length_scale=1", "minibatch_size=4", "warmup_minibatches=0",
        "precision=bf16")
SERIES = (HEADLINE_BASELINE, HEADLINE_ODC)
# LongAlign-10k has 10,000 samples; a minibatch of more draws a larger pool from its profile.
PROFILE_SAMPLES = 10_000
REFERENCE_LOOP_S = 0.70
WHATIF = ("examples/lengths.jsonl", "--model", "qwen2_7b", "--nodes", "4")

T = TypeVar("T")


def case(ranks: int, minibatches: int, engine: str, balancer: str, extra: list[str]) -> list[str]:
    pool = [] if 4 * ranks <= PROFILE_SAMPLES else [f"dataset.num_samples={16 * ranks}"]
    return [*CASE, f"world_size={ranks}", f"num_minibatches={minibatches}", f"engine={engine}",
            f"balancer={balancer}", *pool, *extra]


def commands(out: Path) -> dict[str, tuple[list[str], float]]:
    """name -> (the command, its target in seconds at the reference speed); `out` holds what they write."""
    run = [sys.executable, "-m", "odc_bench"]

    def sim(name: str, ranks: int, engine: str, balancer: str) -> list[str]:
        return [*run, *case(ranks, 100, engine, balancer, []), string_override("results_dir", out / name),
                string_override("hydra.run.dir", out / name / "hydra")]

    whatif = [sys.executable, "-m", "odc_bench.whatif", *WHATIF]
    return {
        "sim-1024": (sim("sim-1024", 1024, *HEADLINE_ODC), 5.0),
        "sim-1024-collective": (sim("sim-1024-collective", 1024, *HEADLINE_BASELINE), 5.0),
        "sim-4096": (sim("sim-4096", 4096, *HEADLINE_ODC), 20.0),
        "whatif": ([*whatif, "--out", str(out / "whatif")], 3.0),
        "whatif-stale": ([*whatif, "--staleness", "1", "--out", str(out / "whatif-stale")], 8.0),
    }


def reference_loop_s() -> float:
    """The best of 3 CPU timings of the reference loop, on this machine now."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        sum(i * i for i in range(10**7))
        best = min(best, time.process_time() - start)
    return best


def time_commands(names: list[str], repeat: int = 1) -> None:
    """Each command `repeat` times, round after round (so the machine's drift reaches every
    command alike), a line per run; with several rounds, each command's median and range."""
    scaled: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="sim_bench-") as tmp:
        todo = commands(Path(tmp))
        for round_ in range(repeat):
            for name in names or list(todo):
                command, target = todo[name]
                if round_:
                    shutil.rmtree(Path(tmp) / name, ignore_errors=True)  # a fresh folder, as a user's first run
                scaled.setdefault(name, []).append(time_command(name, command, target))
    if repeat > 1:
        for name, times in scaled.items():
            target = todo[name][1]
            median = statistics.median(times)
            print(f"{name:20s} median of {repeat} at the reference speed {median:6.2f} s (range {min(times):.2f}-"
                  f"{max(times):.2f} s)  target {target:4.1f} s  {'ok' if median <= target else 'OVER'}")


def time_command(name: str, command: list[str], target: float) -> float:
    """Run one command beside the reference loop, print its line; its time at the reference speed."""
    loop = reference_loop_s()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        sys.exit(f"sim_bench: {name} failed (exit status {done.returncode}): {' '.join(tail)}")
    scaled = wall * REFERENCE_LOOP_S / loop
    print(f"{name:20s} wall {wall:6.2f} s (cpu {cpu:6.2f} s)  reference loop {loop:5.3f} s  at the reference "
          f"speed {scaled:6.2f} s (cpu {cpu * REFERENCE_LOOP_S / loop:6.2f} s)  target {target:4.1f} s  "
          f"{'ok' if scaled <= target else 'OVER'}", flush=True)
    return scaled


def timed(fn: Callable[..., T], *args: object) -> tuple[T, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - w, time.process_time() - c


def stages(ranks_list: list[int], minibatches: int, overrides: list[str]) -> None:
    for ranks in ranks_list:
        for engine, balancer in SERIES:
            config = compose_run(case(ranks, minibatches, engine, balancer, overrides))
            spec, w0, c0 = timed(resolve, config)
            sim, w1, c1 = timed(simulate, spec, False)
            row, w2, c2 = timed(sim_timing, spec, sim)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(f"{ranks:5d} ranks {engine}+{balancer:9s} plan {w0:6.2f}s (cpu {c0:5.2f})  simulate {w1:6.2f}s "
                  f"(cpu {c1:5.2f})  summary {w2:5.2f}s  total {w0 + w1 + w2:6.2f}s (cpu {c0 + c1 + c2:5.2f})  "
                  f"peak {peak:4.1f} GiB  {row['samples_per_s']:.3f} samples/s, bubble {row['bubble_rate']:.3f}  "
                  f"plans {plan_digest(spec)}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = CommandParser(command_name(__spec__.name), description=__doc__.split("\n\n")[0])
    ap.add_argument("commands", nargs="*", metavar="NAME",
                    help=f"the commands to time (default: all of {', '.join(commands(Path('.')))}); with --stages, "
                         f"extra Hydra overrides for every case")
    ap.add_argument("--stages", action="store_true", help="each stage's seconds in this process instead")
    ap.add_argument("--ranks", type=positive_int, nargs="+", default=[1024, 4096],
                    help="--stages: world sizes (1024 4096)")
    ap.add_argument("--minibatches", type=positive_int, default=100, help="--stages: minibatches per run (100)")
    ap.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                    help="run the commands N rounds and print each one's median and range (default: 1)")
    args = ap.parse_args(argv)
    if args.stages:
        try:
            stages(args.ranks, args.minibatches, args.commands)
        except COMPOSE_ERRORS as e:
            fail(ConfigError(hydra_error_line(e)), ap.prog)
        except ConfigError as e:
            fail(ConfigError(in_options(str(e), (("world_size", "--ranks"), ("num_minibatches", "--minibatches")))),
                 ap.prog)
        return
    unknown = sorted(set(args.commands) - set(commands(Path("."))))
    if unknown:
        ap.error(f"unknown command {unknown[0]!r}; choose from {', '.join(commands(Path('.')))}")
    time_commands(args.commands, args.repeat)


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
