"""The whole run's config: every section typed, checked once, then read as attributes downstream."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf, open_dict

from odc_bench.config.backend import (
    BackendConfig,
    Checkpointing,
    LocalBackendConfig,
    SimBackendConfig,
    hardware_config,
)
from odc_bench.config.balancer import BalancerConfig
from odc_bench.config.dataset import DatasetConfig
from odc_bench.config.engine import EngineConfig, engine_config
from odc_bench.config.fields import as_dict, build, require, section
from odc_bench.config.model import ModelConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig:
    """AdamW on the owned shards."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        # AdamW's own ranges, checked before any rank starts: the ranks' AdamW refused them, and
        # the run was a failed row (a simulated one ran on them).
        require(self.lr >= 0, f"optim.lr must be >= 0 (AdamW's learning rate), got {self.lr:g}")
        require(self.eps >= 0, f"optim.eps must be >= 0, got {self.eps:g}")
        require(all(0 <= b < 1 for b in self.betas), f"optim.betas must each lie in [0, 1), got {list(self.betas)}")
        require(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay:g}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    """Sharded checkpoints of a real run (docs/checkpoints.md); not part of the run's key."""

    # Save after every `every` minibatches (0: never); the last minibatch is never saved.
    every: int = 0
    # auto: a run whose checkpoint folder holds a complete checkpoint continues from the newest.
    resume: Literal["auto", "never"] = "auto"
    # Where runs keep their checkpoints, one folder per run key; null: <results_dir>/checkpoints.
    dir: str | None = None
    # How many of a run's newest checkpoints stay while it runs (older ones go once a newer one is complete).
    keep: int = 2

    def __post_init__(self) -> None:
        if self.dir is not None:
            object.__setattr__(self, "dir", os.path.expanduser(self.dir))  # as results_dir's (RunConfig)
        require(self.every >= 0, f"checkpoint.every must be an integer >= 0 (0: no checkpoints), got {self.every}")
        require(self.keep >= 1, f"checkpoint.keep must be an integer >= 1 (the newest checkpoints a run keeps), "
                                f"got {self.keep}")


@dataclass(frozen=True, kw_only=True, slots=True)
class PrimitivesConfig:
    """task=primitives: the communication microbenchmark (conf/task/primitives.yaml)."""

    min_bytes: int = 4096
    max_bytes: int = 256 << 20
    step: int = 4
    dtype: Literal["fp32", "bf16"] = "fp32"
    rounds: int = 9
    turn_s: float = 0.05
    warmup_calls: int = 3
    chunk_bytes: int = 1 << 20
    # The one-sided ops' heap: shm, or mpi (ranks under mpiexec, MPI off shared memory: the
    # network path ranks on different hosts take), or cuda_ipc (GPU memory; ranks share the GPUs
    # there are).
    transport: Literal["shm", "mpi", "cuda_ipc"] = "shm"

    def __post_init__(self) -> None:
        require(1 <= self.min_bytes <= self.max_bytes,
                f"primitives.min_bytes ({self.min_bytes}) must be at least 1 and at most primitives.max_bytes "
                f"({self.max_bytes})")
        require(self.step >= 2, f"primitives.step must be at least 2, got {self.step}")
        for key in ("rounds", "warmup_calls", "chunk_bytes"):
            require(getattr(self, key) >= 1, f"primitives.{key} must be at least 1, got {getattr(self, key)}")
        require(self.turn_s > 0, f"primitives.turn_s must be a positive number of seconds, got {self.turn_s}")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    world_size: int
    minibatch_size: int  # samples per rank per minibatch (the paper's convention)
    num_minibatches: int
    warmup_minibatches: int  # excluded from every metric
    max_tokens: int | None  # microbatch token limit; None = the dataset's longest sample x packing_ratio
    packing_ratio: float
    seed: int
    precision: Literal["fp32", "bf16"]
    device: Literal["auto", "cpu", "cuda"]
    threads_per_rank: int | None
    timeout_s: float
    deadline_s: float | None
    results_dir: str
    optim: OptimConfig
    model: ModelConfig
    dataset: DatasetConfig
    engine: EngineConfig
    balancer: BalancerConfig
    backend: BackendConfig
    task: Literal["train", "primitives"] = "train"
    primitives: PrimitivesConfig | None = None
    # How many ok runs of this config the results table should hold (a measurement's repeats);
    # not part of the run's key: raising it runs the config again.
    repeat: int = 1
    checkpoint: CheckpointConfig = CheckpointConfig()
    # A warm-up minibatch to run under torch.profiler (run/profile.py); null: none. Not part of
    # the run's key: it changes no metric.
    profile_minibatch: int | None = None
    # torch.compile of the decoder's dense parts (models/decoder.py compile_dense); null: on CUDA,
    # where the decoder is launch-bound without it, unless op-level checkpointing runs the layers
    # (compiles()), and not on CPU, whose numbers predate it.
    compile: bool | None = None

    def __post_init__(self) -> None:
        # The shell expands ~ in `results_dir=~/x` but not once it is quoted ('results_dir="~/x"',
        # as Hydra asks of a value with a space), which made a folder named ~ in the working folder.
        object.__setattr__(self, "results_dir", os.path.expanduser(self.results_dir))
        for key, least in (("world_size", 1), ("minibatch_size", 1), ("num_minibatches", 1),
                           ("warmup_minibatches", 0), ("seed", 0), ("repeat", 1)):
            value = getattr(self, key)
            require(value >= least, f"{key} must be at least {least}, got {value}; set {key}={least} or more")
        # int64 everywhere a seed goes: torch's generators, numpy's, the results table's column.
        require(self.seed < 2**63, f"seed must be below 2**63, got {self.seed}; choose a smaller seed")
        require(self.warmup_minibatches < self.num_minibatches,
                f"warmup_minibatches ({self.warmup_minibatches}) must be below num_minibatches "
                f"({self.num_minibatches})")
        require(self.timeout_s > 0, f"timeout_s must be a positive number of seconds, got {self.timeout_s}")
        # torch's TCPStore, which every local, SLURM and MPI run's ranks meet through, fails on
        # longer ones (an OverflowError, or its socket timing out at once).
        require(self.timeout_s < 2**31, f"timeout_s must be below 2**31 seconds (about 68 years), got "
                                        f"{self.timeout_s}; a rank that stops answering is named after it")
        require(self.deadline_s is None or self.deadline_s > 0,
                f"deadline_s must be a positive number of seconds or null, got {self.deadline_s}")
        require(self.threads_per_rank is None or self.threads_per_rank >= 1,
                f"threads_per_rank must be null or a positive integer, got {self.threads_per_rank}")
        require(self.packing_ratio >= 1, f"packing_ratio must be a number >= 1, got {self.packing_ratio}")
        require(self.max_tokens is None or self.max_tokens >= 2,
                f"max_tokens must be null or an integer >= 2, got {self.max_tokens}")
        k = self.profile_minibatch
        require(k is None or 0 <= k < self.warmup_minibatches,
                f"profile_minibatch must be a warm-up minibatch, 0 to warmup_minibatches - 1 "
                f"({self.warmup_minibatches - 1}), or null, got {k}: the profiler's cost stays out of the metrics; "
                f"raise warmup_minibatches to profile a later one")
        require(k is None or not self.simulated,
                "profile_minibatch profiles a real run; backend=sim has no device to profile: drop it")
        require(not self.checkpoint.every or not self.simulated,
                f"checkpoint.every={self.checkpoint.every} saves a real run's engine state; backend=sim has none to "
                f"save (and a real run's checkpoints are not part of its metrics): drop it")
        require(not (self.compile and self._op_checkpointing),
                "compile=true and backend.recompute_mode=op do not run together: torch.compile's kernels write "
                "into tensors that op-level checkpointing keeps for backward, which torch refuses; set "
                "compile=false (compile=null leaves op-level checkpointed layers uncompiled) or "
                "backend.recompute_mode=full or blocks")

    @property
    def simulated(self) -> bool:
        return self.backend.name == "sim"

    @property
    def _op_checkpointing(self) -> bool:
        return not self.simulated and self.backend.recompute and self.backend.recompute_mode == "op"

    def compiles(self, device_type: str) -> bool:
        """Whether a run on `device_type` compiles the decoder's dense parts: by default on CUDA,
        unless op-level checkpointing (eager: see the check above) runs the layers."""
        if self.compile is None:
            return device_type == "cuda" and not self._op_checkpointing
        return self.compile

    def to_dict(self) -> dict[str, Any]:
        """Plain values laid out as in the YAML: the record of a run (its key and its row's config)."""
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "engine":
                out[name] = value.to_dict()
            elif name in ("primitives", "compile") and value is None:
                continue  # unset: a train run has no primitives; configs from before compile keep their keys
            elif isinstance(value, ModelConfig) and value.head_dim is None:
                # Models whose heads divide their width, as every model before head_dim, keep their keys.
                out[name] = {k: v for k, v in as_dict(value).items() if k != "head_dim"}
            elif isinstance(value, LocalBackendConfig) and not value.recompute:
                # Real runs from before activation checkpointing keep their keys.
                unset = {f.name for f in dataclasses.fields(Checkpointing)}
                out[name] = {k: v for k, v in as_dict(value).items() if k not in unset}
            elif hasattr(value, "__dataclass_fields__"):
                out[name] = as_dict(value)
            else:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out


def _backend(values: Mapping[str, Any]) -> BackendConfig:
    name = section(values, "backend").get("name")
    require(name in ("local", "sim"), f"unknown backend {name!r}; choose local or sim")
    if name == "local":
        return build(LocalBackendConfig, values, "backend.")
    hardware = values.get("hardware")
    return build(SimBackendConfig, {**values, "hardware": hardware_config({} if hardware is None else hardware)},
                 "backend.")


def run_config(values: Mapping[str, Any]) -> RunConfig:
    """The typed config of a composed run (plain values, the `hydra` section left out)."""
    given = {key: values.get(key) for key in ("engine", "backend")}
    sections = {"engine": engine_config({} if given["engine"] is None else given["engine"]),
                "backend": _backend({} if given["backend"] is None else given["backend"])}
    return build(RunConfig, {**values, **sections}, "")


def load(cfg: DictConfig | Mapping[str, Any]) -> RunConfig:
    """run_config of a Hydra config (its `hydra` section, if any, is not the run's)."""
    values: dict[str, Any]
    if isinstance(cfg, DictConfig):
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.pop("hydra", None)  # it holds interpolations only a running Hydra job resolves
        container: Any = OmegaConf.to_container(cfg, resolve=True)
        values = {str(k): v for k, v in container.items()}
        # Hydra puts a file of DIR/sweep/ under `sweep` unless its first line says otherwise.
        require("sweep" not in values, "a sweep file's settings came under a key `sweep`: a sweep of your config "
                                       "folder (DIR/sweep/NAME.yaml) sets keys of the whole config "
                                       "(hydra.sweeper.params, ...), so its first line must be `# @package _global_`; "
                                       "add it")
    else:
        values = {str(k): v for k, v in cfg.items() if k != "hydra"}
    return run_config(values)
