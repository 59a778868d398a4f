"""Settings a run takes nothing from: a key that only another key's choice reads
(balancer.quadratic_fit under a cost model other than quadratic, the simulator's ODC model under
the collective engine), or one a simulation has no use for (optim.*; threads_per_rank, device
and compile on a GPU profile, which models neither the machine that runs the simulator nor the
decoder's compilation).

Such a setting changes nothing the run measures, so the run's key holds its default in its
place (plan/identity.py): a sweep that sets it beside the choice that ignores it
(`-m balancer.cost_model=linear,quadratic balancer.quadratic_fit=7b`) finds its linear run in the
table as the plain linear run, where before it was keyed apart and measured again. The command
says so in a note rather than refusing, since such a grid is how a sweep is written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from odc_bench.config.backend import Checkpointing, GpuHardwareConfig, SimBackendConfig
from odc_bench.config.balancer import BalancerConfig
from odc_bench.config.run import OptimConfig, RunConfig


@dataclass(frozen=True, slots=True)
class Unused:
    """`key` (dotted, as the command line gives it) set to `value`, which no part of the run
    reads: only `reader` does."""

    key: str
    value: object
    default: object
    reader: str

    def note(self) -> str:
        return (f"{self.key}={_said(self.value)} has no effect here: only {self.reader} reads it; the run is the one "
                f"without it ({self.key}={_said(self.default)})")


def _said(value: object) -> str:
    """A value as the command line writes it (true, null)."""
    if isinstance(value, tuple | list):
        return f"[{','.join(map(_said, value))}]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _default(cls: type, name: str) -> object:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def unused_settings(config: RunConfig) -> list[Unused]:
    """The settings of `config` that differ from their defaults where nothing reads them."""
    found = []

    def unless(read: bool, cls: type, section: str, name: str, value: object, reader: str) -> None:
        default = _default(cls, name)
        if not read and value != default:
            found.append(Unused(f"{section}.{name}" if section else name, value, default, reader))

    b = config.balancer
    unless(b.cost_model == "quadratic", BalancerConfig, "balancer", "quadratic_fit", b.quadratic_fit,
           "balancer.cost_model=quadratic")
    unless(b.cost_model == "calibrated", BalancerConfig, "balancer", "calibration", b.calibration,
           "balancer.cost_model=calibrated")
    backend = config.backend
    unless(backend.recompute, Checkpointing, "backend", "recompute_mode", backend.recompute_mode,
           "backend.recompute=true")
    unless(backend.recompute and backend.recompute_mode == "blocks", Checkpointing, "backend", "recompute_blocks",
           backend.recompute_blocks, "backend.recompute=true with backend.recompute_mode=blocks")
    if isinstance(backend, SimBackendConfig):
        for name in ("lr", "betas", "eps", "weight_decay"):
            unless(False, OptimConfig, "optim", name, getattr(config.optim, name),
                   "a real run (backend=local); the simulator trains no weights")
        if isinstance(backend.hardware, GpuHardwareConfig):
            # device has no dataclass default: config.yaml's "auto" (the test of these keys checks it).
            for name, value, default in (("threads_per_rank", config.threads_per_rank, None),
                                         ("device", config.device, "auto"), ("compile", config.compile, None)):
                if value != default:
                    found.append(Unused(name, value, default, "a real run, or a simulated one on the calibrated CPU "
                                        "profile (backend/hardware=cpu)"))
        odc = config.engine.spec.simulated_as == "odc"
        for name in ("odc_gather_bytes", "contention_passes", "odc_fetch", "odc_internode_slowdown"):
            unless(odc, SimBackendConfig, "backend", name, getattr(backend, name),
                   "the simulator's model of engine=odc")
    return found
