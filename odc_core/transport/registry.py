"""The transports, one record each: which symmetric heap an engine gets, and where it can run.

Adding a transport is its module (a SymmetricHeap class built as cls(rank, world_size,
job_id, store, timeout_s), collectively over the ranks) and one entry below. A record names
its class rather than importing it, so config checks never import torch or MPI.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

    from odc_core.transport.base import SymmetricHeap


@dataclass(frozen=True)
class TransportSpec:
    name: str
    heap: str  # "module:class" of its SymmetricHeap
    devices: tuple[str, ...]  # device types whose tensors the heap holds
    spans_hosts: bool  # whether ranks on different hosts can share one heap
    describe: str  # what it is, in the words errors and docs use
    # What to run across hosts instead, where this transport cannot (the engine.* settings).
    across_hosts: str = ""
    # The dtypes its accumulate can add into (a gradient accumulator's: MixedPrecision.reduce_dtype).
    reduce_dtypes: tuple[str, ...] = ("float32",)


TRANSPORTS: dict[str, TransportSpec] = {
    "shm": TransportSpec("shm", "odc_core.transport.shm:ShmHeap", devices=("cpu",), spans_hosts=False,
                         describe="POSIX shared memory (/dev/shm) on one host", across_hosts="engine.transport=mpi",
                         reduce_dtypes=("float32", "bfloat16", "float16")),
    # Ranks must be started by an MPI process manager (mpiexec, srun --mpi=pmi2): odc_bench's launchers do.
    # MPI_Accumulate has no bf16 or fp16 type; the CUDA heaps' atomic-add kernel adds into fp32.
    "mpi": TransportSpec("mpi", "odc_core.transport.mpi:MpiHeap", devices=("cpu",), spans_hosts=True,
                         describe="MPI-3 one-sided windows (MPICH), on one host or many"),
    # Ranks on one host, sharing GPUs or one each (peer access over NVLink or PCIe).
    "cuda_ipc": TransportSpec("cuda_ipc", "odc_core.transport.cuda_ipc:CudaIpcHeap", devices=("cuda",),
                              spans_hosts=False, describe="GPU memory shared through CUDA IPC handles on one host",
                              across_hosts="engine.transport=nvshmem engine.shard=hybrid"),
    # One GPU per rank, every peer mapped by NVSHMEM (one node or one multi-node NVLink domain).
    "nvshmem": TransportSpec("nvshmem", "odc_core.transport.nvshmem:NvshmemHeap", devices=("cuda",),
                             spans_hosts=True, describe="NVSHMEM symmetric GPU memory, one GPU per rank, over NVLink"),
}
# `auto`: the first transport, in this order, that holds the run's device type. Not mpi: it
# needs its ranks started under mpiexec, so a run spanning hosts names it (engine.transport=mpi).
# Not nvshmem: it needs a GPU per rank, where cuda_ipc runs whether ranks share GPUs or not.
AUTO_ORDER = ("shm", "cuda_ipc")


def transport_for(name: str, device_type: str) -> TransportSpec:
    """The transport `name` (or `auto`'s choice) for `device_type`; ValueError (one line) when none fits."""
    if name == "auto":
        for candidate in AUTO_ORDER:
            if device_type in TRANSPORTS[candidate].devices:
                return TRANSPORTS[candidate]
        raise ValueError(f"no symmetric-heap transport for {device_type} devices yet; "
                         f"the transports are {', '.join(TRANSPORTS)}")
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; choose auto or one of {', '.join(TRANSPORTS)}")
    spec = TRANSPORTS[name]
    if device_type not in spec.devices:
        raise ValueError(f"transport {name} holds {', '.join(spec.devices)} tensors, not {device_type}; "
                         f"choose auto or another transport")
    return spec


def make_heap(name: str, device_type: str, rank: int, world_size: int, job_id: str, store: dist.Store,
              timeout_s: float) -> SymmetricHeap:
    """This rank's heap on transport `name` (or `auto`'s choice); collective over the ranks."""
    module, cls = transport_for(name, device_type).heap.split(":")
    heap: SymmetricHeap = getattr(importlib.import_module(module), cls)(rank, world_size, job_id, store, timeout_s)
    return heap
