"""What executes the run: real local ranks, or the simulator with a hardware profile
(conf/backend/*.yaml, conf/backend/hardware/*.yaml)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from odc_bench.config.fields import build, require, section
from odc_bench.provenance import REPO_ROOT

# GPU profile numbers and the range each must lie in: (lower bound, upper bound, lower bound excluded).
_POSITIVE = (0.0, math.inf, True)
_SHARE = (0.0, 1.0, True)
_SECONDS = (0.0, math.inf, False)
_GPU_RANGES = {
    "peak_tflops": _POSITIVE, "matmul_efficiency": _SHARE, "attention_efficiency": _SHARE,
    "unit_overhead_s": _SECONDS, "hbm_gbps": _POSITIVE, "memory_efficiency": _SHARE,
    "optimizer_overhead_s": _SECONDS, "link_gbps": _POSITIVE, "link_efficiency": _SHARE, "nic_gbps": _POSITIVE,
    "nic_efficiency": _SHARE, "collective_latency_s": _SECONDS, "ring_step_s": _SECONDS,
    "p2p_latency_s": _SECONDS, "barrier_s": _SECONDS, "memory_gb": _POSITIVE,
    "attention_half_length": (0.0, math.inf, False),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuHardwareConfig:
    """A GPU simulated from its published figures (every number's source: docs/simulator.md)."""

    name: str
    kind: Literal["gpu"] = "gpu"
    peak_tflops: float
    matmul_efficiency: float
    attention_efficiency: float
    # Attention's efficiency rises with document length: at s tokens it is attention_efficiency x
    # s / (s + attention_half_length), the flash kernel's tiles filling up (measured on an H100:
    # docs/simulator.md, "Attention against document length"); 0: the same at every length.
    attention_half_length: float = 0.0
    unit_overhead_s: float
    hbm_gbps: float
    memory_efficiency: float
    optimizer_overhead_s: float
    gpus_per_node: int
    # NICs per node, each nic_gbps / nic_rails (a rail-optimised network: a GPU's traffic
    # across nodes leaves through its rail's NIC; 1: one NIC shared by the node's GPUs).
    nic_rails: int = 1
    link_gbps: float
    link_efficiency: float
    nic_gbps: float
    nic_efficiency: float
    collective_latency_s: float
    ring_step_s: float
    p2p_latency_s: float
    barrier_s: float
    memory_gb: float  # device memory (GB of 1e9 bytes): what a rank may use
    # A cost-model calibration of this GPU (`python -m odc_bench.calibrate.cost_model` run on it):
    # compute then comes from its measured microbatch times instead of FLOPs x efficiency.
    compute_calibration: str | None = None

    def compute_calibration_file(self) -> Path | None:
        """Where compute_calibration is: a relative path as the command line gives it (from the
        working folder, where calibrate.cost_model wrote it), else as a profile file in the
        repository names it."""
        if self.compute_calibration is None:
            return None
        path = Path(self.compute_calibration).expanduser()
        return path if path.is_absolute() or path.exists() else REPO_ROOT / path

    def __post_init__(self) -> None:
        for key, (low, high, strict) in _GPU_RANGES.items():
            value = getattr(self, key)
            inside = (value > low if strict else value >= low) and value <= high
            what = ("a share in (0, 1]" if (low, high) == (0.0, 1.0) else
                    "a positive number" if strict else
                    "a number of tokens >= 0" if key == "attention_half_length" else "a number of seconds >= 0")
            require(inside, f"backend.hardware.{key} must be {what}, got {value!r}")
        for key in ("gpus_per_node", "nic_rails"):
            require(getattr(self, key) >= 1, f"backend.hardware.{key} must be at least 1, got {getattr(self, key)}")
        require(self.gpus_per_node % self.nic_rails == 0,
                f"the hardware's NIC rails per node, backend.hardware.nic_rails ({self.nic_rails}), must divide "
                f"gpus_per_node ({self.gpus_per_node}): give gpus_per_node a multiple of {self.nic_rails}, or set "
                f"backend.hardware.nic_rails to a divisor of {self.gpus_per_node}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibratedHardwareConfig:
    """This machine's CPU ranks, fitted from real runs; {model} in `calibration` stands for the
    model's name."""

    name: str
    kind: Literal["calibrated"] = "calibrated"
    calibration: str

    def calibration_file(self, model_name: str) -> Path:
        """Where the calibration of `model_name` is: a relative path as the command line gives it
        (from the working folder, where `calibrate.cpu_profile --out` wrote it), else as the stock
        profile names it (from the repository root). Only `{model}` is replaced: a path may hold
        other braces."""
        path = Path(self.calibration.replace("{model}", model_name)).expanduser()
        return path if path.is_absolute() or path.exists() else REPO_ROOT / path


HardwareConfig = GpuHardwareConfig | CalibratedHardwareConfig


def fit_file(hw: HardwareConfig, model_name: str) -> Path | None:
    """The file a hardware profile takes fitted numbers from, None where it takes none."""
    if isinstance(hw, CalibratedHardwareConfig):
        return hw.calibration_file(model_name)
    return hw.compute_calibration_file()


def hardware_config(values: Mapping[str, Any]) -> HardwareConfig:
    kind = section(values, "backend.hardware").get("kind")
    require(kind in ("gpu", "calibrated"), f"backend.hardware.kind must be gpu or calibrated, got {kind!r}")
    if kind == "gpu":
        return build(GpuHardwareConfig, values, "backend.hardware.")
    return build(CalibratedHardwareConfig, values, "backend.hardware.")


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpointing:
    """Activation checkpointing, the same keys on both backends: real ranks recompute what the
    simulator charges for (models/checkpointing.py; docs/simulator.md, "Activation checkpointing")."""

    # Activation checkpointing: backward recomputes each layer's forward (the paper's setting).
    recompute: bool = False
    # What recompute=true recomputes: every layer's whole forward (full); torchtitan's op-level
    # selective checkpointing (op: every other matrix multiply, attention's output kept); or a
    # share of the layers, recompute_blocks (blocks).
    recompute_mode: Literal["full", "op", "blocks"] = "full"
    recompute_blocks: float = 0.5

    def __post_init__(self) -> None:
        require(0 < self.recompute_blocks <= 1,
                f"backend.recompute_blocks must be a share of the layers in (0, 1], got {self.recompute_blocks}")

    @property
    def recomputed(self) -> Recompute:
        if not self.recompute:
            return Recompute(0.0, 0.0, 0.0)
        if self.recompute_mode == "op":
            # Memory: the matrix multiplies' and attention's outputs it keeps are most of a
            # layer's activations, so it is estimated as keeping them all (an upper bound).
            return Recompute(0.5, 0.0, 0.0)
        share = 1.0 if self.recompute_mode == "full" else self.recompute_blocks
        return Recompute(share, share, share)


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalBackendConfig(Checkpointing):
    """Real ranks as processes of this host (or SLURM tasks, hydra/launcher=slurm)."""

    name: Literal["local"] = "local"


@dataclass(frozen=True, kw_only=True, slots=True)
class SimBackendConfig(Checkpointing):
    """The discrete-event simulator (docs/simulator.md)."""

    name: Literal["sim"] = "sim"
    hardware: HardwareConfig
    # Bytes per parameter an ODC gather moves (the reference gathers fp32 master weights).
    odc_gather_bytes: int = 4
    # Fixed-point passes of the ODC contention model.
    contention_passes: int = 3
    # False: the row only, no trace file (paper-scale sweeps hold millions of spans).
    write_trace: bool = True
    # Where an ODC gather takes a shard held by a rank of another node: from its owner, or
    # (topology-aware) from a rank of its own node that holds the whole unit at that moment,
    # when that is faster (docs/simulator.md, "Topology-aware fetch").
    odc_fetch: Literal["owner", "nearest"] = "owner"
    # ODC's point-to-point bandwidth across nodes as a fraction of the NICs': divided by this.
    # 1: as fast as the collectives'; the reference implementation's transport is 3-4x slower
    # than NCCL across nodes (the paper's Fig. 11; docs/simulator.md, "Paper scale").
    odc_internode_slowdown: float = 1.0

    def __post_init__(self) -> None:
        require(self.odc_gather_bytes in (1, 2, 4, 8),
                f"backend.odc_gather_bytes must be 1, 2, 4 or 8 bytes per parameter, got {self.odc_gather_bytes}")
        require(self.contention_passes >= 1,
                f"backend.contention_passes must be at least 1, got {self.contention_passes}")
        require(self.odc_internode_slowdown >= 1,
                f"backend.odc_internode_slowdown must be at least 1 (1: ODC's transfers as fast as the collectives'), "
                f"got {self.odc_internode_slowdown}")
        Checkpointing.__post_init__(self)


@dataclass(frozen=True)
class Recompute:
    """What activation checkpointing costs and saves: the shares of a layer's forward matrix
    multiplies and of its attention that its backward computes again (averaged over the layers),
    and the share of layers that keep only their input for backward."""

    matmul: float
    attention: float
    layers: float

    @property
    def any(self) -> bool:
        return self.matmul > 0 or self.attention > 0


BackendConfig = LocalBackendConfig | SimBackendConfig
