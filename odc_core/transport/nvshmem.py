"""A symmetric heap on NVSHMEM (torch's SymmetricMemory with its NVSHMEM backend), one GPU per
rank, for ranks that reach each other's GPU memory over NVLink: the GPUs of one node, or of a
multi-node NVLink domain, where NVSHMEM maps every peer's heap into each process.

Not yet run beyond one rank: the machines this project has been lent hold one GPU, where
NVSHMEM refuses more than one process (docs/transport.md, "What runs where"). What one GPU
allows, one rank, is checked by tests/integration/test_gpu_odc.py; everything with several GPUs
is written to the protocol and waits for a machine that has them.

Data buffers are symmetric allocations (symm_mem.empty + rendezvous over the default process
group); a peer's buffer is a tensor in this process (SymmetricMemory.get_buffer), so a get is
one device copy and an accumulate the same kernel of atomic fp32 adds as cuda_ipc's. A peer
NVSHMEM cannot map (another node, over the network) gets no view: gathers and pushes to it are
refused in one line. NVSHMEM's standard atomics are integers only, so an exact concurrent sum
into a network peer's fp32 accumulator would need the owner to reduce landing slots; instead,
across nodes, engine.shard=hybrid keeps every gather and push inside the node and sends the one
cross-node reduction per minibatch through the replicas' all-reduce.

Flags and counters go through the run's store (TCPStore: one round trip per read, sequentially
consistent, reachable from every node), not NVSHMEM: torch's NVSHMEM host-side barrier and
signal calls were empty stubs until mid-2026 (pytorch issue 191858) and are still unsupported
for network peers, so this heap relies on none of them. store() and barrier() synchronise the
device first (a release, as in cuda_ipc).
"""

from __future__ import annotations

import socket
import time
from typing import Any

import torch
import torch.distributed as dist

from odc_core.transport.base import PeerTimeout
from odc_core.transport.exchange import exchange
from odc_core.transport.mapped import Span, SpanOps
from odc_core.transport.shm import job_tag


def _device_key(device: torch.device) -> str:
    """This process's GPU as one string per physical device of the job: host and UUID."""
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", device.index))
    return f"{socket.gethostname()}/{uuid}"


def peer_views(handle: Any, rank: int, own: torch.Tensor) -> list[torch.Tensor | None]:
    """Every rank's copy of a symmetric buffer as a tensor here, by rank; None for a peer NVSHMEM
    does not map into this process (over the network). handle: the buffer's rendezvous.

    Unmapped is read from the peer's address being null (nvshmem_ptr's answer): torch's NVSHMEM
    get_buffer does not refuse such a peer but returns a tensor at address 0, which a copy would
    fault on."""
    return [own if peer == rank else handle.get_buffer(peer, tuple(own.shape), own.dtype) if address else None
            for peer, address in enumerate(handle.buffer_ptrs)]


class NvshmemHeap:
    """SymmetricHeap over NVSHMEM for `world_size` ranks, one GPU each; collective to construct.
    torch.distributed's default group must be initialised (NVSHMEM bootstraps through it)."""

    def __init__(self, rank: int, world_size: int, job_id: str, store: dist.Store, timeout_s: float = 120.0) -> None:
        from torch.distributed import _symmetric_memory as symm_mem

        if not torch.cuda.is_available():
            raise RuntimeError("transport nvshmem holds CUDA tensors and this process sees no CUDA device; "
                               "use engine.transport=auto (shm on CPU)")
        if not symm_mem.is_nvshmem_available():
            raise RuntimeError("transport nvshmem needs torch built with NVSHMEM and the NVSHMEM library of torch's "
                               "CUDA (nvidia-nvshmem-cu13 or, with pip install 'odc-bench[gpu]', -cu12); on one node, "
                               "engine.transport=cuda_ipc needs neither")
        self.rank, self.world_size = rank, world_size
        self.timeout_s = float(timeout_s)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.heap_bytes = 0
        self._store = store
        self._prefix = f"odc/{job_tag(job_id)}/nvshmem"
        mine = _device_key(self.device)
        for peer, theirs in exchange(store, f"{self._prefix}/device", rank, world_size, mine, "its GPU's identity",
                                     self.timeout_s):
            if theirs == mine:
                raise RuntimeError(f"ranks {min(rank, peer)} and {max(rank, peer)} share one GPU ({mine}); NVSHMEM "
                                   "takes one process per GPU: give each rank its own GPU, or use "
                                   "engine.transport=cuda_ipc, which lets ranks share one")
        self._symm = symm_mem
        symm_mem.set_backend("NVSHMEM")
        self._group = dist.group.WORLD.group_name  # type: ignore[union-attr]
        self._buffers: dict[str, list[torch.Tensor | None]] = {}
        self._spans = SpanOps(self._view, self.device)
        self._handles: list[object] = []  # keeps each rendezvous (and so its mappings) alive
        self._flags: dict[str, int] = {}
        self._epoch = 0
        self._closed = False

    def alloc(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        if self._closed:
            raise RuntimeError("alloc on a closed NvshmemHeap")
        if name in self._buffers or name in self._flags:
            raise ValueError(f"buffer {name!r} is already allocated")
        if numel < 1:
            raise ValueError(f"buffer {name!r} needs at least one element, got {numel}")
        if dtype == torch.int64:  # flags and counters: in the store (module docstring)
            self._flags[name] = numel
            for index in range(numel):
                self._store.set(self._flag(name, self.rank, index), "0")
            self.barrier(self.timeout_s)
            return torch.zeros(numel, dtype=dtype)
        own = self._symm.empty(numel, dtype=dtype, device=self.device)
        own.zero_()
        if self.world_size == 1:  # torch refuses a rendezvous of one rank; it has no peer to map
            self._buffers[name] = [own]
        else:
            handle = self._symm.rendezvous(own, self._group)
            self._handles.append(handle)
            self._buffers[name] = peer_views(handle, self.rank, own)
        self.heap_bytes += numel * dtype.itemsize
        self.barrier(self.timeout_s)  # zero-filled everywhere before any peer reads
        return own

    def _view(self, name: str, peer: int, offset: int, numel: int) -> torch.Tensor:
        views = self._buffers.get(name)
        if views is None:
            raise KeyError(f"no buffer {name!r} on this heap; alloc it first")
        if not 0 <= peer < self.world_size:
            raise ValueError(f"rank {peer} is outside world_size {self.world_size}")
        view = views[peer]
        if view is None:
            raise RuntimeError(f"rank {peer}'s GPU memory is not mapped into rank {self.rank} (another node, over "
                               "the network): transport nvshmem gathers and pushes over NVLink only; across nodes "
                               "set engine.shard=hybrid so that they stay within each node")
        if offset < 0 or offset + numel > view.numel():
            raise ValueError(f"range [{offset}, {offset + numel}) is outside buffer {name!r} of {view.numel()}")
        return view[offset:offset + numel]

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

    # -- flags and counters, through the store ---------------------------------------------
    def _flag(self, name: str, peer: int, index: int) -> str:
        if name not in self._flags:
            raise KeyError(f"no flag buffer {name!r} on this heap; alloc it (int64) first")
        if not 0 <= index < self._flags[name]:
            raise ValueError(f"index {index} is outside flag buffer {name!r} of {self._flags[name]}")
        return f"{self._prefix}/flag/{name}/{peer}/{index}"

    def fetch_add(self, name: str, peer: int, index: int, value: int = 1) -> int:
        return int(self._store.add(self._flag(name, peer, index), value)) - value

    def store(self, name: str, index: int, value: int) -> None:
        torch.cuda.synchronize(self.device)
        self._store.set(self._flag(name, self.rank, index), str(value))

    def load(self, name: str, peer: int, index: int) -> int:
        return int(self._store.get(self._flag(name, peer, index)))

    def wait_until(self, name: str, peer: int, index: int, at_least: int, timeout_s: float) -> None:
        deadline, delay = time.monotonic() + timeout_s, 1e-4
        while self.load(name, peer, index) < at_least:
            if time.monotonic() > deadline:
                raise PeerTimeout(peer, f"{name!r}[{index}] >= {at_least}", timeout_s)
            time.sleep(delay)
            delay = min(delay * 2, 1e-2)

    def quiet(self) -> None:
        torch.cuda.synchronize(self.device)

    def barrier(self, timeout_s: float) -> None:
        torch.cuda.synchronize(self.device)
        self._epoch += 1
        exchange(self._store, f"{self._prefix}/barrier/{self._epoch}", self.rank, self.world_size, "1",
                 f"barrier #{self._epoch}", timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._buffers, self._handles = {}, []
        self._spans.clear()
