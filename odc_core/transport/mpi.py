"""A symmetric heap over MPI-3 one-sided communication, for ranks on any number of hosts.

Every buffer is one MPI window over a torch tensor this rank owns (Win.Create, not
Win.Allocate: the tensors alloc returns stay valid after close frees the windows). Windows
are created one per alloc because alloc is collective anyway and a window cannot grow. Every
window is locked once for the heap's lifetime (Lock_all, MODE_NOCHECK) and each operation
ends with a flush: an operation has completed when it returns. Accumulate is MPI_SUM in the
buffer's type, atomic per element against every other rank's by the standard: no locks of ours.

The MPI stack is MPICH (the wheel on PyPI) on ch4:ofi with libfabric's `tcp;ofi_rxm`
provider, chosen by measurement (docs/transport.md, "Choosing the MPI stack"). On TCP nothing
completes a get or an accumulate without the owner's CPU, so every rank runs a progress
thread that drives MPI's progress engine (one Iprobe) every `progress_interval_s` and sleeps
in between: a gatherer is not held up by an owner that computes, and no core is kept busy
the way MPICH's own progress thread (MPIR_CVAR_ASYNC_PROGRESS) keeps one.

Bootstrap: ranks are started by an MPI process manager (mpiexec -n N; srun --mpi=pmi2 on
SLURM) and the heap uses MPI_COMM_WORLD, checking that its ranks are the harness's; the run's
store carries allocation specs and liveness addresses. Singletons started by the harness do
not work with the wheels on PyPI (docs/transport.md).

MPI is fail-stop: an operation on a dead peer aborts or hangs the caller (MPICH; Open MPI's
ULFM covers no one-sided component). So every rank holds an idle TCP connection to every
peer, which the kernel closes when the peer's process dies; operations and waits check it
first and raise PeerTimeout naming the peer instead of touching it. Hydra's mpiexec tells
survivors of a failure with SIGUSR1, whose default action would end them: it is ignored.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from odc_core.transport.base import PeerTimeout
from odc_core.transport.exchange import exchange, rotated
from odc_core.transport.shm import job_tag

_CONTROL = "odc/control"  # reserved buffer: barrier epoch
# Element types MPI can add atomically (bf16 has no MPI datatype: accumulate it into float32).
_MPI_TYPES = {torch.float32: "FLOAT", torch.float64: "DOUBLE", torch.int32: "INT32_T", torch.int64: "INT64_T"}
# MPICH settings applied unless already set: libfabric's TCP provider (its `sockets` provider,
# which behaved alike, is kept by libfabric for development only; docs/transport.md). A cluster
# with a faster fabric exports its own (FI_PROVIDER=verbs;ofi_rxm, cxi, efa, ...).
STACK_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp;ofi_rxm"}
# Keeps MPI off shared memory between ranks of one host, so that one host exercises the
# network path a cluster takes; a launcher sets it before MPI starts.
NETWORK_ONLY_ENV = {"MPIR_CVAR_NOLOCAL": "1"}
# How often the progress thread drives MPI while this rank is elsewhere: the longest a passive
# operation waits on an owner outside MPI, per round trip of its protocol.
PROGRESS_INTERVAL_S = 5e-4

_process: dict[str, Any] = {"pid": None, "clean": True}  # MPI_Init is once per process; see _finalize


def _init_mpi() -> Any:
    """mpi4py's MPI module, initialised at MPI_THREAD_MULTIPLE (a prefetch thread gets and the
    progress thread probes while the compute thread pushes). STACK_ENV only takes effect
    before MPI_Init."""
    try:
        import mpi4py
    except ImportError:
        raise RuntimeError("engine.transport=mpi needs mpi4py and MPICH: pip install 'odc-bench[mpi]'") from None
    if "mpi4py.MPI" not in sys.modules:
        for key, value in STACK_ENV.items():
            os.environ.setdefault(key, value)
        # Finalize ourselves (_finalize): MPI_Finalize must be skipped after a peer died.
        mpi4py.rc(initialize=False, finalize=False, thread_level="multiple")
    from mpi4py import MPI

    if not MPI.Is_initialized():
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # hydra's notice that a peer failed: the links tell who
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        _process["pid"] = os.getpid()
        atexit.register(_finalize)
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError("MPI was initialised below MPI_THREAD_MULTIPLE; initialise it with "
                           "mpi4py.rc.thread_level = 'multiple' or let MpiHeap do it")
    return MPI


def _finalize() -> None:
    # A forked child shares nothing of MPI's; after a peer died MPI_Finalize may wait on it.
    if os.getpid() == _process["pid"] and _process["clean"]:
        from mpi4py import MPI

        if not MPI.Is_finalized():
            MPI.Finalize()


class _Links:
    """An idle TCP connection to every peer: the kernel closes it when the peer's process
    dies, so `alive` knows at once, without touching the peer through MPI."""

    def __init__(self, rank: int, world_size: int, exchange, host: str, timeout_s: float) -> None:
        self.socks: dict[int, socket.socket] = {}
        self.dead: set[int] = set()
        with socket.create_server(("", 0)) as listener:
            listener.settimeout(timeout_s)
            addresses = dict(exchange("links", json.dumps([host, listener.getsockname()[1]]), "liveness links"))
            for peer in range(rank):  # connect to lower ranks, accept the higher ones
                sock = socket.create_connection(tuple(json.loads(addresses[peer])), timeout=timeout_s)
                sock.sendall(struct.pack("!I", rank))
                self.socks[peer] = sock
            for _ in range(rank + 1, world_size):
                try:
                    sock, _addr = listener.accept()
                except TimeoutError:
                    missing = min(set(range(rank + 1, world_size)) - set(self.socks))
                    raise PeerTimeout(missing, "liveness link", timeout_s) from None
                sock.settimeout(timeout_s)
                self.socks[struct.unpack("!I", sock.recv(4, socket.MSG_WAITALL))[0]] = sock
        for sock in self.socks.values():
            sock.settimeout(None)  # alive() peeks with MSG_DONTWAIT; a timeout would make it wait first

    def alive(self, peer: int) -> bool:
        if peer in self.dead:
            return False
        sock = self.socks.get(peer)
        if sock is None:  # this rank
            return True
        try:
            gone = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return True
        except OSError:
            gone = True
        if gone:
            self.dead.add(peer)
        return not gone

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()
        self.socks = {}


class _Progress:
    """Drives MPI's progress engine while this rank's own threads are outside MPI, so that the
    operations peers direct at its windows complete. One Iprobe per interval, asleep in between."""

    def __init__(self, comm: Any, interval_s: float) -> None:
        self.comm, self.interval_s = comm, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="odc-mpi-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.comm.Iprobe()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class _Buffer:
    name: str
    numel: int
    dtype: torch.dtype
    tensor: torch.Tensor
    win: Any  # MPI.Win
    mpi_type: Any  # MPI.Datatype for accumulate; None where MPI has none (bf16, ...)


class MpiHeap:
    """SymmetricHeap over MPI-3 RMA windows, for ranks on one host or many.

    Constructing it is collective: it builds the communicator (see the module docstring),
    the liveness links, the progress thread and the control buffer, with `store` (the run's
    TCPStore) as the only rendezvous. `host` is the name or address peers reach this rank at
    for liveness links (default: $ODC_MPI_HOST, else this host's name).
    get/accumulate/fetch_add/load/store/wait_until may be called from several threads;
    alloc, barrier and close from one.
    """

    def __init__(self, rank: int, world_size: int, job_id: str, store: dist.Store, timeout_s: float = 120.0,
                 host: str | None = None, progress_interval_s: float = PROGRESS_INTERVAL_S) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.rank, self.world_size, self.heap_bytes = rank, world_size, 0
        self.timeout_s = float(timeout_s)
        self._job = job_tag(job_id)
        self._store = store
        self._buffers: dict[str, _Buffer] = {}
        self._epoch = 0
        self._allocs = 0
        self._closed = False
        self._comm: Any = None
        self._links: _Links | None = None
        self._guard = threading.Lock()  # alloc's list of windows against store()'s sync of them
        self._progress: _Progress | None = None
        self._mpi = _init_mpi()
        try:
            self._comm = self._connect()
            self._progress = _Progress(self._comm.Dup(), progress_interval_s)
            host = host or os.environ.get("ODC_MPI_HOST") or socket.gethostname()
            self._links = _Links(rank, world_size, self._exchange, host, self.timeout_s)
            self.alloc(_CONTROL, 1, torch.int64)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> MpiHeap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- bootstrap ----------------------------------------------------------------------

    def _exchange(self, key: str, value: str, what: str) -> list[tuple[int, str]]:
        """Publish `value` under key/<rank> and return every peer's."""
        return exchange(self._store, f"odc/{self._job}/mpi/{key}", self.rank, self.world_size, value, what,
                        self.timeout_s)

    def _connect(self) -> Any:
        """This job's communicator: MPI_COMM_WORLD, whose ranks must be the harness's."""
        world = self._mpi.COMM_WORLD
        if world.Get_size() != self.world_size:
            raise RuntimeError(f"MPI_COMM_WORLD has {world.Get_size()} processes, the job {self.world_size}: "
                               "start the ranks with an MPI process manager (mpiexec -n N, srun --mpi=pmi2)")
        if world.Get_rank() != self.rank:
            raise RuntimeError(f"MPI started this process as rank {world.Get_rank()}, the harness as rank {self.rank}; "
                               "take the rank from the process manager (PMI_RANK, SLURM_PROCID)")
        comm = world.Dup()
        # MPICH opens a connection on a pair's first contact: make every pair's now, while every
        # rank is in MPI, so that no one-sided operation later waits for one.
        comm.alltoall([None] * self.world_size)
        comm.Barrier()
        return comm

    def _peers(self) -> list[int]:
        return rotated(self.rank, self.world_size)

    # -- allocation ---------------------------------------------------------------------

    def alloc(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        if self._closed:
            raise RuntimeError("alloc on a closed MpiHeap")
        if name in self._buffers:
            raise ValueError(f"buffer {name!r} is already allocated")
        if numel < 1:
            raise ValueError(f"buffer {name!r} needs at least one element, got {numel}")
        # Failed allocations count too: every rank that published a spec moved on to the next index.
        index, self._allocs = self._allocs, self._allocs + 1
        spec = dict(name=name, numel=numel, dtype=str(dtype))
        # Every peer must be at this alloc before the collective Win_create, which cannot time out.
        for peer, published in self._exchange(f"{index}/spec", json.dumps(spec), f"allocation of {name!r}"):
            if json.loads(published) != spec:
                raise ValueError(f"asymmetric allocation #{index}: rank {self.rank} allocated {spec}, "
                                 f"rank {peer} allocated {published}; every rank must alloc the same buffers in order")
        MPI = self._mpi
        tensor = torch.zeros(numel, dtype=dtype)
        win = MPI.Win.Create(tensor.view(torch.uint8).numpy(), dtype.itemsize, comm=self._comm)
        win.Lock_all(MPI.MODE_NOCHECK)
        mpi_type = getattr(MPI, _MPI_TYPES[dtype]) if dtype in _MPI_TYPES else None
        with self._guard:
            self._buffers[name] = _Buffer(name, numel, dtype, tensor, win, mpi_type)
        self.heap_bytes += numel * dtype.itemsize
        return tensor

    def _get_buffer(self, name: str, peer: int, what: str) -> _Buffer:
        if not 0 <= peer < self.world_size:
            raise ValueError(f"rank {peer} is outside world_size {self.world_size}")
        try:
            buf = self._buffers[name]
        except KeyError:
            raise KeyError(f"no buffer {name!r} on this heap; alloc it first") from None
        if not self._alive(peer):
            raise PeerTimeout(peer, f"{what} of {name!r}: its process is gone", 0.0)
        return buf

    def _alive(self, peer: int) -> bool:
        assert self._links is not None, "the heap is closed"
        return self._links.alive(peer)

    def _memory(self, t: torch.Tensor) -> Any:
        """A contiguous tensor's bytes as an MPI buffer. Not .numpy(): that would make the
        caller's storage unresizable for good (the ODC engine frees gathered units by resizing)."""
        return self._mpi.buffer.fromaddress(t.data_ptr(), t.numel() * t.element_size())

    @staticmethod
    def _check_range(buf: _Buffer, offset: int, numel: int) -> None:
        if offset < 0 or offset + numel > buf.numel:
            raise ValueError(f"range [{offset}, {offset + numel}) is outside buffer {buf.name!r} of {buf.numel}")

    # -- one-sided operations -----------------------------------------------------------

    def get(self, out: torch.Tensor, name: str, peer: int, offset: int = 0) -> None:
        buf = self._get_buffer(name, peer, "get")
        if out.dtype != buf.dtype:
            raise TypeError(f"get of {name!r} ({buf.dtype}) into a {out.dtype} tensor; dtypes must match")
        n = out.numel()
        self._check_range(buf, offset, n)
        if n == 0:
            return
        dst = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        nbytes = n * buf.dtype.itemsize
        # Bytes, not typed elements: a get copies and bf16 has no MPI datatype.
        B = self._mpi.BYTE
        buf.win.Get([self._memory(dst), nbytes, B], peer, (offset, nbytes, B))
        buf.win.Flush(peer)
        if dst is not out:
            out.copy_(dst)

    def accumulate(self, name: str, peer: int, offset: int, src: torch.Tensor) -> None:
        buf = self._get_buffer(name, peer, "accumulate")
        if buf.mpi_type is None:
            raise TypeError(f"MPI cannot add {buf.dtype} elements: allocate {name!r} as float32 "
                            "(lower-precision sources are converted on the way)")
        # MPI adds elements of one type: convert a bf16 source to the buffer's dtype first.
        flat = src.reshape(-1).to(buf.dtype).contiguous()
        n = flat.numel()
        self._check_range(buf, offset, n)
        if n == 0:
            return
        # MPI_SUM through Accumulate is atomic per element against every other rank's: no locks.
        buf.win.Accumulate([self._memory(flat), n, buf.mpi_type], peer, (offset, n, buf.mpi_type), op=self._mpi.SUM)
        buf.win.Flush(peer)

    def _word(self, name: str, peer: int, index: int, what: str) -> _Buffer:
        buf = self._get_buffer(name, peer, what)
        if buf.dtype != torch.int64:
            raise TypeError(f"buffer {name!r} is {buf.dtype}; flags and counters need torch.int64")
        self._check_range(buf, index, 1)
        return buf

    def _fetch_op(self, buf: _Buffer, peer: int, index: int, value: int, op: Any) -> int:
        result = torch.zeros(1, dtype=torch.int64)
        operand = torch.tensor([value], dtype=torch.int64)
        buf.win.Fetch_and_op([operand.numpy(), buf.mpi_type], [result.numpy(), buf.mpi_type], peer, index, op)
        buf.win.Flush(peer)
        return int(result)

    def fetch_add(self, name: str, peer: int, index: int, value: int = 1) -> int:
        return self._fetch_op(self._word(name, peer, index, "fetch_add"), peer, index, value, self._mpi.SUM)

    def store(self, name: str, index: int, value: int) -> None:
        buf = self._word(name, self.rank, index, "store")
        # Release: what this rank wrote into its buffers is visible to RMA before the flag is.
        self._sync()
        self._fetch_op(buf, self.rank, index, value, self._mpi.REPLACE)

    def load(self, name: str, peer: int, index: int) -> int:
        # An atomic read: a plain Get of an element that peers update atomically is undefined.
        return self._fetch_op(self._word(name, peer, index, "load"), peer, index, 0, self._mpi.NO_OP)

    def wait_until(self, name: str, peer: int, index: int, at_least: int, timeout_s: float) -> None:
        self._await(name, peer, index, at_least, time.monotonic() + timeout_s, f"{name!r}[{index}] >= {at_least}")

    def _await(self, name: str, peer: int, index: int, at_least: int, deadline: float, what: str) -> None:
        started = time.monotonic()
        delay = 1e-5
        while True:
            if not self._alive(peer):
                raise PeerTimeout(peer, f"{what}: its process is gone", time.monotonic() - started)
            if self.load(name, peer, index) >= at_least:
                break
            if time.monotonic() > deadline:
                raise PeerTimeout(peer, what, deadline - started)
            time.sleep(delay)  # a waiter must not spin on a core the peer needs
            delay = min(delay * 2, 1e-3)
        # Acquire: what peers put into this rank's buffers before the flag is visible to local reads.
        self._sync()

    def _sync(self) -> None:
        with self._guard:
            windows = [buf.win for buf in self._buffers.values()]
        for win in windows:
            win.Sync()  # in MPI's unified memory model, a memory barrier

    def quiet(self) -> None:
        """Every operation flushes before it returns: nothing is left to complete."""

    def barrier(self, timeout_s: float) -> None:
        """Each rank publishes its barrier count and waits for every peer's to reach it
        (MPI_Barrier cannot time out)."""
        self._epoch += 1
        self.store(_CONTROL, 0, self._epoch)
        deadline = time.monotonic() + timeout_s
        for peer in self._peers():
            self._await(_CONTROL, peer, 0, self._epoch, deadline, f"barrier #{self._epoch}")

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Free the windows and the communicator once every peer is closing too (both are
        collective). After a peer died or did not come, free nothing and skip MPI_Finalize,
        which could wait for it: the process's exit releases everything."""
        if self._closed:
            return
        self._closed = True
        buffers, self._buffers = list(self._buffers.values()), {}
        clean = self._comm is not None and self._links is not None
        if clean:
            try:
                self._buffers = {_CONTROL: next(b for b in buffers if b.name == _CONTROL)}
                self.barrier(self.timeout_s)  # nobody is still reading this rank's buffers
            except (PeerTimeout, StopIteration):
                clean = False
            self._buffers = {}
        if clean:
            assert self._progress is not None and self._links is not None
            self._progress.stop()
            self._progress.comm.Free()
            for buf in buffers:
                buf.win.Unlock_all()
                buf.win.Free()
            self._comm.Disconnect()
            self._links.close()
        elif self._comm is not None:
            # Links and the progress thread stay until the process exits: a peer that sees a
            # link close takes this rank for dead, and one still reading its windows needs them served.
            _process["clean"] = False
        self._comm = None


__all__ = ["MpiHeap", "NETWORK_ONLY_ENV", "STACK_ENV"]

