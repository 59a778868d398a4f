"""The engines, one record each: what the runtime needs to build one and run a plan on it.

Adding an engine is its module (with a `build(ctx, options)` function) and one entry below;
a harness that shows or simulates engines keeps what it needs of its own (odc_bench's is
odc_bench/config/engine.py). A record names its module rather than importing it, and options
classes are plain dataclasses: checking a config never imports torch.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields, replace
from typing import Literal, Protocol

from odc_core.transport.registry import TRANSPORTS, transport_for

# How a unit is sharded: over every rank (FSDP, ZeRO-3), or within a node and replicated
# across nodes (hybrid sharding, FSDP2's HSDP; the paper's section 6.1). The real engines take
# a node to be `ranks_per_node` consecutive ranks; the simulator takes it from its hardware.
Shard = Literal["full", "hybrid"]


def _check_types(options: object) -> None:
    """Each field of an options dataclass holds the type it declares: a library caller builds
    them by hand (the harness's config checks its own), and `prefetch="no"`, `staleness=1.5` or
    `shard="nope"` ran as if valid. ValueError, one line, naming the key."""
    hints = typing.get_type_hints(type(options))
    for f in fields(options):  # type: ignore[arg-type]
        value, kind = getattr(options, f.name), hints[f.name]
        if typing.get_origin(kind) is Literal:
            ok, want = value in typing.get_args(kind), f"one of {', '.join(typing.get_args(kind))}"
        elif kind is bool:
            ok, want = isinstance(value, bool), "true or false"
        elif kind is int:
            ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif kind is str:
            ok, want = isinstance(value, str), "a string"
        else:  # int | None (ranks_per_node): checked with its range
            continue
        if not ok:
            raise ValueError(f"engine.{f.name} must be {want}, got {value!r}")


def _check_ranks_per_node(value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"engine.ranks_per_node must be null or an integer >= 1, got {value!r}")


def shard_group_size(shard: Shard, ranks_per_node: int | None, world_size: int) -> int:
    """How many ranks share a unit's shards in a real run: all of them, or with hybrid
    sharding one node's (ranks_per_node; None: the whole run is one node)."""
    if shard == "hybrid" and ranks_per_node is not None:
        return ranks_per_node
    return world_size


class EngineOptions(Protocol):
    """An engine's options: a frozen dataclass whose fields are its config keys (engine.*)."""

    @property
    def shard(self) -> Shard:
        """How the engine lays out its shards (every engine has the key)."""
        ...

    @property
    def ranks_per_node(self) -> int | None:
        """Ranks of one node, consecutive (every engine has the key); None: all ranks are one node."""
        ...

    def for_device(self, device_type: str) -> EngineOptions:
        """The options as they run on `device_type` (what `auto` values become); ValueError,
        one line, when the device cannot run them."""
        ...

    def host_bound(self) -> tuple[str, str] | None:
        """What keeps the ranks on one host with these options, and the fix; None when nothing does."""
        ...

    def gpu_per_rank(self, world_size: int) -> str | None:
        """What takes a GPU of its own for every rank with these options (as they run on CUDA);
        None where ranks may share one."""
        ...

    def peer_access(self) -> str | None:
        """What needs each of the run's GPUs to reach the others' memory from its own kernels (as
        the options run on CUDA); None where nothing does."""
        ...


# `auto` is shm on CPU, nccl on CUDA.
Backend = Literal["auto", "shm", "gloo", "nccl"]


@dataclass(frozen=True, kw_only=True)
class CollectiveOptions:
    """engine.* for engine=collective (conf/engine/collective.yaml)."""

    reshard_after_forward: bool = True
    # The process group FSDP2's all-gathers and reduce-scatters run on.
    backend: Backend = "auto"
    shard: Shard = "full"
    # Where node boundaries are for hybrid sharding: nodes are this many consecutive ranks
    # (emulated on one host in local runs); None: every rank is on one node.
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        _check_types(self)
        _check_ranks_per_node(self.ranks_per_node)

    def for_device(self, device_type: str) -> CollectiveOptions:
        """The options as they run on `device_type`: `auto` replaced by the group it picks, so a
        row names the baseline that ran; ValueError (one line) for a group the device cannot use."""
        if self.backend == "auto":
            return replace(self, backend="nccl" if device_type == "cuda" else "shm")
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

    def gpu_per_rank(self, world_size: int) -> str | None:
        return "engine=collective runs FSDP2 over NCCL" if self.backend == "nccl" else None

    def peer_access(self) -> str | None:
        return None  # NCCL finds its own path between GPUs


@dataclass(frozen=True, kw_only=True)
class OdcOptions:
    """engine.* for engine=odc (conf/engine/odc.yaml)."""

    # Gather the next unit in a background thread while this one computes.
    prefetch: bool = True
    # The symmetric heap's transport (odc_core/transport/registry.py); auto picks one for the device.
    transport: str = "auto"
    shard: Shard = "full"
    # As CollectiveOptions.ranks_per_node.
    ranks_per_node: int | None = None
    # transport=mpi: keep MPI off shared memory between ranks of a host, so that one host
    # exercises the network path ranks on different hosts take.
    mpi_network_only: bool = False
    # Stale-synchronous ODC (docs/staleness.md): minibatch k computes on the parameters after
    # max(0, k - staleness) steps, so ranks run up to `staleness` minibatches apart; 0 is the
    # synchronous engine, one barrier per minibatch.
    staleness: int = 0

    def __post_init__(self) -> None:
        _check_types(self)
        if self.transport != "auto" and self.transport not in TRANSPORTS:
            raise ValueError(f"engine.transport must be auto or one of {', '.join(TRANSPORTS)}, "
                             f"got {self.transport!r}")
        if self.mpi_network_only and self.transport not in ("auto", "mpi"):
            raise ValueError(f"engine.mpi_network_only=true needs engine.transport=mpi, got {self.transport}")
        if self.staleness < 0:
            raise ValueError(f"engine.staleness must be an integer >= 0, got {self.staleness}")
        _check_ranks_per_node(self.ranks_per_node)

    def for_device(self, device_type: str) -> OdcOptions:
        """The options as they run on `device_type`: `auto` replaced by the transport it picks."""
        held = sorted(name for name, spec in TRANSPORTS.items() if device_type in spec.devices)
        if not held:
            kinds = sorted({kind.upper() for spec in TRANSPORTS.values() for kind in spec.devices})
            raise ValueError(
                f"engine=odc has no {device_type.upper()} transport yet: its symmetric-heap transports "
                f"({', '.join(TRANSPORTS)}) hold {' and '.join(kinds)} tensors only (docs/transport.md); on "
                f"{device_type.upper()} "
                f"devices measure the baseline with engine=collective, get ODC's prediction with backend=sim "
                f"(or python -m odc_bench.whatif), or run ODC on CPU ranks with device=cpu")
        try:
            name = transport_for(self.transport, device_type).name
        except ValueError as e:
            raise ValueError(f"engine=odc: {e}") from None
        if self.mpi_network_only and name != "mpi":
            raise ValueError(f"engine.mpi_network_only=true needs engine.transport=mpi, got {self.transport}")
        return replace(self, transport=name)

    def host_bound(self) -> tuple[str, str] | None:
        spec = TRANSPORTS.get(self.transport)
        if spec is not None and not spec.spans_hosts:
            return (f"engine=odc on transport {spec.name} keeps its symmetric heap in {spec.describe}",
                    f"set {spec.across_hosts} (docs/transport.md) or hydra.launcher.nodes=1")
        return None

    def gpu_per_rank(self, world_size: int) -> str | None:
        if self.transport == "nvshmem":
            return "engine.transport=nvshmem maps one process per GPU"
        if shard_group_size(self.shard, self.ranks_per_node, world_size) < world_size:
            return "hybrid sharding reduces its replicas over NCCL"
        return None

    def peer_access(self) -> str | None:
        # cuda_ipc's atomic adds run on the pushing rank's GPU, into the owner's (cuda_ipc.py).
        return "engine.transport=cuda_ipc adds into a peer GPU's memory from its own" \
            if self.transport == "cuda_ipc" else None



@dataclass(frozen=True)
class EngineSpec:
    """What the runtime needs to build an engine and to hand it a plan it can run."""

    name: str
    module: str  # the engine's module: build(ctx, options) -> DataParallelEngine
    # The engine's options with their defaults: the fields are its config keys.
    options: type[EngineOptions]
    # Every rank must run the same number of microbatches: the engine synchronises per unit.
    equal_microbatch_counts: bool
    # Whether the owned shards are also kept in the compute dtype when it is narrower than fp32
    # (the memory estimate counts it): ODC's peers gather from such a copy, while FSDP2 casts
    # its fp32 shard at each all-gather. An engine that does not say is counted with one.
    compute_shard_copy: bool = True


ENGINES: dict[str, EngineSpec] = {
    "collective": EngineSpec("collective", "odc_core.engine.fsdp2", CollectiveOptions, equal_microbatch_counts=True,
                             compute_shard_copy=False),
    "odc": EngineSpec("odc", "odc_core.engine.odc", OdcOptions, equal_microbatch_counts=False,
                      compute_shard_copy=True),
}


def engine_spec(name: str) -> EngineSpec:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
    return ENGINES[name]
