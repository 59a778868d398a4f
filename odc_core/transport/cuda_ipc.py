"""A symmetric heap in GPU memory for ranks on one host: CUDA IPC handles, one per buffer.

Each rank allocates its buffers on its own device; at allocation it publishes the buffer's IPC
handle (torch's CUDA reduction of the tensor, as torch.multiprocessing sends one) through the
run's store, and opens every peer's handle once. A peer's buffer is then a CUDA tensor in this
process, so a get is one device copy (peer to peer over NVLink when the owner is another GPU,
within the device when ranks share one), a whole gather one op where every shard is on this
rank's GPU (mapped.py), and an accumulate one kernel of atomic fp32 adds
(atomic_add.py says why atomics). All are enqueued on the caller's current stream: the ODC
engine issues its gathers and pushes on a side stream (odc_core/engine/odc/fetch.py).

Ranks may share one GPU (cudaIpcOpenMemHandle works between processes on the same device; the
only multi-rank case a one-GPU machine can run), or have one each. Then a peer's buffer is mapped
on the peer's GPU (torch opens a handle on the device the memory is on), which this rank's
copies reach by themselves (torch enables peer access for a copy between two GPUs) but its
atomic-add kernels, run on its own GPU, reach only once that GPU has peer access to the peer's:
alloc enables it for every peer GPU, or refuses GPUs that have none (enable_peer_access).

Flags and counters (int64 buffers) stay on the host, in a shared-memory heap (shm.py): the
engine polls them from Python, and a flag in device memory would cost a device copy per read.
Ordering between the two: store() and barrier() synchronise this rank's device before the
flag moves (a release: whatever any of its streams wrote is complete, so a peer that sees the
flag and then enqueues its reads finds it); quiet() synchronises the device.
"""

from __future__ import annotations

import base64
import functools
import json
import pickle
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from odc_core.transport.exchange import exchange
from odc_core.transport.mapped import Span, SpanOps
from odc_core.transport.shm import SHM_DIR, ShmHeap, job_tag, process_start_time


def export_handle(tensor: torch.Tensor) -> str:
    """A CUDA tensor as text another process on this host can open (its IPC handle)."""
    from torch.multiprocessing.reductions import reduce_tensor

    rebuild, args = reduce_tensor(tensor)
    return base64.b64encode(pickle.dumps((rebuild, args))).decode("ascii")


def open_handle(text: str) -> torch.Tensor:
    """The tensor export_handle() published, mapped into this process."""
    rebuild, args = pickle.loads(base64.b64decode(text))
    tensor: torch.Tensor = rebuild(*args)
    return tensor


@functools.cache
def enable_peer_access(device: torch.device, peer: torch.device) -> None:
    """Let kernels on GPU `device` read and write memory on GPU `peer` (once per pair and process);
    RuntimeError, in one line, where the two GPUs have no peer access."""
    if device == peer:
        return
    if not torch.cuda.can_device_access_peer(device, peer):
        raise RuntimeError(f"GPU {device.index} has no peer access to GPU {peer.index} (see nvidia-smi topo -p2p rw), "
                           "and transport cuda_ipc adds into a peer GPU's memory from its own: put these ranks on "
                           "GPUs with peer access, or let them share a GPU")
    # torch has no call that only enables peer access; a copy between two GPUs enables it for its
    # source's GPU to reach its destination's (at::cuda::get_p2p_access(src, dst)) and keeps it.
    torch.empty(1, device=peer).copy_(torch.empty(1, device=device))


def sweep_ipc_counters(processes: Iterable[tuple[str, int]], directory: Path = SHM_DIR) -> list[str]:
    """Remove the reference-count files torch's CUDA IPC left in `directory` for the given
    (host, pid) processes that are gone from this host; return their names.

    A process that shares a CUDA tensor creates /dev/shm/torch_<pid>_<n>_<k> (torch's
    CudaIPCTypes.cpp), a file in which every process that opened the tensor holds a count, and
    the last to let go unlinks it. A rank killed while it holds a peer's buffer, or while a peer
    holds its own, never gives its count back, so the file outlives the run. Only files of
    processes that no longer run are removed: a pid that names a running process (reused since)
    is left alone, as the files may be that process's."""
    host = socket.gethostname()
    removed = []
    for where, pid in processes:
        if where != host or process_start_time(pid) is not None:
            continue
        for path in directory.glob(f"torch_{pid}_*"):
            try:
                path.unlink()
            except (FileNotFoundError, PermissionError):
                continue  # swept by another, or not ours to remove
            removed.append(path.name)
    return removed


@dataclass
class _Buffer:
    name: str
    numel: int
    dtype: torch.dtype
    copies: list[torch.Tensor]  # by rank: this rank's own, and every peer's as mapped here


class CudaIpcHeap:
    """SymmetricHeap over CUDA IPC for `world_size` ranks of one host, on this process's current
    CUDA device. Collective to construct, like every alloc."""

    def __init__(self, rank: int, world_size: int, job_id: str, store: dist.Store, timeout_s: float = 120.0) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("transport cuda_ipc holds CUDA tensors and this process sees no CUDA device; "
                               "use engine.transport=auto (shm on CPU)")
        self.rank, self.world_size = rank, world_size
        self.timeout_s = float(timeout_s)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self._job = job_tag(job_id)
        self._store = store
        self._buffers: dict[str, _Buffer] = {}
        self._spans = SpanOps(self._copy, self.device)
        self._device_bytes = 0
        self._closed = False
        self._control = ShmHeap(rank, world_size, f"{job_id}.ipc", store, timeout_s)

    @property
    def heap_bytes(self) -> int:
        return self._device_bytes + self._control.heap_bytes

    def alloc(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        if self._closed:
            raise RuntimeError("alloc on a closed CudaIpcHeap")
        if dtype == torch.int64:  # flags and counters: on the host (module docstring)
            return self._control.alloc(name, numel, dtype)
        if name in self._buffers:
            raise ValueError(f"buffer {name!r} is already allocated")
        if numel < 1:
            raise ValueError(f"buffer {name!r} needs at least one element, got {numel}")
        own = torch.zeros(numel, dtype=dtype, device=self.device)
        torch.cuda.synchronize(self.device)  # zero-filled before any peer can read it
        spec = dict(name=name, numel=numel, dtype=str(dtype))
        key = f"odc/{self._job}/ipc/{len(self._buffers)}"
        copies: list[torch.Tensor | None] = [None] * self.world_size
        copies[self.rank] = own
        what = f"allocation of {name!r}"
        for peer, published in exchange(self._store, f"{key}/handle", self.rank, self.world_size,
                                        json.dumps(dict(spec, handle=export_handle(own))), what, self.timeout_s):
            theirs = json.loads(published)
            if {k: theirs[k] for k in spec} != spec:
                raise ValueError(f"asymmetric allocation of {name!r}: rank {self.rank} allocated {spec}, "
                                 f"rank {peer} allocated {({k: theirs[k] for k in spec})}; every rank must alloc "
                                 "the same buffers in order")
            mapped = copies[peer] = open_handle(theirs["handle"])
            enable_peer_access(self.device, mapped.device)
        # Every rank has opened every handle before any returns: no owner may free a buffer (close)
        # that a peer has not opened yet.
        exchange(self._store, f"{key}/opened", self.rank, self.world_size, "1", what, self.timeout_s)
        self._buffers[name] = _Buffer(name, numel, dtype, [c for c in copies if c is not None])
        self._device_bytes += numel * dtype.itemsize
        return own

    def _copy(self, name: str, peer: int, offset: int, numel: int) -> torch.Tensor:
        if not 0 <= peer < self.world_size:
            raise ValueError(f"rank {peer} is outside world_size {self.world_size}")
        buf = self._buffers.get(name)
        if buf is None:
            raise KeyError(f"no buffer {name!r} on this heap; alloc it first")
        if offset < 0 or offset + numel > buf.numel:
            raise ValueError(f"range [{offset}, {offset + numel}) is outside buffer {name!r} of {buf.numel}")
        return buf.copies[peer][offset:offset + numel]

    def get(self, out: torch.Tensor, name: str, peer: int, offset: int = 0) -> None:
        self._spans.get(out, name, peer, offset)

    def get_spans(self, out: torch.Tensor, name: str, spans: tuple[Span, ...]) -> None:
        """A whole gather in one device op where it can be (mapped.py)."""
        self._spans.get_spans(out, name, spans)

    def accumulate_spans(self, name: str, src: torch.Tensor, spans: tuple[Span, ...]) -> None:
        """A whole scatter_accumulate in one kernel launch (atomic_add.py's SpansAdd)."""
        self._spans.accumulate_spans(name, src, spans)

    def accumulate(self, name: str, peer: int, offset: int, src: torch.Tensor) -> None:
        self._spans.accumulate(name, peer, offset, src)

    # -- flags and counters: the host heap, with the device synchronised before a release -----
    def fetch_add(self, name: str, peer: int, index: int, value: int = 1) -> int:
        return self._control.fetch_add(name, peer, index, value)

    def store(self, name: str, index: int, value: int) -> None:
        torch.cuda.synchronize(self.device)
        self._control.store(name, index, value)

    def load(self, name: str, peer: int, index: int) -> int:
        return self._control.load(name, peer, index)

    def wait_until(self, name: str, peer: int, index: int, at_least: int, timeout_s: float) -> None:
        self._control.wait_until(name, peer, index, at_least, timeout_s)

    def quiet(self) -> None:
        torch.cuda.synchronize(self.device)

    def barrier(self, timeout_s: float) -> None:
        torch.cuda.synchronize(self.device)
        self._control.barrier(timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._buffers = {}  # peers' mappings close with the last tensor that uses them
        self._spans.clear()
        self._control.close()
        torch.cuda.ipc_collect()
