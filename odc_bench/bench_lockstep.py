"""How much a CPU host slows ranks down for computing the same thing at the same moment.

Collective FSDP keeps ranks in lockstep: with equal lengths, both run the same layer's
forward or backward at the same time. On GPUs each rank has a device to itself, but on a
CPU host the ranks share caches and memory bandwidth, so phases that line up compete with
each other (not through page faults: an allocator that avoids them left the penalty in
place, results/host/README.md). ODC ranks drift apart between their once per
minibatch barriers. This benchmark measures the effect with no communication at all, to tell
how much of a CPU comparison of the engines on equal lengths is the host rather than the
engines (docs/odc_engine.md, "The balanced control where compute dominates").

`python -m odc_bench.bench_lockstep [--tokens N] [--steps N] [--pairs N] [--pin] [--out FILE]`:
two rank processes repeat the tiny model's forward and backward on one N-token sample
(with `--pin`, each on a CPU of its own, to tell the penalty from the scheduler moving them):

- aligned: both ranks start every step together (a barrier through the store);
- staggered: rank 1 starts half a step after rank 0, then neither waits for the other.

The two modes run back to back in each pair, the order alternating. Printed per pair and
overall: each mode's median step time, the aligned/staggered ratio, and the share of step
time the ranks spent in the kernel (system time: page faults and the like).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from odc_bench.launch.ranks import run_ranks
from odc_bench.models.qwen2 import packed_batch
from odc_bench.results import atomic_write_text
from odc_bench.worker import build_model

MODES = ("aligned", "staggered")
TINY = Path(__file__).parent / "conf" / "model" / "tiny.yaml"
TIMEOUT_S = 600.0


def _barrier(store: dist.Store, key: str, world: int) -> None:
    store.add(key, 1)
    while store.add(key, 0) < world:
        time.sleep(1e-4)


def rank_main(rank: int, world: int, store: dist.Store, tokens: int, steps: int,
              mode: str, pin: bool) -> list[tuple[float, float, float, str]]:
    """This rank's (start, seconds, kernel seconds, CPUs it may run on) per step, on the host's
    monotonic clock."""
    torch.set_num_threads(1)
    if pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    allowed = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    model = build_model({"model": OmegaConf.to_container(OmegaConf.load(TINY)), "seed": 0}, torch.device("cpu"))
    vocab = model.cfg.vocab_size
    batch = packed_batch([torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(0))])

    def step() -> float:
        t0 = time.perf_counter()
        model(**batch).backward()
        return t0

    step()  # the first step pays one-off costs; the second is a typical one
    warm = time.perf_counter()
    step()
    warm = time.perf_counter() - warm
    _barrier(store, "start", world)
    if mode == "staggered" and rank == 1:
        time.sleep(warm / 2)
    out = []
    for k in range(steps):
        if mode == "aligned":
            _barrier(store, f"step{k}", world)
        kernel = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        t0 = step()
        out.append((t0, time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_stime - kernel,
                    allowed))
    return out


def measure(tokens: int, steps: int, mode: str, pin: bool = False) -> pd.DataFrame:
    """One run of one mode: a row per rank and step."""
    per_rank = run_ranks(rank_main, 2, tokens, steps, mode, pin, timeout_s=TIMEOUT_S)
    return pd.DataFrame([dict(mode=mode, rank=r, step=k, start=t0, seconds=s, kernel_seconds=ks, cpus=cpus)
                         for r, rows in enumerate(per_rank) for k, (t0, s, ks, cpus) in enumerate(rows)])


def run(tokens: int, steps: int, pairs: int, pin: bool = False) -> pd.DataFrame:
    frames = []
    for p in range(pairs):
        for mode in (MODES if p % 2 == 0 else MODES[::-1]):
            frames.append(measure(tokens, steps, mode, pin).assign(pair=p, tokens=tokens))
    return pd.concat(frames, ignore_index=True)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per pair: each mode's median step time, aligned / staggered, and the time in the kernel."""
    med = table.groupby(["pair", "mode"])["seconds"].median().unstack("mode")
    out = med.assign(ratio=med["aligned"] / med["staggered"])
    if "kernel_seconds" in table:
        sums = table.groupby("pair")[["kernel_seconds", "seconds"]].sum()
        out["kernel_share"] = sums["kernel_seconds"] / sums["seconds"]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m odc_bench.bench_lockstep", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096, help="tokens in the sample (default 4096)")
    p.add_argument("--steps", type=int, default=8, help="forward+backward steps per run (default 8)")
    p.add_argument("--pairs", type=int, default=3, help="aligned/staggered pairs (default 3)")
    p.add_argument("--pin", action="store_true", help="pin each rank to its own CPU")
    p.add_argument("--out", type=Path, help="also write every step's time here (CSV)")
    a = p.parse_args(argv)
    for name in ("tokens", "steps", "pairs"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(a, name)}")
    table = run(a.tokens, a.steps, a.pairs, a.pin)
    s = summary(table)
    print(s.round(3).to_string())
    print(f"median aligned / staggered: {s['ratio'].median():.3f}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(a.out, table.to_csv(index=False))


if __name__ == "__main__":
    main()
