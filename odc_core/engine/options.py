"""Every engine's options: frozen dataclasses whose fields are the engine's config keys (engine.*).

They live apart from the engines so that checking a config, reading a results table or drawing
a figure never imports torch; each engine's module builds the engine from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from odc_core.transport.registry import TRANSPORTS, transport_for


class EngineOptions(Protocol):
    """An engine's options: a frozen dataclass whose fields are its config keys (engine.*)."""

    def for_device(self, device_type: str) -> EngineOptions:
        """The options as they run on `device_type` (what `auto` values become); ValueError,
        one line, when the device cannot run them."""
        ...

    def host_bound(self) -> tuple[str, str] | None:
        """What keeps the ranks on one host with these options, and the fix; None when nothing does."""
        ...


# `auto` is shm on CPU, nccl on CUDA.
Backend = Literal["auto", "shm", "gloo", "nccl"]


@dataclass(frozen=True, kw_only=True)
class CollectiveOptions:
    """engine.* for engine=collective (conf/engine/collective.yaml)."""

    reshard_after_forward: bool = True
    # The process group FSDP2's all-gathers and reduce-scatters run on.
    backend: Backend = "auto"

    def for_device(self, device_type: str) -> CollectiveOptions:
        """The options as they run on `device_type`: `auto` replaced by the group it picks, so a
        row names the baseline that ran; ValueError (one line) for a group the device cannot use."""
        if self.backend == "auto":
            return CollectiveOptions(reshard_after_forward=self.reshard_after_forward,
                                     backend="nccl" if device_type == "cuda" else "shm")
        if (self.backend == "nccl") != (device_type == "cuda"):
            fit = "nccl" if device_type == "cuda" else "shm or gloo"
            raise ValueError(f"engine.backend={self.backend} cannot run on {device_type} tensors; use {fit} or auto")
        return self

    def host_bound(self) -> tuple[str, str] | None:
        """What keeps the ranks on one host, and the fix, when something does."""
        if self.backend == "shm":
            return ("engine.backend=shm (the CPU default) runs FSDP2 over shared memory",
                    "set engine.backend=gloo or hydra.launcher.nodes=1")
        return None


@dataclass(frozen=True, kw_only=True)
class OdcOptions:
    """engine.* for engine=odc (conf/engine/odc.yaml)."""

    # Gather the next unit in a background thread while this one computes.
    prefetch: bool = True
    # The symmetric heap's transport (odc_core/transport/registry.py); auto picks one for the device.
    transport: str = "auto"

    def __post_init__(self) -> None:
        if self.transport != "auto" and self.transport not in TRANSPORTS:
            raise ValueError(f"engine.transport must be auto or one of {', '.join(TRANSPORTS)}, "
                             f"got {self.transport!r}")

    def for_device(self, device_type: str) -> OdcOptions:
        """The options as they run on `device_type`: `auto` replaced by the transport it picks."""
        try:
            name = transport_for(self.transport, device_type).name
        except ValueError as e:
            raise ValueError(f"engine=odc: {e}") from None
        return OdcOptions(prefetch=self.prefetch, transport=name)

    def host_bound(self) -> tuple[str, str] | None:
        spec = TRANSPORTS.get(self.transport)
        if spec is not None and not spec.spans_hosts:
            return (f"engine=odc on transport {spec.name} keeps its symmetric heap in {spec.describe}",
                    "set hydra.launcher.nodes=1")
        return None
