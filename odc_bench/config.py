"""Turn a composed Hydra config into a checked, fully resolved run specification.

Everything that can be wrong with a run's input is found here, before any rank starts, and
reported as a ConfigError: one line saying what is wrong and what to do. The app turns it
into exit status 2 with no results written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from odc_bench.balancers import BALANCERS, UNEQUAL_COUNTS, Plan, make_plan
from odc_bench.data.profiles import PROFILES, profile_lengths, profile_max_len
from odc_bench.models.qwen2 import Qwen2Config, labelled_tokens
from odc_bench.results import run_key
from odc_core.engine import ENGINES

PRECISIONS = ("fp32", "bf16")
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

    @property
    def labelled_tokens(self) -> int:
        return labelled_tokens(self.lengths)


@dataclass
class RunSpec:
    config: dict[str, Any]
    run_id: str
    max_tokens: int
    minibatches: list[Minibatch] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return int(self.config["world_size"])


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _int(cfg: DictConfig, key: str, minimum: int) -> int:
    value = OmegaConf.select(cfg, key)
    _require(isinstance(value, int) and not isinstance(value, bool),
             f"{key} must be an integer, got {value!r}")
    _require(value >= minimum, f"{key} must be at least {minimum}, got {value}; set {key}={minimum} or more")
    return value


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
    ds = cfg.dataset
    _require(ds.profile in PROFILES,
             f"unknown dataset profile {ds.profile!r}; choose one of {', '.join(sorted(PROFILES))}")
    _require(isinstance(ds.length_scale, int | float) and ds.length_scale > 0,
             f"dataset.length_scale must be a positive number, got {ds.length_scale!r}")
    return profile_lengths(ds.profile, float(ds.length_scale), int(cfg.seed), ds.get("num_samples"))


def resolve(cfg: DictConfig) -> RunSpec:
    world = _int(cfg, "world_size", 1)
    per_rank = _int(cfg, "minibatch_size", 1)
    num_mb = _int(cfg, "num_minibatches", 1)
    warmup = _int(cfg, "warmup_minibatches", 0)
    _int(cfg, "seed", 0)
    _require(warmup < num_mb, f"warmup_minibatches ({warmup}) must be below num_minibatches ({num_mb})")
    _require(cfg.precision in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}, got {cfg.precision!r}")
    _require(cfg.backend.name in BACKENDS,
             f"unknown backend {cfg.backend.name!r}; choose one of {', '.join(BACKENDS)}")
    engines = SIM_ENGINES if cfg.backend.name == "sim" else ENGINES
    _require(cfg.engine.name in engines, f"unknown engine {cfg.engine.name!r}; choose one of {', '.join(engines)}")
    _require(cfg.balancer.name in BALANCERS,
             f"unknown balancer {cfg.balancer.name!r}; choose one of {', '.join(sorted(BALANCERS))}")
    _require(not (cfg.engine.name == "collective" and cfg.balancer.name in UNEQUAL_COUNTS),
             f"balancer {cfg.balancer.name} gives ranks different microbatch counts, which collective FSDP "
             f"cannot run (every layer is a barrier); use engine=odc")
    threads = cfg.get("threads_per_rank")
    _require(threads is None or (isinstance(threads, int) and threads >= 1),
             f"threads_per_rank must be null or a positive integer, got {threads!r}")
    model_config(cfg)

    lengths = dataset_lengths(cfg)
    packing = cfg.packing_ratio
    _require(isinstance(packing, int | float) and packing >= 1,
             f"packing_ratio must be a number >= 1, got {packing!r}")
    max_tokens = cfg.max_tokens
    if max_tokens is None:
        max_tokens = int(profile_max_len(cfg.dataset.profile, float(cfg.dataset.length_scale)) * packing)
    _require(isinstance(max_tokens, int) and max_tokens >= 2,
             f"max_tokens must be null or an integer >= 2, got {max_tokens!r}")

    config = OmegaConf.to_container(cfg, resolve=True)
    config["max_tokens"] = max_tokens
    spec = RunSpec(config=config, run_id=run_key(config), max_tokens=max_tokens)

    global_size = world * per_rank
    order = np.random.default_rng(int(cfg.seed) + 1).permutation(len(lengths))
    for k in range(num_mb):
        ids = [int(order[(k * global_size + j) % len(order)]) for j in range(global_size)]
        lens = [int(lengths[i]) for i in ids]
        longest = max(lens)
        _require(longest <= max_tokens,
                 f"minibatch {k} has a sample of {longest} tokens, over the microbatch limit max_tokens={max_tokens}; "
                 f"raise max_tokens (or packing_ratio) or lower dataset.length_scale")
        plan = make_plan(cfg.balancer.name, lens, world, max_tokens, seed=int(cfg.seed) + k,
                         **(config["balancer"].get("options") or {}))
        if cfg.engine.name == "collective":
            counts = {len(r) for r in plan}
            _require(len(counts) == 1,
                     f"balancer {cfg.balancer.name} gave ranks different microbatch counts {sorted(counts)} "
                     f"in minibatch {k}; collective FSDP needs equal counts, use engine=odc")
        spec.minibatches.append(Minibatch(ids, lens, plan))
    return spec


def threads_per_rank(config: dict, world_size: int) -> int:
    return config.get("threads_per_rank") or max(1, (os.cpu_count() or 1) // world_size)
