"""Turn a typed RunConfig into a RunSpec: the samples, plan and predicted time of every minibatch.

Everything about a run's input that can be wrong and is not already a config type error is
found here, before any rank starts, and reported as a ConfigError: one line saying what is
wrong and what to do. Every rank gets the same precomputed plans, so no rank communicates to
learn its work.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from odc_bench.balancers.cost import CostModel, cost_model_for, device_tag
from odc_bench.balancers.plan import Microbatch, Plan
from odc_bench.balancers.quality import (
    Prediction,
    StaleClock,
    predict,
    rank_work,
    run_bubble_rate,
    stale_bubble_rate,
    stale_window,
)
from odc_bench.balancers.registry import BalancerSpec, balancer_options, balancer_spec, plan_minibatch
from odc_bench.config.backend import GpuHardwareConfig, SimBackendConfig
from odc_bench.config.fields import require
from odc_bench.config.run import RunConfig
from odc_bench.data.batches import labelled_tokens
from odc_bench.data.lengths import dataset_lengths, dataset_max_len
from odc_bench.errors import ConfigError
from odc_bench.models.memory import MemoryEstimate, estimate
from odc_core.engine.registry import EngineSpec

GB = 2**30


@dataclass(frozen=True)
class Minibatch:
    sample_ids: list[int]
    lengths: list[int]
    plan: Plan
    # The cost model's prediction for this minibatch's plan, under the run engine's semantics.
    prediction: Prediction
    # Run-time balancers (dynamic): the claim queue; the plan is then its predicted outcome.
    queue: list[Microbatch] | None = None

    @property
    def labelled_tokens(self) -> int:
        return labelled_tokens(self.lengths)


@dataclass(frozen=True)
class RunSpec:
    config: RunConfig  # as it runs: engine options resolved for the device, max_tokens set
    run_id: str
    device_type: str  # cpu or cuda, chosen once here
    cost_model: CostModel
    balancer_options: Any  # the balancer's own options object (balancers/registry.py)
    memory: MemoryEstimate  # per rank (models/memory.py)
    # Bytes a rank may use: a simulated GPU's memory, a local CUDA device's, or this host's
    # available memory shared by the run's ranks; None where nothing bounds it (the CPU profile).
    memory_limit: int | None
    minibatches: list[Minibatch] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def max_tokens(self) -> int:
        assert self.config.max_tokens is not None
        return self.config.max_tokens

    @property
    def measured(self) -> list[Minibatch]:
        """The minibatches every metric counts (after the warm-up)."""
        return self.minibatches[self.config.warmup_minibatches:]

    def predicted_bubble_rate(self) -> float:
        """The cost model's bubble rate over the measured minibatches (stale-synchronous ODC:
        over the run's timeline, balancers/quality.py)."""
        staleness = self.config.engine.staleness
        if staleness == 0:
            return run_bubble_rate([mb.prediction for mb in self.measured], self.world_size)
        return stale_bubble_rate(self._rank_works(), staleness, self.config.warmup_minibatches)

    def predicted_time(self) -> float:
        """The cost model's time for the measured minibatches, in its units: what a predicted
        speedup between two runs of the same samples is the ratio of."""
        staleness = self.config.engine.staleness
        if staleness == 0:
            return sum(mb.prediction.time for mb in self.measured)
        return stale_window(self._rank_works(), staleness, self.config.warmup_minibatches)

    def _rank_works(self) -> list[list[float]]:
        return [rank_work(mb.plan, mb.lengths, self.cost_model) for mb in self.minibatches]

    def length_stats(self) -> dict[str, float]:
        """The sample lengths the run trains on (every minibatch, after dataset.length_scale)."""
        lengths = np.array([n for mb in self.minibatches for n in mb.lengths])
        p50, p99 = np.percentile(lengths, [50, 99])
        return dict(samples=int(lengths.size), len_mean=float(lengths.mean()), len_p50=float(p50),
                    len_p99=float(p99), len_max=int(lengths.max()))

    def check_fits(self) -> None:
        """ConfigError when the memory estimate is over the limit (a run of local ranks only: a
        SLURM job's nodes are not this host)."""
        if self.memory_limit is None or self.memory.total <= self.memory_limit:
            return
        m = self.memory
        raise ConfigError(
            f"a rank would need about {m.total / GB:.1f} GiB (owned shards {m.owned / GB:.1f}, working units "
            f"{m.working / GB:.1f}, activations of {self.max_tokens} tokens {m.activations / GB:.1f}), over the "
            f"{self.memory_limit / GB:.1f} GiB it has; lower max_tokens or the model's size, or add ranks")


def run_key(config: Mapping[str, Any]) -> str:
    """A stable hash of a run's config, minus where results go and how often to repeat it."""
    keyed = {k: v for k, v in config.items() if k not in {"results_dir", "hydra", "repeat"}}
    blob = json.dumps(keyed, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def device_type_of(config: RunConfig) -> str:
    """cpu or cuda, as device=auto|cpu|cuda and this machine decide; ConfigError for cuda without one."""
    require(config.device != "cuda" or torch.cuda.is_available(),
            "device=cuda but no CUDA device is visible; use device=auto or device=cpu")
    return "cuda" if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()) else "cpu"


def hardware_tag(device_type: str) -> str:
    """The name calibrations of this machine's device are filed under."""
    return device_tag(device_type, torch.cuda.get_device_name(0) if device_type == "cuda" else "")


def minibatch_samples(pool_size: int, global_size: int, num_minibatches: int, seed: int) -> list[list[int]]:
    """Sample ids of each minibatch: a seeded permutation of the pool, read in order, wrapping around."""
    order = np.random.default_rng(seed + 1).permutation(pool_size)
    return [[int(order[(k * global_size + j) % pool_size]) for j in range(global_size)]
            for k in range(num_minibatches)]


def _check_combination(engine: EngineSpec, balancer: BalancerSpec, config: RunConfig) -> None:
    require(not (engine.equal_microbatch_counts and not balancer.equal_counts),
            f"balancer {balancer.name} gives ranks different microbatch counts, which engine={engine.name} "
            f"cannot run (every layer is a barrier); use engine=odc")
    if config.simulated:
        require(engine.simulated_as is not None,
                f"the simulator does not model engine={engine.name}; use backend=local")
    require(balancer.queue is None or config.engine.staleness == 0,
            f"balancer {balancer.name} hands out work from one counter that every rank must be in the same "
            f"minibatch to share; engine.staleness={config.engine.staleness} lets them run apart: use "
            f"balancer=lb_carry (or engine.staleness=0)")


def resolve(config: RunConfig) -> RunSpec:
    """Plan every minibatch of the run; ConfigError (one line) for input that cannot run."""
    world, per_rank = config.world_size, config.minibatch_size
    device_type = "cpu" if config.simulated else device_type_of(config)
    engine = config.engine if config.simulated else config.engine.for_device(device_type)
    balancer = balancer_spec(config.balancer.name)
    _check_combination(engine.spec, balancer, config)
    options = balancer_options(balancer.name, config.balancer.options)
    cost = cost_model_for(config.balancer, config.model, hardware_tag(device_type))

    lengths = dataset_lengths(config.dataset, config.seed)
    require(len(lengths) >= world * per_rank,
            f"the dataset has {len(lengths)} usable samples, fewer than one minibatch of world_size x minibatch_size "
            f"= {world * per_rank}; lower minibatch_size or world_size, or use more data (dataset.num_samples)")
    max_tokens = config.max_tokens
    if max_tokens is None:
        max_tokens = int(dataset_max_len(config.dataset, lengths) * config.packing_ratio)
    require(max_tokens >= 2, f"max_tokens must be null or an integer >= 2, got {max_tokens}")

    resolved = replace(config, max_tokens=max_tokens, engine=engine)
    semantics = "collective" if engine.spec.equal_microbatch_counts else "odc"
    clock = StaleClock(world, engine.staleness)  # when each rank is free for the next minibatch
    minibatches = []
    for k, ids in enumerate(minibatch_samples(len(lengths), world * per_rank, config.num_minibatches, config.seed)):
        lens = [int(lengths[i]) for i in ids]
        longest = max(lens)
        require(longest <= max_tokens,
                f"minibatch {k} has a sample of {longest} tokens, over the microbatch limit max_tokens={max_tokens}; "
                f"raise max_tokens (or packing_ratio) or lower dataset.length_scale")
        try:
            plan, queue = plan_minibatch(balancer, options, lens, world, max_tokens, cost, clock.ready())
        except ValueError as e:
            raise ConfigError(f"balancer {balancer.name} cannot plan minibatch {k}: {e}") from None
        if engine.spec.equal_microbatch_counts:
            counts = {len(r) for r in plan}
            require(len(counts) == 1,
                    f"balancer {balancer.name} gave ranks different microbatch counts {sorted(counts)} in minibatch "
                    f"{k}; engine={engine.name} needs equal counts, use engine=odc")
        clock.advance(rank_work(plan, lens, cost))
        minibatches.append(Minibatch(ids, lens, plan, predict(plan, lens, world, max_tokens, cost, semantics), queue))
    recompute = isinstance(config.backend, SimBackendConfig) and config.backend.recompute
    on_cpu = not config.simulated and device_type == "cpu"
    longest = max((max(mb.lengths) for mb in minibatches), default=0)
    memory = estimate(config.model, world, config.precision, max_tokens, recompute,
                      cpu_longest=longest if on_cpu else None, version_slots=engine.staleness + 1)
    return RunSpec(resolved, run_key(resolved.to_dict()), device_type, cost, options, memory,
                   memory_limit(config, device_type), minibatches)


def memory_limit(config: RunConfig, device_type: str) -> int | None:
    """What bounds a rank's memory (see RunSpec.memory_limit)."""
    if isinstance(config.backend, SimBackendConfig):
        hw = config.backend.hardware
        return int(hw.memory_gb * 1e9) if isinstance(hw, GpuHardwareConfig) else None
    if device_type == "cuda":
        return int(torch.cuda.mem_get_info()[1])
    with open("/proc/meminfo") as f:
        available_kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    return available_kib * 1024 // config.world_size
