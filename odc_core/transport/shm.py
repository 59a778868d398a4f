"""A symmetric heap in POSIX shared memory, for ranks on one host.

Every buffer is one file in /dev/shm per rank, mapped by its owner and by every peer, so a
get is a plain copy out of the peer's mapping and the peer does nothing.

Accumulation uses fine-grained byte-range locks, not staging slots plus an accumulation
service. A pusher locks the region of the owner's accumulator it is about to add into and
adds there itself: one pass over its source and the accumulator, and no work for the owner.
A staging design copies the source into a slot first, then a service thread on the owner
adds the slot into the accumulator and acknowledges it: the owner spends as much CPU per
byte as the pusher (taken from its own forward and backward), every client's adds are
serialised through that one thread, and each slot costs a request/acknowledge round trip.
Measured against such a service, locks landed about twice the bytes per second and cost the
owner nothing (docs/transport.md).

Locks are Linux open-file-description locks (F_OFD_SETLK): they are held per open file, so
each thread opens its own descriptors and threads of one process exclude each other too,
and the kernel drops them when a holder dies, so a SIGKILLed pusher cannot wedge its owner.
The lock of buffer `b`, element range [i, j) of rank r lives in r's control file at byte
offsets (b << 40) + [i, j) * itemsize: one descriptor per peer and thread covers every
buffer. A push is split on a fixed grid (chunk_bytes) so that pushers into the same owner
lock different regions and take turns at the granularity of one chunk; a pusher that finds
a chunk busy moves on to its next chunk and comes back, so it only waits when every chunk it
still has to add is held by someone else.

Counters and flags (int64 buffers) are read and written under the same locks, which makes
fetch_add atomic and orders data before flags: the kernel's lock acquire/release are full
barriers, so whatever a rank wrote before store() is visible to a peer whose load() saw it.

Lifecycle: segments are named odc-<job>-r<rank>-p<pid>-t<start>-b<index>, where <start> is
the creator's start time in clock ticks since boot (guards against PID reuse). close() (also
run by the context manager and at exit) unlinks this rank's segments, and so does SIGTERM
(sigterm.py: how torchrun stops a failed rank's peers). A rank killed by SIGKILL leaves its
segments behind: its peers remove them when they close their heaps, the local launcher as
soon as its ranks are gone, and failing both (every rank of a job killed) the next ShmHeap on
the host removes every odc-* segment whose creator is no longer running.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import mmap
import os
import re
import resource
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from odc_core.transport.base import PeerTimeout
from odc_core.transport.exchange import exchange, rotated
from odc_core.transport.sigterm import forget, on_sigterm

SHM_DIR = Path("/dev/shm")
SEGMENT_PREFIX = "odc-"
_SEGMENT_RE = re.compile(r"^odc-(?P<job>[A-Za-z0-9_.]+)-r(?P<rank>\d+)-p(?P<pid>\d+)-t(?P<start>\d+)-b(?P<index>\d+)$")
_CONTROL = "odc/control"  # reserved buffer: barrier epoch; its file also carries every lock
_LOCK_SHIFT = 40  # lock offset of buffer b starts at b << 40 (buffers up to 1 TiB)
_FLOCK = "hhqqi4x"  # struct flock on Linux x86-64 and aarch64


def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot, or None if no such process is running.

    A zombie (dead, not yet reaped by its parent) counts as gone: its segments are garbage.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")  # a name is any bytes
    except OSError:  # no such process (or it exited while we read)
        return None
    # Fields after the command name (which may contain spaces) start at field 3 (state); starttime is 22.
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def segment_creator(name: str) -> tuple[int, int] | None:
    """(pid, start time) encoded in an odc segment name; None for other names."""
    m = _SEGMENT_RE.match(name)
    return (int(m["pid"]), int(m["start"])) if m else None


def creator_alive(name: str) -> bool:
    pid_start = segment_creator(name)
    return pid_start is not None and process_start_time(pid_start[0]) == pid_start[1]


def list_segments(directory: Path = SHM_DIR) -> list[str]:
    return sorted(p.name for p in directory.glob(SEGMENT_PREFIX + "*"))


def job_tag(job_id: str) -> str:
    """A job id as it appears in segment names."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", job_id) or "job"


def of_job(name: str, job_id: str) -> bool:
    """Whether a segment is the job's: its own heap's, or a heap a process group of the job
    made under a derived id (`<job>.pg<n>`, see shm_group.py), which a sweep must also cover."""
    m = _SEGMENT_RE.match(name)
    tag = job_tag(job_id)
    return m is not None and (m["job"] == tag or m["job"].startswith(tag + "."))


def sweep_stale_segments(directory: Path = SHM_DIR, job_id: str | None = None) -> list[str]:
    """Remove odc segments (of one job, when job_id is given) whose creator is no longer
    running; return their names.

    Peers that still map such a segment keep their mapping: unlinking only drops the name.
    """
    removed = []
    for name in list_segments(directory):
        if _SEGMENT_RE.match(name) is None or (job_id is not None and not of_job(name, job_id)):
            continue
        if not creator_alive(name):
            try:
                (directory / name).unlink()
                removed.append(name)
            except FileNotFoundError:
                pass  # another rank swept it first
            except PermissionError:
                pass  # another user's segment: theirs to sweep
    return removed


def _lock_op(fd: int, kind: int, start: int, length: int) -> bool:
    """One non-blocking OFD lock operation; False when another open file holds a conflicting lock."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, start, length, 0))
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


class _Backoff:
    """Sleeps growing from 10 us to 1 ms: a waiter must not spin on a core the holder needs."""

    def __init__(self, peer: int, what: str, timeout_s: float) -> None:
        self.peer, self.what, self.timeout_s = peer, what, timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.delay = 1e-5

    def wait(self) -> None:
        if time.monotonic() > self.deadline:
            raise PeerTimeout(self.peer, self.what, self.timeout_s)
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 1e-3)

    def progressed(self) -> None:
        self.deadline = time.monotonic() + self.timeout_s
        self.delay = 1e-5


@dataclass
class _Buffer:
    """One rank's copy of a named buffer, as mapped in this process."""

    name: str
    index: int
    segment: str
    numel: int
    dtype: torch.dtype
    tensor: torch.Tensor
    words: memoryview | None  # int64 buffers: element access without torch's per-call overhead

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


# Python's mmap keeps a duplicate of the file's descriptor until 3.13 lets it not: one per
# segment mapped, every peer's included.
_MMAP_KWARGS = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def _map(path: Path, nbytes: int, create: bool) -> mmap.mmap:
    try:
        return _map_once(path, nbytes, create)
    except OSError as e:
        if e.errno != errno.EMFILE:
            raise
    # Out of descriptors: take the hard limit, as a process may, and try once more.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        if create:
            path.unlink(missing_ok=True)  # created before the mapping ran out
        try:
            return _map_once(path, nbytes, create)
        except OSError as e:
            if e.errno != errno.EMFILE:
                raise
    if create:
        path.unlink(missing_ok=True)
    raise OSError(errno.EMFILE, f"cannot map shared-memory segment {path.name}: this process has {hard} file "
                                f"descriptors (ulimit -n, hard limit) and the shm transport keeps one per segment it "
                                f"maps on Python < 3.13, about 2 per unit for each rank on the host; raise the limit, "
                                f"run fewer ranks per host or use Python 3.13") from None


def _map_once(path: Path, nbytes: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            _reserve(fd, path, nbytes)
        # MAP_POPULATE builds the page tables now, so the first get does not pay a fault per page.
        return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, **_MMAP_KWARGS)
    finally:
        os.close(fd)  # the mapping keeps the file; locks use the control file's descriptors


def _memory_of(directory: Path) -> dict[str, str]:
    """Which shared memory `directory` is: ranks whose segments land in the same file system of
    the same running kernel can map each other's (a host's name alone would not tell two
    containers, or two hosts both called localhost, apart)."""
    st = os.stat(directory)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    return dict(host=socket.gethostname(), folder=str(directory), fs=f"{boot}:{st.st_dev}:{st.st_ino}")


def _where(memory: dict[str, str]) -> str:
    return f"{memory['folder']} on {memory['host']}"


def _reserve(fd: int, path: Path, nbytes: int) -> None:
    """Give the segment its pages now, zeroed. A file only truncated to size gets them as they
    are first touched, and where the file system is full (a container's /dev/shm is 64 MiB
    unless started with --shm-size) that touch kills the process with SIGBUS, its segments left
    behind; allocating them here fails with ENOSPC instead, which is said in one line."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        fs = os.statvfs(path.parent)
        free, size = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
        raise OSError(errno.ENOSPC, f"shared memory is full: a segment of {_mib(nbytes)} does not fit in "
                                    f"{path.parent}, which has {_mib(free)} free of {_mib(size)}; give it more room "
                                    f"(docker run --shm-size, or a larger tmpfs), or run fewer ranks per host or a "
                                    f"smaller model") from None


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


class ShmHeap:
    """SymmetricHeap over /dev/shm for `world_size` ranks of one host.

    Constructing it is collective (it allocates the control buffer), like every alloc. The
    store (the run's TCPStore) is used only to exchange segment names at allocation.
    get/accumulate/fetch_add/load/store/wait_until may be called from several threads of a
    process; alloc, barrier and close from one.
    """

    def __init__(self, rank: int, world_size: int, job_id: str, store: dist.Store, timeout_s: float = 120.0,
                 chunk_bytes: int = 1 << 20, directory: Path = SHM_DIR) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self.rank, self.world_size, self.heap_bytes = rank, world_size, 0
        self.timeout_s, self.chunk_bytes = float(timeout_s), int(chunk_bytes)
        self._job = job_tag(job_id)
        self._store, self._dir = store, directory
        self._memory = _memory_of(directory)
        self._pid = os.getpid()
        self._tag = f"p{self._pid}-t{process_start_time(self._pid)}"
        self._buffers: dict[str, list[_Buffer]] = {}
        self._own_segments: list[str] = []
        self._tls = threading.local()
        self._control_fds: list[int] = []  # one per rank: every thread's lock descriptors reopen these
        self._lock_fds: list[int] = []
        self._fds_guard = threading.Lock()
        self._epoch = 0
        self._closed = False
        atexit.register(self.close)
        on_sigterm(id(self), self._unlink_own)  # torchrun SIGTERMs a failed rank's peers
        try:
            sweep_stale_segments(directory)
            self.alloc(_CONTROL, 1, torch.int64)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ShmHeap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- allocation ---------------------------------------------------------------------

    def alloc(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        if self._closed:
            raise RuntimeError("alloc on a closed ShmHeap")
        if name in self._buffers:
            raise ValueError(f"buffer {name!r} is already allocated")
        if numel < 1:
            raise ValueError(f"buffer {name!r} needs at least one element, got {numel}")
        index = len(self._buffers)
        segment = f"{SEGMENT_PREFIX}{self._job}-r{self.rank}-{self._tag}-b{index}"
        nbytes = numel * dtype.itemsize
        self._own_segments.append(segment)
        own = self._buffer(name, index, segment, numel, dtype, create=True)
        self.heap_bytes += nbytes
        key = f"odc/{self._job}/{index}"
        spec = dict(name=name, numel=numel, dtype=str(dtype))
        what = f"allocation of {name!r}"
        ranks: list[_Buffer | None] = [None] * self.world_size
        ranks[self.rank] = own
        for peer, published in self._exchange(f"{key}/segment", json.dumps(dict(spec, segment=segment,
                                                                                  memory=self._memory)), what):
            theirs = json.loads(published)
            if theirs["memory"]["fs"] != self._memory["fs"]:
                raise RuntimeError(f"ranks {self.rank} and {peer} share no memory: rank {self.rank}'s segments are in "
                                   f"{_where(self._memory)}, rank {peer}'s in {_where(theirs['memory'])}; the shm "
                                   f"transport holds ranks of one host: across hosts use transport=mpi (CPU ranks) or "
                                   f"nvshmem (one GPU each)")
            if {k: theirs[k] for k in spec} != spec:
                raise ValueError(f"asymmetric allocation #{index}: rank {self.rank} allocated {spec}, "
                                 f"rank {peer} allocated {theirs}; every rank must alloc the same buffers in order")
            try:
                ranks[peer] = self._buffer(name, index, theirs["segment"], numel, dtype, create=False)
            except FileNotFoundError:
                raise RuntimeError(f"rank {peer} removed its segment for {name!r} before rank {self.rank} "
                                   "mapped it (did it exit?)") from None
        mapped = [buf for buf in ranks if buf is not None]
        assert len(mapped) == self.world_size, "every peer's copy is mapped"
        if name == _CONTROL:
            self._control_fds = [os.open(self._dir / buf.segment, os.O_RDWR) for buf in mapped]
        self._buffers[name] = mapped
        # Second round: once it returns, every rank has mapped every copy, so a rank may unlink
        # its segments (close) at any time after without a peer failing to reach them.
        self._exchange(f"{key}/mapped", "1", what)
        return own.tensor

    def _exchange(self, key: str, value: str, what: str) -> list[tuple[int, str]]:
        return exchange(self._store, key, self.rank, self.world_size, value, what, self.timeout_s)

    def _buffer(self, name: str, index: int, segment: str, numel: int, dtype: torch.dtype,
                create: bool) -> _Buffer:
        mapping = _map(self._dir / segment, numel * dtype.itemsize, create)
        tensor = torch.frombuffer(mapping, dtype=dtype, count=numel)
        words = memoryview(mapping).cast("q") if dtype == torch.int64 else None
        return _Buffer(name, index, segment, numel, dtype, tensor, words)

    def _peers(self) -> list[int]:
        return rotated(self.rank, self.world_size)

    def _get_buffer(self, name: str, peer: int) -> _Buffer:
        if not 0 <= peer < self.world_size:
            raise ValueError(f"rank {peer} is outside world_size {self.world_size}")
        try:
            return self._buffers[name][peer]
        except KeyError:
            raise KeyError(f"no buffer {name!r} on this heap; alloc it first") from None

    @staticmethod
    def _check_range(buf: _Buffer, offset: int, numel: int) -> None:
        if offset < 0 or offset + numel > buf.numel:
            raise ValueError(f"range [{offset}, {offset + numel}) is outside buffer {buf.name!r} of {buf.numel}")

    # -- locks --------------------------------------------------------------------------

    def _lock_fd(self, peer: int) -> int:
        """This thread's descriptor on peer's control file: OFD locks exclude per descriptor."""
        fds = getattr(self._tls, "fds", None)
        if fds is None:
            fds = self._tls.fds = [None] * self.world_size
        if fds[peer] is None:
            # A new open file description of the same file, even if its owner has unlinked it since.
            fd = os.open(f"/proc/self/fd/{self._control_fds[peer]}", os.O_RDWR)
            with self._fds_guard:
                self._lock_fds.append(fd)
            fds[peer] = fd
        return fds[peer]

    def _lock_range(self, buf: _Buffer, lo: int, hi: int) -> tuple[int, int]:
        return (buf.index << _LOCK_SHIFT) + lo * buf.itemsize, (hi - lo) * buf.itemsize

    def _locked(self, buf: _Buffer, peer: int, lo: int, hi: int, kind: int = fcntl.F_WRLCK) -> _Held:
        return _Held(self, buf, peer, lo, hi, kind)

    # -- one-sided operations -----------------------------------------------------------

    def view(self, name: str, peer: int) -> torch.Tensor:
        """Peer's buffer itself, as this process maps it: zero-copy reads for code that knows
        the heap is shared memory. Not part of the SymmetricHeap protocol (a GPU heap's peer
        memory is not a CPU tensor), and writes through it bypass accumulate's locks."""
        return self._get_buffer(name, peer).tensor

    def get(self, out: torch.Tensor, name: str, peer: int, offset: int = 0) -> None:
        buf = self._get_buffer(name, peer)
        if out.dtype != buf.dtype:
            raise TypeError(f"get of {name!r} ({buf.dtype}) into a {out.dtype} tensor; dtypes must match")
        n = out.numel()
        self._check_range(buf, offset, n)
        src = buf.tensor if offset == 0 and n == buf.numel else buf.tensor[offset:offset + n]
        # One copy per call: a read takes no lock and no handshake, so splitting it would only add overhead.
        out.copy_(src if out.dim() == 1 else src.view(out.shape))

    def accumulate(self, name: str, peer: int, offset: int, src: torch.Tensor) -> None:
        buf = self._get_buffer(name, peer)
        flat = src.reshape(-1)
        n = flat.numel()
        self._check_range(buf, offset, n)
        if n == 0:
            return
        step = max(1, self.chunk_bytes // buf.itemsize)
        edges = [offset, *range((offset // step + 1) * step, offset + n, step), offset + n]
        chunks = list(zip(edges[:-1], edges[1:], strict=True))
        # Start pushers at different chunks so several ranks pushing into one owner rarely collide.
        first = (self.rank * len(chunks)) // self.world_size
        pending = chunks[first:] + chunks[:first]
        fd = self._lock_fd(peer)
        backoff = None
        while pending:
            deferred = []
            for lo, hi in pending:
                start, length = self._lock_range(buf, lo, hi)
                if not _lock_op(fd, fcntl.F_WRLCK, start, length):
                    deferred.append((lo, hi))
                    continue
                try:
                    dst = buf.tensor if hi - lo == buf.numel else buf.tensor[lo:hi]
                    dst.add_(flat if hi - lo == n else flat[lo - offset:hi - offset])
                finally:
                    _lock_op(fd, fcntl.F_UNLCK, start, length)
            if len(deferred) < len(pending):
                if backoff is not None:
                    backoff.progressed()
            else:
                backoff = backoff or _Backoff(peer, f"lock on {name!r} elements [{offset}, {offset + n})",
                                              self.timeout_s)
                backoff.wait()
            pending = deferred

    def _word(self, name: str, peer: int, index: int) -> tuple[_Buffer, memoryview]:
        buf = self._get_buffer(name, peer)
        if buf.words is None:
            raise TypeError(f"buffer {name!r} is {buf.dtype}; flags and counters need torch.int64")
        self._check_range(buf, index, 1)
        return buf, buf.words

    def fetch_add(self, name: str, peer: int, index: int, value: int = 1) -> int:
        buf, words = self._word(name, peer, index)
        with self._locked(buf, peer, index, index + 1):
            old: int = words[index]
            words[index] = old + value
        return old

    def store(self, name: str, index: int, value: int) -> None:
        buf, words = self._word(name, self.rank, index)
        with self._locked(buf, self.rank, index, index + 1):
            words[index] = value

    def load(self, name: str, peer: int, index: int) -> int:
        buf, words = self._word(name, peer, index)
        with self._locked(buf, peer, index, index + 1, fcntl.F_RDLCK):
            value: int = words[index]
        return value

    def wait_until(self, name: str, peer: int, index: int, at_least: int, timeout_s: float) -> None:
        backoff = _Backoff(peer, f"{name!r}[{index}] >= {at_least}", timeout_s)
        while self.load(name, peer, index) < at_least:
            backoff.wait()

    def quiet(self) -> None:
        """Every operation of this transport has completed when it returns: nothing to flush."""

    def barrier(self, timeout_s: float) -> None:
        """Each rank publishes its barrier count and waits for every peer's to reach it."""
        self._epoch += 1
        self.store(_CONTROL, 0, self._epoch)
        deadline = time.monotonic() + timeout_s
        for peer in self._peers():
            remaining = deadline - time.monotonic()
            try:
                self.wait_until(_CONTROL, peer, 0, self._epoch, max(remaining, 0.0))
            except PeerTimeout:
                raise PeerTimeout(peer, f"barrier #{self._epoch}", timeout_s) from None

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        forget(id(self))
        with self._fds_guard:
            fds, self._lock_fds = self._lock_fds + self._control_fds, []
        self._control_fds = []
        for fd in fds:
            os.close(fd)
        self._tls = threading.local()
        if os.getpid() == self._pid:
            self._unlink_own()
            sweep_stale_segments(self._dir, self._job)  # a dead peer's, which it could not remove
        # Mappings are not closed here: a tensor from torch.frombuffer keeps its mmap object
        # alive but not locked, so closing it would leave the caller's tensors dangling. Each
        # mapping goes away with the last tensor that uses it.
        self._buffers = {}


    def _unlink_own(self) -> None:
        """Remove this rank's segment names (peers keep their mappings); a forked child must not
        remove its parent's."""
        if os.getpid() == self._pid:
            for segment in self._own_segments:
                with contextlib.suppress(FileNotFoundError):
                    (self._dir / segment).unlink()


class _Held:
    """An OFD lock on a buffer's element range, acquired with backoff and a timeout."""

    def __init__(self, heap: ShmHeap, buf: _Buffer, peer: int, lo: int, hi: int, kind: int) -> None:
        self.fd = heap._lock_fd(peer)
        self.start, self.length = heap._lock_range(buf, lo, hi)
        self.kind = kind
        self.backoff = _Backoff(peer, f"lock on {buf.name!r} elements [{lo}, {hi})", heap.timeout_s)

    def __enter__(self) -> None:
        while not _lock_op(self.fd, self.kind, self.start, self.length):
            self.backoff.wait()

    def __exit__(self, *exc: object) -> None:
        _lock_op(self.fd, fcntl.F_UNLCK, self.start, self.length)
