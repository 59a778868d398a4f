"""Turn a typed RunConfig into a RunSpec: the samples, plan and predicted time of every minibatch.

Everything about a run's input that can be wrong and is not already a config type error is
found here, before any rank starts, and reported as a ConfigError: one line saying what is
wrong and what to do. Every rank gets the same precomputed plans, so no rank communicates to
learn its work.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from odc_bench.balancers.cost import CostModel, calibration_path, cost_model_for, device_tag
from odc_bench.balancers.plan import Microbatch, Plan
from odc_bench.balancers.quality import (
    Prediction,
    StaleClock,
    bubble_rate,
    least_work,
    predict,
    rank_work,
    run_bubble_rate,
    stale_bubble_rate,
    stale_lower_bound,
    stale_window,
)
from odc_bench.balancers.registry import BalancerSpec, balancer_options, balancer_spec, plan_minibatch
from odc_bench.config.backend import GpuHardwareConfig, SimBackendConfig
from odc_bench.config.fields import require
from odc_bench.config.run import RunConfig
from odc_bench.data.batches import labelled_tokens
from odc_bench.data.ids import resolve_tokens
from odc_bench.data.lengths import dataset_lengths, dataset_max_len, minibatch_samples
from odc_bench.data.profiles import PROFILES
from odc_bench.errors import CombinationError, ConfigError
from odc_bench.models.memory import MemoryEstimate, estimate, host_available_bytes
from odc_core.engine.registry import shard_group_size

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
    pool_size: int = 0  # samples the run draws its minibatches from (the dataset's, after num_samples)

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

    def bound_bubble_rate(self) -> float:
        """The bubble no balancer can remove from the measured minibatches under the cost model:
        each one's lower bound run one after another, or with staleness the stale-synchronous bound
        over them (balancers/quality.py; its ramp counted from the first measured minibatch)."""
        staleness = self.config.engine.staleness
        if staleness == 0:
            return run_bubble_rate([mb.prediction for mb in self.measured], self.world_size, of_bound=True)
        lengths = [mb.lengths for mb in self.measured]
        work = sum(least_work(lens, self.max_tokens, self.cost_model) for lens in lengths)
        bound = stale_lower_bound(lengths, self.world_size, self.max_tokens, self.cost_model, staleness)
        return max(0.0, bubble_rate(work, self.world_size, bound))  # a bound with no bubble: 0, not -1e-16

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

    @property
    def fits(self) -> bool:
        """Whether the memory estimate is within the limit (or nothing bounds it)."""
        return self.memory_limit is None or self.memory.total <= self.memory_limit

    def memory_at(self, tokens: int) -> MemoryEstimate:
        """The per-rank estimate with a microbatch limit of `tokens` (samples no longer than that)."""
        c = self.config
        recompute = c.backend.recomputed.layers if isinstance(c.backend, SimBackendConfig) else 0.0
        on_cpu = not c.simulated and self.device_type == "cpu"
        return estimate(c.model, self.world_size, c.precision, tokens, recompute,
                        cpu_longest=tokens if on_cpu else None, shard_over=shard_group(c),
                        version_slots=c.engine.staleness + 1)

    def check_fits(self) -> None:
        """ConfigError when the memory estimate is over the limit, for ranks of this host (a
        SLURM job's nodes are not this host; a simulated run is answered anyway, its row
        flagging that it would not fit: mem_estimate_mb over mem_limit_mb), with the fix that
        can work: a lower microbatch limit, shorter samples, or a smaller model or more ranks."""
        if self.memory_limit is None or self.fits or self.config.simulated:
            return
        m, limit = self.memory, self.memory_limit
        need = (f"a rank would need about {m.total / GB:.1f} GiB (owned shards {m.owned / GB:.1f}, working units "
                f"{m.working / GB:.1f}, activations of {self.max_tokens} tokens {m.activations / GB:.1f}), over the "
                f"{limit / GB:.1f} GiB it has")
        longest = max(self.length_stats()["len_max"], 2)
        fitting = self.longest_fitting(limit)
        if fitting < 2:
            raise ConfigError(f"{need}; the model alone does not fit: use a smaller model or add ranks")
        if fitting >= longest:
            raise ConfigError(f"{need}; lower max_tokens (to {fitting} or less: the longest sample has {longest}), "
                              f"or add ranks")
        raise ConfigError(f"{need}; a sample of {longest} tokens cannot fit, samples up to about {fitting} tokens "
                          f"do: drop or truncate the longer ones (or lower dataset.length_scale), or use a smaller "
                          f"model or more ranks")

    def longest_fitting(self, limit: int) -> int:
        """The largest microbatch limit whose estimate is within `limit` bytes (below 2: none)."""
        low, high = 1, max(self.max_tokens, 2)
        if self.memory_at(high).total <= limit:
            return high
        while high - low > 1:  # the estimate grows with the tokens
            mid = (low + high) // 2
            low, high = (mid, high) if self.memory_at(mid).total <= limit else (low, mid)
        return low


# Keys added after results were recorded, left out of the key while they hold the value every
# earlier run had: those runs keep their keys, so a re-run sweep still finds them.
LATER_KEYS = {("model", "family"): "qwen2", ("backend", "recompute_mode"): "full",
              ("backend", "recompute_blocks"): 0.5, ("backend", "odc_internode_slowdown"): 1.0}


def run_key(config: Mapping[str, Any]) -> str:
    """A stable hash of a run's config, minus where results go, how often to repeat it and how
    it is checkpointed (none of which changes what it measures)."""
    keyed = {k: v for k, v in config.items() if k not in {"results_dir", "hydra", "repeat", "checkpoint"}}
    for (section, key), earlier in LATER_KEYS.items():
        part = keyed.get(section)
        if isinstance(part, Mapping) and part.get(key) == earlier:
            keyed[section] = {k: v for k, v in part.items() if k != key}
    blob = json.dumps(keyed, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def checkpoint_folder(config: RunConfig, run_id: str) -> Path:
    """Where a real run keeps its checkpoints: one folder per run key, so that only a re-run of
    the same config resumes from them."""
    return Path(config.checkpoint.dir or Path(config.results_dir) / "checkpoints") / run_id


def device_type_of(config: RunConfig) -> str:
    """cpu or cuda, as device=auto|cpu|cuda and this machine decide; ConfigError for cuda without one."""
    import torch  # here: a simulated run, or a CPU one, never needs it

    require(config.device != "cuda" or torch.cuda.is_available(),
            "device=cuda but no CUDA device is visible; use device=auto or device=cpu")
    return "cuda" if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()) else "cpu"


def cuda_available() -> bool:
    """Whether this machine sees a CUDA device (imports torch: only runs that may use one ask)."""
    import torch

    return torch.cuda.is_available()


def hardware_tag(device_type: str) -> str:
    """The name calibrations of this machine's device are filed under."""
    if device_type != "cuda":
        return device_tag(device_type)
    import torch

    return device_tag(device_type, torch.cuda.get_device_name(0))


def plan_digest(spec: RunSpec) -> str:
    """A short hash of every minibatch's samples and plan: equal digests, equal plans."""
    h = hashlib.sha256()
    for mb in spec.minibatches:
        h.update(json.dumps([mb.sample_ids, mb.plan, mb.queue]).encode())
    return h.hexdigest()[:16]


def check_combination(config: RunConfig) -> None:
    """CombinationError when the engine, its options, the balancer and the backend cannot run together."""
    engine, balancer = config.engine.spec, balancer_spec(config.balancer.name)
    if engine.equal_microbatch_counts and not balancer.equal_counts:
        raise CombinationError(f"balancer {balancer.name} gives ranks different microbatch counts, which "
                               f"engine={engine.name} cannot run (every layer is a barrier); use engine=odc",
                               ("engine", "balancer"))
    if config.simulated and engine.simulated_as is None:
        raise CombinationError(f"the simulator does not model engine={engine.name}; use backend=local",
                               ("engine", "backend"))
    per_node = config.engine.options.ranks_per_node
    if per_node is not None:
        if config.simulated:
            raise CombinationError(f"engine.ranks_per_node={per_node} emulates nodes for real runs; backend=sim takes "
                                   f"its nodes from the hardware profile (gpus_per_node): leave engine.ranks_per_node "
                                   f"unset", ("engine.ranks_per_node", "backend"))
        require(config.world_size % per_node == 0,
                f"engine.ranks_per_node={per_node} must divide world_size={config.world_size} (every node has as "
                f"many ranks); choose a divisor of {config.world_size}")
    if config.engine.options.shard == "hybrid":
        if config.engine.staleness:
            raise CombinationError(f"engine.shard=hybrid is synchronous only so far: its replicas reduce their "
                                   f"gradients at the minibatch barrier that "
                                   f"engine.staleness={config.engine.staleness} removes; set engine.staleness=0 or "
                                   f"engine.shard=full",
                                   ("engine.shard", "engine.staleness"))
        if config.simulated and not (isinstance(config.backend, SimBackendConfig)
                                     and isinstance(config.backend.hardware, GpuHardwareConfig)):
            raise CombinationError("engine.shard=hybrid needs nodes: a GPU hardware profile (backend/hardware=a100 "
                                   "or h100), not the calibrated CPU one (one host)",
                                   ("engine.shard", "backend/hardware"))
    if balancer.queue is not None and config.engine.staleness:
        raise CombinationError(f"balancer {balancer.name} hands out work from one counter that every rank must be in "
                               f"the same minibatch to share; engine.staleness={config.engine.staleness} lets them "
                               f"run apart: use balancer=lb_carry (or engine.staleness=0)",
                               ("balancer", "engine.staleness"))


# Plans are pure functions of these inputs, so a process that resolves several runs over the same
# minibatches (the series of a what-if or of a sweep, which differ only in the engine) plans each
# minibatch once. Plans are never modified after planning.
_PLANS: dict[tuple, tuple[Plan, list[Microbatch] | None]] = {}
_PLANS_KEPT = 4096


def _plan_once(balancer: BalancerSpec, options: Any, lengths: list[int], world: int, max_tokens: int,
               cost: CostModel, ready: Sequence[float] | None = None) -> tuple[Plan, list[Microbatch] | None]:
    try:
        key = (balancer.name, options, cost, world, max_tokens, tuple(lengths),
               None if ready is None else tuple(ready))
        hash(key)
    except TypeError:  # options holding a mutable value: plan without the memo
        return plan_minibatch(balancer, options, lengths, world, max_tokens, cost, ready)
    if key not in _PLANS:
        if len(_PLANS) >= _PLANS_KEPT:
            _PLANS.clear()
        _PLANS[key] = plan_minibatch(balancer, options, lengths, world, max_tokens, cost, ready)
    return _PLANS[key]


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def shard_group(config: RunConfig) -> int:
    """How many ranks share a unit's shards: all of them, or with hybrid sharding one node's
    (the simulated hardware's, or a real run's engine.ranks_per_node)."""
    backend, options = config.backend, config.engine.options
    if options.shard != "hybrid":
        return config.world_size
    if isinstance(backend, SimBackendConfig):
        if isinstance(backend.hardware, GpuHardwareConfig):
            return min(backend.hardware.gpus_per_node, config.world_size)
        return config.world_size
    return shard_group_size(options.shard, options.ranks_per_node, config.world_size)


# The last run planned, by its config and the files planning read: the command line's
# precheck plans the run, then the Hydra job plans the same run again in the same process.
_planned: tuple[str, RunSpec] | None = None


def _plan_key(config: RunConfig, device_type: str, remote: bool) -> str:
    """The config as a string, with the size and time of every file planning reads (real data,
    a cost-model calibration), so that a changed file plans again."""
    paths = [config.dataset.path]
    if config.balancer.cost_model == "calibrated":
        tag = device_tag("cuda") if remote else hardware_tag(device_type)
        paths.append(str(calibration_path(config.model.name, tag, config.balancer.calibration)))
    stamps = []
    for path in paths:
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        stamps.append(None if st is None else (path, st.st_mtime_ns, st.st_size))
    return json.dumps([config.to_dict(), device_type, stamps], sort_keys=True, default=str)


def resolve(config: RunConfig, reuse: bool = True, lengths: np.ndarray | None = None,
            remote_cuda: bool = False) -> RunSpec:
    """Plan every minibatch of the run; ConfigError (one line) for input that cannot run.

    `remote_cuda`: the ranks will run on CUDA devices of other hosts (a SLURM job asking for
    GPUs, submitted from a login node): the run is resolved for CUDA without this machine's,
    its device memory left unbounded here (the job's node checks it).

    Planning the run just planned (same config, same files) returns that plan, unless
    `reuse` is False: a job after the command line's precheck plans once. `lengths` replaces
    the dataset's pool (studies that vary the length distribution itself, tools/sensitivity.py);
    such a spec is never reused, and its key still names the dataset, so it is not recorded."""
    global _planned
    remote = remote_cuda and not config.simulated and config.device != "cpu" and not cuda_available()
    device_type = "cpu" if config.simulated else "cuda" if remote else device_type_of(config)
    if lengths is not None:
        return _resolve(config, device_type, lengths, remote)
    key = _plan_key(config, device_type, remote)
    if reuse and _planned is not None and _planned[0] == key:
        return _planned[1]
    spec = _resolve(config, device_type, remote=remote)
    _planned = (key, spec)
    return spec


def _resolve(config: RunConfig, device_type: str, lengths: np.ndarray | None = None,
             remote: bool = False) -> RunSpec:
    world, per_rank = config.world_size, config.minibatch_size
    engine = config.engine if config.simulated else config.engine.for_device(device_type)
    balancer = balancer_spec(config.balancer.name)
    check_combination(config)
    options = balancer_options(balancer.name, config.balancer.options)
    require(not (remote and config.balancer.cost_model == "calibrated"),
            "balancer.cost_model=calibrated reads the calibration of the job's GPU, which this machine cannot name "
            "(it sees no CUDA device); choose balancer.cost_model=flops or quadratic, or submit from a node that "
            "sees the GPUs")
    cost = cost_model_for(config.balancer, config.model, device_tag("cuda") if remote else hardware_tag(device_type))

    dataset = config.dataset
    if lengths is None:
        lengths = dataset_lengths(config.dataset, config.seed)
        # the simulator makes no tokens: only a run that trains needs ids its model can embed
        dataset = resolve_tokens(dataset, config.model.vocab_size, check_ids=not config.simulated)
    drawn = minibatch_samples(config.dataset, len(lengths), world * per_rank, config.num_minibatches, config.seed)
    max_tokens = config.max_tokens
    if max_tokens is None:
        max_tokens = int(dataset_max_len(config.dataset, lengths) * config.packing_ratio)
    require(max_tokens >= 2, f"max_tokens must be null or an integer >= 2, got {max_tokens}")

    resolved = replace(config, max_tokens=max_tokens, engine=engine, dataset=dataset)
    semantics = "collective" if engine.spec.equal_microbatch_counts else "odc"
    clock = StaleClock(world, engine.staleness)  # when each rank is free for the next minibatch
    minibatches = []
    # Plans are many small lists, none in a cycle: the cyclic collector would only scan them
    # again and again as they grow (a quarter of the planning time at 1,024 ranks).
    with _no_cycle_collection():
        for k, ids in enumerate(drawn):
            lens = lengths[ids].tolist()
            longest = max(lens)
            require(longest <= max_tokens,
                    f"minibatch {k} has a sample of {longest} tokens, over the microbatch limit "
                    f"max_tokens={max_tokens}; raise max_tokens (or packing_ratio) or lower dataset.length_scale")
            try:
                plan, queue = _plan_once(balancer, options, lens, world, max_tokens, cost, clock.ready())
            except ValueError as e:
                raise ConfigError(f"balancer {balancer.name} cannot plan minibatch {k}: {e}") from None
            if engine.spec.equal_microbatch_counts:
                counts = {len(r) for r in plan}
                require(len(counts) == 1,
                        f"balancer {balancer.name} gave ranks different microbatch counts {sorted(counts)} in "
                        f"minibatch {k}; engine={engine.name} needs equal counts, use engine=odc")
            clock.advance(rank_work(plan, lens, cost))
            minibatches.append(Minibatch(ids, lens, plan, predict(plan, lens, world, max_tokens, cost, semantics),
                                         queue))
    recompute = config.backend.recomputed.layers if isinstance(config.backend, SimBackendConfig) else 0.0
    on_cpu = not config.simulated and device_type == "cpu"
    longest = max((max(mb.lengths) for mb in minibatches), default=0)
    memory = estimate(config.model, world, config.precision, max_tokens, recompute,
                      cpu_longest=longest if on_cpu else None, shard_over=shard_group(config),
                      version_slots=engine.staleness + 1)
    return RunSpec(resolved, run_key(keyed_config(resolved)), device_type, cost, options, memory,
                   None if remote else memory_limit(config, device_type), minibatches, len(lengths))


def keyed_config(config: RunConfig) -> dict[str, Any]:
    """What a run's key hashes: its config and, for a length profile, the profile's definition,
    which lives in code (data/profiles.py): a profile refitted later (LongAlign's floor moved
    from 1K to 8K once) draws other lengths under the same config, so its runs get other keys
    and a re-run sweep does not take old rows for new ones."""
    keyed = config.to_dict()
    if config.dataset.loader == "profile" and config.dataset.profile in PROFILES:
        keyed["dataset"] = {**keyed["dataset"], "profile_definition": asdict(PROFILES[config.dataset.profile])}
    return keyed


def memory_limit(config: RunConfig, device_type: str) -> int | None:
    """What bounds a rank's memory (see RunSpec.memory_limit)."""
    if isinstance(config.backend, SimBackendConfig):
        hw = config.backend.hardware
        return int(hw.memory_gb * 1e9) if isinstance(hw, GpuHardwareConfig) else None
    if device_type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[1])
    return host_available_bytes() // config.world_size
