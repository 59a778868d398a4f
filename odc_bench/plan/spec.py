"""Turn a typed RunConfig into a RunSpec: the samples, plan and predicted time of every minibatch.

Everything about a run's input that can be wrong and is not already a config type error is
found here, before any rank starts, and reported as a ConfigError: one line saying what is
wrong and what to do. Every rank gets the same precomputed plans, so no rank communicates to
learn its work.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from odc_bench.balancers.cost import CostModel, calibration_path, cost_model_for, device_tag
from odc_bench.balancers.plan import Microbatch, Plan
from odc_bench.balancers.quality import (
    Prediction,
    StaleClock,
    bubble_rate,
    least_work,
    microbatch_costs,
    predict,
    rank_work,
    run_bubble_rate,
    stale_bubble_rate,
    stale_lower_bound,
    stale_window,
)
from odc_bench.balancers.registry import balancer_options, balancer_spec
from odc_bench.config.backend import GpuHardwareConfig, SimBackendConfig, fit_file
from odc_bench.config.compose import COMPOSE_ERRORS, compose_run, hydra_error_line
from odc_bench.config.fields import require
from odc_bench.config.model import ModelConfig
from odc_bench.config.run import RunConfig
from odc_bench.data.batches import labelled_tokens
from odc_bench.data.ids import DataTokens, resolve_tokens
from odc_bench.data.lengths import dataset_lengths, microbatch_limit, minibatch_samples, require_room
from odc_bench.errors import CombinationError, ConfigError
from odc_bench.models.memory import MemoryEstimate, estimate
from odc_bench.plan.device import (
    cpu_compile_problem,
    gpus_without_peer_access,
    hardware_tag,
    memory_limit,
    ranks_per_gpu,
    run_device,
    visible_gpus,
)
from odc_bench.plan.identity import REAL_LOADERS, config_key, drawn_digest
from odc_bench.plan.plans import Plans, no_cycle_collection
from odc_bench.sums import left_sum
from odc_core.engine.registry import shard_group_size

GB = 2**30
# What a unit takes at the least in the simulator (its costs and positions, by microbatch shape;
# tests/unit/test_sim_memory.py checks that none takes less): a model of more layers than this
# host holds is refused before the simulator lists them until the kernel kills the process.
SIMULATED_UNIT_BYTES = 128


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
        work = left_sum(least_work(lens, self.max_tokens, self.cost_model) for lens in lengths)
        bound = stale_lower_bound(lengths, self.world_size, self.max_tokens, self.cost_model, staleness)
        return max(0.0, bubble_rate(work, self.world_size, bound))  # a bound with no bubble: 0, not -1e-16

    def predicted_time(self) -> float:
        """The cost model's time for the measured minibatches, in its units: what a predicted
        speedup between two runs of the same samples is the ratio of."""
        staleness = self.config.engine.staleness
        if staleness == 0:
            return left_sum(mb.prediction.time for mb in self.measured)
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
        return rank_memory(self.config, self.device_type, tokens, tokens)

    def check_devices(self) -> None:
        """ConfigError, for ranks of this host on CUDA, where more ranks than GPUs must share one
        (worker.py deals them round robin) and the engine takes a GPU per rank (NCCL, NVSHMEM),
        or where the ranks' GPUs must reach each other's memory and two of them cannot: either
        would fail only once every rank had started."""
        if self.device_type != "cuda" or self.config.simulated:
            return
        options = self.config.engine.options
        world, gpus = self.config.world_size, visible_gpus()
        why = options.gpu_per_rank(world)
        if world > gpus and why is not None:
            raise ConfigError(f"{why}, which takes a GPU per rank: world_size={world} on this host's {gpus} GPU(s); "
                              f"use a world_size of at most {gpus}, or engine=odc with engine.transport=cuda_ipc and "
                              "engine.shard=full, whose ranks may share a GPU")
        needs = options.peer_access()
        unreachable = gpus_without_peer_access(min(world, gpus)) if needs is not None and min(world, gpus) > 1 else []
        if unreachable:
            i, j = unreachable[0]
            raise ConfigError(f"{needs}, and GPU {i} has no peer access to GPU {j} (see nvidia-smi topo -p2p rw); "
                              "make CUDA_VISIBLE_DEVICES name GPUs that have it, or one GPU for the ranks to share")

    def cpus_shared(self) -> str | None:
        """For ranks of this host on CPU with more threads than the CPUs this process may use
        (more ranks than CPUs, or threads_per_rank times the ranks), a note: the run is right, but
        a rank that waits for a core waits in the middle of its step too (a transport's lock
        held by a rank taken off its core), so its times measure the host's scheduling as much
        as the engines. A note, not a refusal: a correctness run or a test of many ranks is
        what such a command often is."""
        if self.config.simulated or self.device_type != "cpu":
            return None
        from odc_bench.forked import usable_cpus  # joblib: slow to import, only for real runs

        world, threads, cpus = self.config.world_size, self.config.threads_per_rank, usable_cpus()
        if world * (threads or 1) <= cpus:
            return None
        what = f"{world} ranks" if not threads or threads == 1 else f"{world} ranks of {threads} threads each"
        fix = (f"a world_size of at most {cpus}" if world > cpus else
               f"threads_per_rank={max(1, cpus // world)} or null (the CPUs split among the ranks)")
        return (f"world_size={world} runs {what} on the {cpus} CPUs this command may use: they take turns on "
                f"the cores, so the times measure the host's scheduling as much as the engines; use {fix} "
                f"for times to compare, or backend=sim")

    def check_compile(self) -> None:
        """ConfigError, for a real run on CPU with compile=true, where torch.compile cannot build or
        load its code (plan/device.py cpu_compile_problem): there every compiled part fell back to
        eager after tens of thousands of lines of compiler output, in a run recorded as compiled."""
        if self.config.simulated or self.device_type != "cpu" or not self.config.compiles("cpu"):
            return
        problem = cpu_compile_problem()
        if problem is not None:
            why, fix = problem
            raise ConfigError(f"compile=true on CPU, but {why}; set compile=false, or {fix}")

    def check_fits(self) -> None:
        """ConfigError when the memory estimate is over the limit (fit_problem), for ranks of this
        host (a SLURM job's nodes are not this host; a simulated run is answered anyway, its row
        flagging that it would not fit: mem_estimate_mb over mem_limit_mb, and the run saying so)."""
        if self.config.simulated:
            return
        problem = self.fit_problem()
        if problem is not None:
            raise ConfigError(problem)

    def fit_problem(self) -> str | None:
        """Where the memory estimate is over the device's memory, one line saying so, with the fix
        that can work: a lower microbatch limit, shorter samples, or a smaller model or more ranks;
        else None. On CUDA, ranks that share a GPU share its memory."""
        if self.memory_limit is None:
            return None
        limit, shared = self.memory_limit, ""
        if self.device_type == "cuda" and not self.config.simulated:
            sharing = ranks_per_gpu(self.config.world_size, visible_gpus())
            if sharing > 1:
                limit //= sharing
                shared = f" ({sharing} ranks share each GPU's {self.memory_limit / GB:.1f} GiB)"
        m = self.memory
        if m.total <= limit:
            return None
        need = (f"a rank would need about {m.total / GB:.1f} GiB (owned shards {m.owned / GB:.1f}, working units "
                f"{m.working / GB:.1f}, activations of {self.max_tokens} tokens {m.activations / GB:.1f}), over the "
                f"{limit / GB:.1f} GiB it has{shared}")
        longest = max(self.length_stats()["len_max"], 2)
        fitting = self.longest_fitting(limit)
        if fitting < 2:
            return f"{need}; the model alone does not fit: use a smaller model or add ranks"
        if fitting >= longest:
            return f"{need}; lower max_tokens (to {fitting} or less: the longest sample has {longest}), or add ranks"
        return (f"{need}; a sample of {longest} tokens cannot fit, samples up to about {fitting} tokens do: drop or "
                f"truncate the longer ones (or lower dataset.length_scale), or use a smaller model or more ranks")

    def longest_fitting(self, limit: int) -> int:
        """The largest microbatch limit whose estimate is within `limit` bytes (below 2: none)."""
        low, high = 1, max(self.max_tokens, 2)
        if self.memory_at(high).total <= limit:
            return high
        while high - low > 1:  # the estimate grows with the tokens
            mid = (low + high) // 2
            low, high = (mid, high) if self.memory_at(mid).total <= limit else (low, mid)
        return low


def plan_digest(spec: RunSpec) -> str:
    """A short hash of every minibatch's samples and plan: equal digests, equal plans."""
    h = hashlib.sha256()
    for mb in spec.minibatches:
        h.update(json.dumps([mb.sample_ids, mb.plan, mb.queue]).encode())
    return h.hexdigest()[:16]


def check_combination(config: RunConfig) -> None:
    """CombinationError when the engine, its options, the balancer and the backend cannot run together;
    nothing for task=primitives, which trains nothing (it was refused for a balancer it never plans with)."""
    if config.task != "train":
        return
    engine, balancer = config.engine.spec, balancer_spec(config.balancer.name)
    if engine.equal_microbatch_counts and not balancer.equal_counts:
        raise CombinationError(f"balancer {balancer.name} gives ranks different microbatch counts, which "
                               f"engine={engine.name} cannot run (every layer is a barrier); use engine=odc",
                               ("engine", "balancer"))
    if config.simulated and engine.simulated_as is None:
        raise CombinationError(f"the simulator does not model engine={engine.name}; use backend=local",
                               ("engine", "backend"))
    if config.simulated:
        options, defaults = config.engine.options, type(config.engine.options)()
        for key in engine.unsimulated:
            value, default = getattr(options, key), getattr(defaults, key)
            if value != default:
                raise CombinationError(f"engine.{key}={_setting(value)} sets how a real run's engine runs, which the "
                                       f"simulator does not model (its engine={engine.name} runs as with "
                                       f"engine.{key}={_setting(default)}); leave engine.{key} unset with backend=sim",
                                       (f"engine.{key}", "backend"))
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


def _setting(value: object) -> str:
    """A value as the command line writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


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


def rank_memory(config: RunConfig, device_type: str, tokens: int, longest: int) -> MemoryEstimate:
    """What a rank needs (models/memory.py) with a microbatch limit of `tokens`; on CPU ranks,
    whose attention holds the scores of a whole document, with `longest` its longest sample."""
    recompute = config.backend.recomputed.layers
    on_cpu = not config.simulated and device_type == "cpu"
    return estimate(config.model, config.world_size, config.precision, tokens, recompute,
                    cpu_longest=longest if on_cpu else None, shard_over=shard_group(config),
                    version_slots=config.engine.staleness + 1,
                    compute_shard_copy=config.engine.spec.runtime.compute_shard_copy)


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


def _fitted(config: RunConfig, cost: CostModel) -> dict[str, object]:
    """What a run takes from fitted files, which its key hashes (plan/identity.py): the calibrated
    cost model's coefficients, which its plans follow, and a simulated run's hardware fit, by a
    digest of what the file holds, not how it is laid out (it is not read until the run starts:
    an absent or damaged one is keyed as such, and the run then fails naming it)."""
    fitted: dict[str, object] = {}
    if config.balancer.cost_model == "calibrated":
        fitted["cost_model"] = [cost.a, cost.b, cost.c, cost.unit]
    backend = config.backend
    path = fit_file(backend.hardware, config.model.name) if isinstance(backend, SimBackendConfig) else None
    if path is not None:
        try:
            text = json.dumps(json.loads(path.read_text(encoding="utf-8-sig")), sort_keys=True)
            fitted["hardware"] = hashlib.sha256(text.encode()).hexdigest()[:16]
        except (OSError, ValueError):
            fitted["hardware"] = None
    return fitted


def _drawn(config: RunConfig, minibatches: list[Minibatch]) -> str | None:
    """The digest of what a run draws from a real source, which its key hashes (plan/identity.py);
    None for lengths the config itself determines (a profile, GRPO's draws). The ids count where
    the ranks train on them: a simulation's time depends on the lengths alone."""
    if config.dataset.loader not in REAL_LOADERS:
        return None
    ids_of = DataTokens(config.dataset).sample if config.dataset.tokens == "data" and not config.simulated else None
    return drawn_digest([(mb.sample_ids, mb.lengths) for mb in minibatches], ids_of)


class Planner:
    """Resolves runs (RunConfig -> RunSpec) for the runs of one command, keeping what it planned
    (plan/plans.py: each minibatch planned once) and the run just resolved (same config, same
    files read), which it returns again: the command line's precheck resolves the run, then hands
    its planner to the Hydra job (app.Job), which resolves it again. A pickled planner (a SLURM
    job's) starts empty.
    """

    def __init__(self) -> None:
        self.plans = Plans()
        self._last: tuple[str, RunSpec] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.plans, self._last = Plans(), None

    def resolve(self, config: RunConfig, lengths: np.ndarray | None = None, remote_cuda: bool = False) -> RunSpec:
        """Plan every minibatch of the run; ConfigError (one line) for input that cannot run.

        `remote_cuda`: the ranks will run on CUDA devices of other hosts (a SLURM job asking for
        GPUs, submitted from a login node): the run is resolved for CUDA without this machine's,
        its device memory left unbounded here (the job's node checks it). `lengths` replaces the
        dataset's pool (studies that vary the length distribution itself, studies/sensitivity.py);
        such a spec is never returned again, and its key still names the dataset, so it is not
        recorded."""
        device_type, remote = run_device(config, remote_cuda)
        if lengths is not None:
            return _resolve(config, device_type, self, lengths, remote)
        key = _plan_key(config, device_type, remote)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        spec = _resolve(config, device_type, self, remote=remote)
        self._last = (key, spec)
        return spec


def resolve(config: RunConfig, lengths: np.ndarray | None = None, remote_cuda: bool = False) -> RunSpec:
    """Planner.resolve with a planner of its own: nothing shared with other runs."""
    return Planner().resolve(config, lengths, remote_cuda)


def host_model(model: str, ranks: int) -> ModelConfig:
    """The model `model` (a model config's name, or a Hugging Face folder) for `ranks` CPU ranks of
    this host, as a tool that builds it outside a run takes it: ConfigError, one line, for a name
    no config has or a model the run's memory estimate says does not fit them (check_fits), where
    the ranks started anyway and each failed in a traceback, or in the host's memory."""
    try:
        config = compose_run([f"model={model}", f"world_size={ranks}", "device=cpu"])
    except COMPOSE_ERRORS as e:
        raise ConfigError(hydra_error_line(e)) from None
    spec = resolve(config)
    spec.check_fits()
    return spec.config.model


def _resolve(config: RunConfig, device_type: str, planner: Planner, lengths: np.ndarray | None = None,
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
    if config.simulated:
        require_room(sum(config.model.unit_counts.values()), SIMULATED_UNIT_BYTES,
                     f"simulating model.num_layers={config.model.num_layers} layers", "lower model.num_layers")
    drawn = minibatch_samples(config.dataset, len(lengths), world * per_rank, config.num_minibatches, config.seed)
    max_tokens = microbatch_limit(config.dataset, lengths, config.max_tokens, config.packing_ratio)

    resolved = replace(config, max_tokens=max_tokens, engine=engine, dataset=dataset)
    semantics = "collective" if engine.spec.equal_microbatch_counts else "odc"
    clock = StaleClock(world, engine.staleness)  # when each rank is free for the next minibatch
    minibatches = []
    with no_cycle_collection():
        every = [lengths[ids].tolist() for ids in drawn]
        # Those before the first with a sample over max_tokens, which is refused below, are planned.
        checked = next((k for k, lens in enumerate(every) if max(lens) > max_tokens), len(every))
        planned = (None if balancer.carry is not None else
                   planner.plans.plan_all(balancer, options, every[:checked], world, max_tokens, cost))
        for k, (ids, lens) in enumerate(zip(drawn, every, strict=True)):
            longest = max(lens)
            require(longest <= max_tokens,
                    f"minibatch {k} has a sample of {longest} tokens, over the microbatch limit "
                    f"max_tokens={max_tokens}; raise max_tokens (or packing_ratio) or lower dataset.length_scale")
            try:
                if planned is None:
                    plan, queue = planner.plans.plan(balancer, options, lens, world, max_tokens, cost, clock.ready())
                elif isinstance(result := planned[k], ValueError):
                    raise result
                else:
                    plan, queue = result
            except ValueError as e:
                raise ConfigError(f"balancer {balancer.name} cannot plan minibatch {k}: {e}") from None
            if engine.spec.equal_microbatch_counts:
                counts = {len(r) for r in plan}
                require(len(counts) == 1,
                        f"balancer {balancer.name} gave ranks different microbatch counts {sorted(counts)} in "
                        f"minibatch {k}; engine={engine.name} needs equal counts, use engine=odc")
            costs = microbatch_costs(plan, lens, cost)  # once, for the clock and the prediction
            clock.advance([left_sum(r) for r in costs])  # rank_work
            prediction = predict(plan, lens, world, max_tokens, cost, semantics, costs)
            minibatches.append(Minibatch(ids, lens, plan, prediction, queue))
    longest = max((max(mb.lengths) for mb in minibatches), default=0)
    return RunSpec(resolved, config_key(resolved, _drawn(resolved, minibatches), _fitted(resolved, cost)), device_type,
                   cost, options,
                   rank_memory(resolved, device_type, max_tokens, longest),
                   None if remote else memory_limit(config, device_type), minibatches, len(lengths))
