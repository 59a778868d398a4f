"""Turn a composed Hydra config into a checked, fully resolved run specification.

Everything that can be wrong with a run's input is found here, before any rank starts, and
reported as a ConfigError: one line saying what is wrong and what to do. The app turns it
into exit status 2 with no results written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from odc_bench import cost_models
from odc_bench.balancers import BALANCERS, UNEQUAL_COUNTS, Microbatch, Plan, balancer_options, make_plan, make_queue
from odc_bench.balancers.quality import Prediction, predict, run_bubble_rate
from odc_bench.cost_models import CostModel
from odc_bench.data.profiles import PROFILES, profile_lengths, profile_max_len
from odc_bench.data.real import LOADERS, DataError, load_lengths
from odc_bench.models.qwen2 import Qwen2Config, labelled_tokens
from odc_bench.results import TableError, check_table, run_key
from odc_core.engine import COLLECTIVE_BACKENDS, ENGINES, LOCKSTEP_ENGINES, collective_backend

PRECISIONS = ("fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("local", "sim")
# Engines the simulator models; it runs them whether or not the real engine is installed.
SIM_ENGINES = ("collective", "odc")


class ConfigError(ValueError):
    """Bad input: the message is one line naming the problem and the fix."""


@dataclass
class Minibatch:
    sample_ids: list[int]
    lengths: list[int]
    plan: Plan
    # Run-time balancers (dynamic): the claim queue; the plan is then its predicted outcome.
    queue: list[Microbatch] | None = None
    # The cost model's prediction for this minibatch's plan, under the run engine's semantics.
    prediction: Prediction | None = None

    @property
    def labelled_tokens(self) -> int:
        return labelled_tokens(self.lengths)


@dataclass
class RunSpec:
    config: dict[str, Any]
    run_id: str
    max_tokens: int
    minibatches: list[Minibatch] = field(default_factory=list)
    cost_model: str = ""

    @property
    def world_size(self) -> int:
        return int(self.config["world_size"])

    def predicted_bubble_rate(self) -> float:
        """The cost model's bubble rate over the measured (post-warm-up) minibatches."""
        measured = self.minibatches[int(self.config["warmup_minibatches"]):]
        return run_bubble_rate([mb.prediction for mb in measured if mb.prediction], self.world_size)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _int(cfg: DictConfig, key: str, minimum: int) -> int:
    value = OmegaConf.select(cfg, key)
    _require(isinstance(value, int) and not isinstance(value, bool),
             f"{key} must be an integer, got {value!r}")
    _require(value >= minimum, f"{key} must be at least {minimum}, got {value}; set {key}={minimum} or more")
    return value


def _seconds(cfg: DictConfig, key: str, optional: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if optional and value is None:
        return
    _require(isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
             f"{key} must be a positive number of seconds{' or null' if optional else ''}, got {value!r}")


def model_config(cfg: DictConfig) -> Qwen2Config:
    m = cfg.model
    try:
        return Qwen2Config(vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                           intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                           num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                           rope_theta=m.rope_theta, rms_eps=m.rms_eps, tie_embeddings=m.tie_embeddings)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def dataset_lengths(cfg: DictConfig) -> np.ndarray:
    """The pool's sample lengths, scaled by dataset.length_scale: a profile's draw or real data."""
    ds = cfg.dataset
    _require(isinstance(ds.length_scale, int | float) and ds.length_scale > 0,
             f"dataset.length_scale must be a positive number, got {ds.length_scale!r}")
    num = ds.get("num_samples")
    _require(num is None or (isinstance(num, int) and num >= 1),
             f"dataset.num_samples must be null or a positive integer, got {num!r}")
    loader = ds.get("loader") or "profile"
    if loader == "profile":
        _require(ds.profile in PROFILES,
                 f"unknown dataset profile {ds.profile!r}; choose one of {', '.join(sorted(PROFILES))}")
        return profile_lengths(ds.profile, float(ds.length_scale), int(cfg.seed), num)
    _require(loader in LOADERS, f"unknown dataset.loader {loader!r}; choose profile or one of {', '.join(LOADERS)}")
    try:
        raw = load_lengths(loader, ds.get("path"), field=ds.get("field"), text_field=ds.get("text_field", "text"),
                           tokenizer=ds.get("tokenizer"), split=ds.get("split"), cache_dir=ds.get("cache_dir"))
    except DataError as e:
        raise ConfigError(str(e)) from None
    return np.maximum(2, np.rint(raw[:num] * float(ds.length_scale))).astype(np.int64)


def dataset_max_len(cfg: DictConfig, lengths: np.ndarray) -> int:
    """The longest sample the dataset can hold: the paper's default microbatch limit."""
    if (cfg.dataset.get("loader") or "profile") == "profile":
        return profile_max_len(cfg.dataset.profile, float(cfg.dataset.length_scale))
    return int(lengths.max())


def run_device_type(cfg: DictConfig) -> str:
    return "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"


def check_device(cfg: DictConfig) -> None:
    _require(cfg.device in DEVICES, f"device must be one of {', '.join(DEVICES)}, got {cfg.device!r}")
    _require(cfg.device != "cuda" or torch.cuda.is_available(), "device=cuda but no CUDA device is visible; "
             "use device=auto or device=cpu")


def calibration_file(cfg: DictConfig) -> Path:
    """Where the calibrated cost model of this run's model and hardware lives."""
    check_device(cfg)
    dev = run_device_type(cfg)
    name = torch.cuda.get_device_name(0) if dev == "cuda" else ""
    return cost_models.calibration_path(cfg.model.name, cost_models.device_tag(dev, name),
                                        cfg.balancer.get("calibration"))


def cost_model(cfg: DictConfig) -> CostModel:
    b = cfg.balancer
    name = b.get("cost_model") or "linear"
    _require(name in cost_models.COST_MODELS,
             f"unknown balancer.cost_model {name!r}; choose one of {', '.join(cost_models.COST_MODELS)}")
    if name == "linear":
        return cost_models.linear()
    if name == "quadratic":
        fit = b.get("quadratic_fit") or "1p5b"
        _require(fit in cost_models.QUADRATIC_FITS, f"unknown balancer.quadratic_fit {fit!r}; choose one of "
                 f"{', '.join(cost_models.QUADRATIC_FITS)}")
        return cost_models.quadratic(fit)
    if name == "flops":
        return cost_models.flops(model_config(cfg))
    path = calibration_file(cfg)
    try:
        return cost_models.load_calibration(path)
    except FileNotFoundError:
        raise ConfigError(f"no calibration at {path}; run `python -m odc_bench.calibrate model={cfg.model.name}` "
                          f"on this machine first, or choose another balancer.cost_model") from None
    except ValueError as e:
        raise ConfigError(f"{e}; re-run `python -m odc_bench.calibrate model={cfg.model.name}`") from None


def balancer_options_of(cfg: DictConfig) -> dict[str, Any]:
    """The balancer's options, checked against the ones it declares and their defaults' types."""
    name = cfg.balancer.name
    options = OmegaConf.to_container(cfg.balancer.get("options") or OmegaConf.create({}), resolve=True)
    known = balancer_options(name)
    for key, value in options.items():
        _require(key in known, f"balancer {name} has no option {key!r}; its options are: "
                 f"{', '.join(known) or 'none'}")
        if isinstance(known[key], bool):
            _require(isinstance(value, bool), f"balancer.options.{key} must be true or false, got {value!r}")
        elif isinstance(known[key], int):
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                     f"balancer.options.{key} must be a positive integer, got {value!r}")
        elif isinstance(known[key], float):
            _require(isinstance(value, int | float) and not isinstance(value, bool) and value >= 0,
                     f"balancer.options.{key} must be a number >= 0, got {value!r}")
    return options


def engine_options_of(cfg: DictConfig) -> None:
    """Every engine option but the collective engine's process group is a switch; a typo'd
    value would otherwise fail on every rank."""
    for key, value in cfg.engine.items():
        if key == "backend" and cfg.engine.name == "collective":
            _require(value in COLLECTIVE_BACKENDS,
                     f"engine.backend must be one of {', '.join(COLLECTIVE_BACKENDS)}, got {value!r}")
            if cfg.backend.name != "sim":  # the simulator's hardware profile models the transport
                try:
                    collective_backend(value, run_device_type(cfg))
                except ValueError as e:
                    raise ConfigError(str(e)) from None
        elif key != "name":
            _require(isinstance(value, bool), f"engine.{key} must be true or false, got {value!r}")


def check_results_dir(results_dir: Path) -> None:
    """Refuse a results folder that cannot take this run's row, before any rank starts.

    A table of another schema is refused rather than appended to: pandas would align the
    columns it can and leave the rest empty, and the figures would read garbage.
    """
    _require(not results_dir.exists() or results_dir.is_dir(), f"results_dir {results_dir} is not a directory; "
             f"set results_dir to a folder")
    existing = results_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    _require(existing.is_dir(), f"results_dir {results_dir} cannot be created: {existing} is not a directory; "
             f"set results_dir to a folder")
    _require(os.access(existing, os.W_OK | os.X_OK), f"results_dir {results_dir} is not writable ({existing}); "
             f"set results_dir to a folder you can write")
    traces = results_dir / "traces"
    _require(not traces.exists() or traces.is_dir(), f"{traces} is not a directory; move it away or set "
             f"results_dir to another folder")
    try:
        check_table(results_dir / "runs.csv")
    except TableError as e:
        raise ConfigError(str(e)) from None


def minibatch_samples(pool_size: int, global_size: int, num_minibatches: int, seed: int) -> list[list[int]]:
    """Sample ids of each minibatch: a seeded permutation of the pool, read in order, wrapping around."""
    order = np.random.default_rng(seed + 1).permutation(pool_size)
    return [[int(order[(k * global_size + j) % pool_size]) for j in range(global_size)]
            for k in range(num_minibatches)]


def resolve(cfg: DictConfig) -> RunSpec:
    world = _int(cfg, "world_size", 1)
    per_rank = _int(cfg, "minibatch_size", 1)
    num_mb = _int(cfg, "num_minibatches", 1)
    warmup = _int(cfg, "warmup_minibatches", 0)
    _int(cfg, "seed", 0)
    _require(warmup < num_mb, f"warmup_minibatches ({warmup}) must be below num_minibatches ({num_mb})")
    _seconds(cfg, "timeout_s")
    _seconds(cfg, "deadline_s", optional=True)
    _require(cfg.precision in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}, got {cfg.precision!r}")
    check_device(cfg)
    _require(cfg.backend.name in BACKENDS,
             f"unknown backend {cfg.backend.name!r}; choose one of {', '.join(BACKENDS)}")
    engines = SIM_ENGINES if cfg.backend.name == "sim" else ENGINES
    _require(cfg.engine.name in engines, f"unknown engine {cfg.engine.name!r}; choose one of {', '.join(engines)}")
    engine_options_of(cfg)
    _require(cfg.balancer.name in BALANCERS,
             f"unknown balancer {cfg.balancer.name!r}; choose one of {', '.join(sorted(BALANCERS))}")
    _require(not (cfg.engine.name in LOCKSTEP_ENGINES and cfg.balancer.name in UNEQUAL_COUNTS),
             f"balancer {cfg.balancer.name} gives ranks different microbatch counts, which engine="
             f"{cfg.engine.name} cannot run (every layer is a barrier); use engine=odc")
    threads = cfg.get("threads_per_rank")
    _require(not (cfg.engine.name != "collective" and cfg.backend.name == "local" and run_device_type(cfg) == "cuda"),
             f"engine={cfg.engine.name} has no CUDA transport yet (its symmetric heap is CPU shared memory); "
             "run it with device=cpu, or use engine=collective on GPUs")
    _require(threads is None or (isinstance(threads, int) and threads >= 1),
             f"threads_per_rank must be null or a positive integer, got {threads!r}")
    model_config(cfg)
    options = balancer_options_of(cfg)
    cost = cost_model(cfg)

    lengths = dataset_lengths(cfg)
    _require(len(lengths) >= world * per_rank,
             f"the dataset has {len(lengths)} usable samples, fewer than one minibatch of world_size x minibatch_size "
             f"= {world * per_rank}; lower minibatch_size or world_size, or use more data (dataset.num_samples)")
    packing = cfg.packing_ratio
    _require(isinstance(packing, int | float) and packing >= 1,
             f"packing_ratio must be a number >= 1, got {packing!r}")
    max_tokens = cfg.max_tokens
    if max_tokens is None:
        max_tokens = int(dataset_max_len(cfg, lengths) * packing)
    _require(isinstance(max_tokens, int) and max_tokens >= 2,
             f"max_tokens must be null or an integer >= 2, got {max_tokens!r}")

    config = OmegaConf.to_container(cfg, resolve=True)
    config["max_tokens"] = max_tokens
    if cfg.engine.name == "collective" and cfg.backend.name != "sim":
        # The group this run will use, not `auto`: the row says which baseline ran, and an
        # explicit `engine.backend=shm` on CPU is the same run (the same key) as the default.
        config["engine"]["backend"] = collective_backend(cfg.engine.get("backend", "auto"), run_device_type(cfg))
    spec = RunSpec(config=config, run_id=run_key(config), max_tokens=max_tokens, cost_model=cost.label)

    semantics = "collective" if cfg.engine.name in LOCKSTEP_ENGINES else "odc"
    for k, ids in enumerate(minibatch_samples(len(lengths), world * per_rank, num_mb, int(cfg.seed))):
        lens = [int(lengths[i]) for i in ids]
        longest = max(lens)
        _require(longest <= max_tokens,
                 f"minibatch {k} has a sample of {longest} tokens, over the microbatch limit max_tokens={max_tokens}; "
                 f"raise max_tokens (or packing_ratio) or lower dataset.length_scale")
        plan = make_plan(cfg.balancer.name, lens, world, max_tokens, cost, seed=int(cfg.seed) + k, **options)
        queue = make_queue(cfg.balancer.name, lens, world, max_tokens, cost, **options)
        if cfg.engine.name in LOCKSTEP_ENGINES:
            counts = {len(r) for r in plan}
            _require(len(counts) == 1,
                     f"balancer {cfg.balancer.name} gave ranks different microbatch counts {sorted(counts)} "
                     f"in minibatch {k}; engine={cfg.engine.name} needs equal counts, use engine=odc")
        spec.minibatches.append(Minibatch(ids, lens, plan, queue=queue,
                                          prediction=predict(plan, lens, world, max_tokens, cost, semantics)))
    return spec


def threads_per_rank(config: dict, world_size: int) -> int:
    return config.get("threads_per_rank") or max(1, (os.cpu_count() or 1) // world_size)
