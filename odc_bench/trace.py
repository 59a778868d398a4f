"""Per-rank event trace with one monotonic clock per host.

Compute is timed at unit boundaries *inside* each unit's forward: engine hooks (all-gather,
on-demand gather, reduce-scatter, gradient push) run outside those boundaries, so the spans
measure the same thing, pure compute, whichever engine wraps the model. In backward the
same markers fire in reverse: the unit's end marker opens its backward span and its start
marker closes it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from dataclasses import dataclass, field

import torch


def now() -> float:
    return time.perf_counter()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_mallinfo2 = getattr(_libc, "mallinfo2", None)
if _mallinfo2 is not None:
    _mallinfo2.restype = _MallInfo2


def heap_in_use_bytes() -> int:
    """Bytes malloc has handed out and not taken back: CPU tensors live here.

    Unlike resident-set numbers this ignores pages shared copy-on-write with the forkserver,
    memory malloc keeps cached after a free, and shared-memory segments mapped from peers
    (the owner adds its own segment explicitly, see Recorder.heap_bytes, so each segment
    counts once). Needs glibc >= 2.33.
    """
    if _mallinfo2 is None:
        raise RuntimeError("peak memory on CPU needs glibc's mallinfo2 (glibc >= 2.33)")
    info = _mallinfo2()
    return info.uordblks + info.hblkhd


@dataclass
class Recorder:
    rank: int
    events: list[dict] = field(default_factory=list)
    minibatch: int = -1
    microbatch: int = -1
    heap_bytes: int = 0
    baseline_bytes: int = 0
    peak_bytes: int = 0
    _open: dict[tuple[str, str], float] = field(default_factory=dict)
    _cuda: bool = False

    def start(self, cuda: bool = False) -> None:
        self._cuda = cuda
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            self.baseline_bytes = torch.cuda.memory_allocated()
        else:
            self.baseline_bytes = heap_in_use_bytes()
        self.peak_bytes = 0

    def sample_memory(self) -> None:
        if self._cuda:
            used = torch.cuda.max_memory_allocated() - self.baseline_bytes
        else:
            used = heap_in_use_bytes() - self.baseline_bytes
        self.peak_bytes = max(self.peak_bytes, used)

    def add(self, kind: str, t0: float, t1: float, unit: str = "", **extra: object) -> None:
        self.events.append(
            dict(rank=self.rank, minibatch=self.minibatch, microbatch=self.microbatch,
                 kind=kind, unit=unit, t0=t0, t1=t1, **extra)
        )

    def open(self, unit: str, phase: str) -> None:
        self._open[(unit, phase)] = now()
        self.sample_memory()

    def close(self, unit: str, phase: str) -> None:
        t0 = self._open.pop((unit, phase), None)
        if t0 is not None:
            self.add(phase, t0, now(), unit=unit)
        self.sample_memory()


_active: Recorder | None = None


def activate(recorder: Recorder | None) -> None:
    global _active
    _active = recorder


def active() -> Recorder | None:
    return _active


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, unit: str) -> torch.Tensor:
        ctx.unit = unit
        if _active is not None:
            _active.open(unit, "fwd")
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if _active is not None:
            _active.close(ctx.unit, "bwd")
        return grad, None


class _End(torch.autograd.Function):
    """Computes the unit's last op, `x + delta`, so its output is a fresh tensor, not a view
    (an engine may hook the unit's output for its pre-backward communication)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, delta: torch.Tensor, unit: str) -> torch.Tensor:
        ctx.unit = unit
        out = x + delta
        if _active is not None:
            _active.close(unit, "fwd")
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if _active is not None:
            _active.open(ctx.unit, "bwd")
        return grad, grad, None


def unit_start(x: torch.Tensor, unit: str) -> torch.Tensor:
    """Mark the start of a unit's compute; a no-op when no recorder is active."""
    if _active is None:
        return x
    if x.requires_grad:
        return _Start.apply(x, unit)
    _active.open(unit, "fwd")
    return x


def forward_done(unit: str) -> None:
    """Close a forward span opened on an input that carries no gradient (token ids)."""
    if _active is not None:
        _active.close(unit, "fwd")


def unit_end(x: torch.Tensor, delta: torch.Tensor, unit: str) -> torch.Tensor:
    """Return `x + delta` and mark the end of a unit's compute."""
    if _active is None:
        return x + delta
    return _End.apply(x, delta, unit)
