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
from odc_bench.balancers.quality import Prediction, predict, run_bubble_rate
from odc_bench.balancers.registry import BalancerSpec, balancer_options, balancer_spec, plan_minibatch
from odc_bench.config.fields import require
from odc_bench.config.run import RunConfig
from odc_bench.data.batches import labelled_tokens
from odc_bench.data.lengths import dataset_lengths, dataset_max_len
from odc_bench.errors import ConfigError
from odc_core.engine.registry import EngineSpec


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
        """The cost model's bubble rate over the measured minibatches."""
        return run_bubble_rate([mb.prediction for mb in self.measured], self.world_size)


def run_key(config: Mapping[str, Any]) -> str:
    """A stable hash of a run's config, minus where results go."""
    keyed = {k: v for k, v in config.items() if k not in {"results_dir", "hydra"}}
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
    minibatches = []
    for k, ids in enumerate(minibatch_samples(len(lengths), world * per_rank, config.num_minibatches, config.seed)):
        lens = [int(lengths[i]) for i in ids]
        longest = max(lens)
        require(longest <= max_tokens,
                f"minibatch {k} has a sample of {longest} tokens, over the microbatch limit max_tokens={max_tokens}; "
                f"raise max_tokens (or packing_ratio) or lower dataset.length_scale")
        try:
            plan, queue = plan_minibatch(balancer, options, lens, world, max_tokens, cost)
        except ValueError as e:
            raise ConfigError(f"balancer {balancer.name} cannot plan minibatch {k}: {e}") from None
        if engine.spec.equal_microbatch_counts:
            counts = {len(r) for r in plan}
            require(len(counts) == 1,
                    f"balancer {balancer.name} gave ranks different microbatch counts {sorted(counts)} in minibatch "
                    f"{k}; engine={engine.name} needs equal counts, use engine=odc")
        minibatches.append(Minibatch(ids, lens, plan, predict(plan, lens, world, max_tokens, cost, semantics), queue))
    return RunSpec(resolved, run_key(resolved.to_dict()), device_type, cost, options, minibatches)
