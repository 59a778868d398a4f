"""Per-rank event trace with one monotonic clock per host, and device time on CUDA.

On CPU a span's ends are perf_counter readings. On CUDA they are events recorded on the stream
that runs the work (the compute stream), so a span is the time the device spent between them,
not the host's time launching it (the host runs ahead of the device); `resolve()`, once per
minibatch, waits for the device and turns every event into seconds on the host's clock, from
an anchor event recorded when the device was idle. No span synchronises the device.

Compute is timed at each unit's boundaries by module hooks that `instrument` attaches after
the engine has wrapped the model, so that every engine's communication falls outside:
- forward opens after the engine's pre-forward hooks (gathers are done) and closes in a
  forward hook placed before the engine's (before it reshards);
- backward opens in a hook on the unit's output registered after the engine's own (its
  pre-backward gather runs first) and closes in an identity autograd function on the unit's
  input, which runs before the engine's post-backward work (pushes, reduce-scatters) on that
  input.
The output itself is left as the unit made it: FSDP2 refuses to hook a view reliably, so no
marker wraps it. The spans measure pure compute whichever engine wraps the model.

A checkpointed unit's forward runs again inside its backward span (activation checkpointing,
models/checkpointing.py): that recomputation is part of its backward, as the simulator charges
it, so it opens no forward span of its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def now() -> float:
    return time.perf_counter()


class DeviceClock(Protocol):
    """Marks on a device's stream, read later: what a CUDA trace is timed with."""

    def mark(self) -> Any:
        """A mark at this point of the current stream."""
        ...

    def synchronize(self) -> None:
        """Wait until every mark taken so far has been reached."""
        ...

    def elapsed_ms(self, start: Any, end: Any) -> float:
        ...


class CudaClock:
    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def elapsed_ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end)


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
    (the owner adds its own segments explicitly, its engine's heap_bytes, so each segment
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
    baseline_bytes: int = 0
    peak_bytes: int = 0
    # Units are timed only while this is set (the worker's measured loop).
    enabled: bool = False
    # A minibatch under torch.profiler (run/profile.py): its host memory is not the run's.
    profiling: bool = False
    # Per unit: whether its current forward's input carries a gradient (its backward is timed).
    timed_backward: dict[str, bool] = field(default_factory=dict)
    _open: dict[tuple[str, str], Any] = field(default_factory=dict)
    _cuda: bool = False
    # A device's clock (CUDA), the events whose marks it has not resolved yet, and its anchor:
    # host seconds and a mark taken together while the device was idle.
    _device: DeviceClock | None = None
    _pending: list[dict] = field(default_factory=list)
    _anchor: tuple[float, Any] | None = None

    def start(self, cuda: bool = False, device: DeviceClock | None = None) -> None:
        """Begin recording: on CUDA (`cuda`), memory from the device and spans from `device`
        (a CudaClock unless given)."""
        self._cuda = cuda
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            self.baseline_bytes = torch.cuda.memory_allocated()
            device = device or CudaClock()
        else:
            self.baseline_bytes = heap_in_use_bytes()
        self._device = device
        if device is not None:
            self._anchor = self._new_anchor(device)
        self.peak_bytes = 0

    def now(self) -> Any:
        """A mark of this rank's clock: host seconds, or a mark on the device's current stream."""
        return self._device.mark() if self._device is not None else now()

    @staticmethod
    def _new_anchor(device: DeviceClock) -> tuple[float, Any]:
        device.synchronize()
        return now(), device.mark()

    def resolve(self) -> None:
        """Turn every pending event's marks into host seconds (nothing to do on the host clock):
        one wait for the device per call, then a fresh anchor, so the clocks cannot drift apart."""
        if self._device is None or not self._pending:
            return
        assert self._anchor is not None
        device, (host, anchor) = self._device, self._anchor
        device.synchronize()

        def seconds(m: Any) -> float:
            return host + device.elapsed_ms(anchor, m) / 1e3

        for event in self._pending:
            t0, t1 = seconds(event.pop("t0")), seconds(event.pop("t1"))
            fwd_end = event.pop("fwd_end", None)
            self.events.append(self._event(event, t0, t1, None if fwd_end is None else seconds(fwd_end) - t0))
        self._pending = []
        self._anchor = self._new_anchor(device)

    def sample_memory(self) -> None:
        if self.profiling and not self._cuda:
            return  # the profiler's records live in the host's heap too
        if self._cuda:
            used = torch.cuda.max_memory_allocated() - self.baseline_bytes
        else:
            used = heap_in_use_bytes() - self.baseline_bytes
        self.peak_bytes = max(self.peak_bytes, used)

    def add(self, kind: str, t0: Any, t1: Any, unit: str = "", fwd_end: Any = None, **extra: object) -> None:
        """One event between two marks of now(); `fwd_end` (a mark) gives it the seconds from t0
        to it as fwd_s (a microbatch's forward); `extra` may name its minibatch and microbatch,
        for events an engine reports later (a stale-synchronous owner's step of an earlier one)."""
        where = {"rank": self.rank, "minibatch": self.minibatch, "microbatch": self.microbatch, "kind": kind,
                 "unit": unit, **extra}
        if self._device is not None:
            self._pending.append({**where, "t0": t0, "t1": t1, "fwd_end": fwd_end})
            return
        self.events.append(self._event(where, t0, t1, None if fwd_end is None else fwd_end - t0))

    @staticmethod
    def _event(where: dict, t0: float, t1: float, fwd_s: float | None) -> dict:
        """An event's columns in the trace's order (sim/events.py COLUMNS): who and what, its
        times, a microbatch's forward seconds, then the rest."""
        head = {k: where.pop(k) for k in ("rank", "minibatch", "microbatch", "kind", "unit")}
        return {**head, "t0": t0, "t1": t1, **({} if fwd_s is None else {"fwd_s": fwd_s}), **where}

    def open(self, unit: str, phase: str) -> None:
        self._open[(unit, phase)] = self.now()
        self._sample_at_unit()

    def in_backward(self, unit: str) -> bool:
        return (unit, "bwd") in self._open

    def close(self, unit: str, phase: str) -> None:
        t0 = self._open.pop((unit, phase), None)
        if t0 is not None:
            self.add(phase, t0, self.now(), unit=unit)
        self._sample_at_unit()

    def _sample_at_unit(self) -> None:
        # On CPU the heap's peak is only seen by sampling it. CUDA's allocator keeps its own
        # high-water mark, which the minibatch's sample (worker) reads: reading it at every unit
        # would add nothing to the peak and cost host time on the launch path, as
        # max_memory_allocated builds and sorts every allocator statistic in Python.
        if not self._cuda:
            self.sample_memory()


class _Start(torch.autograd.Function):
    """On a unit's input: backward closes the unit's backward span."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, recorder: Recorder, unit: str) -> torch.Tensor:
        ctx.recorder, ctx.unit = recorder, unit
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.recorder.enabled:
            ctx.recorder.close(ctx.unit, "bwd")
        return grad, None, None


def instrument(recorder: Recorder, named_units: Sequence[tuple[str, nn.Module]]) -> list[RemovableHandle]:
    """Time every unit's forward and backward compute into `recorder` (after the engine wrapped it).

    A unit whose input carries no gradient (the embeddings take token ids) has its forward
    timed only: its backward runs after the last marker of the microbatch's backward.
    """
    handles = []
    for name, module in named_units:
        handles.append(module.register_forward_pre_hook(partial(_before_unit, recorder, name)))
        handles.append(module.register_forward_hook(partial(_forward_done, recorder, name), prepend=True))
        handles.append(module.register_forward_hook(partial(_mark_backward_start, recorder, name)))
    return handles


def _before_unit(recorder: Recorder, unit: str, _module: nn.Module, args: tuple) -> tuple | None:
    if not recorder.enabled:
        return None
    if recorder.in_backward(unit):  # recomputed for its backward, whose span is open
        return None
    recorder.open(unit, "fwd")
    x = args[0] if args else None
    timed_backward = torch.is_tensor(x) and x.requires_grad
    recorder.timed_backward[unit] = timed_backward
    return (_Start.apply(x, recorder, unit), *args[1:]) if timed_backward else None


def _forward_done(recorder: Recorder, unit: str, _module: nn.Module, _args: tuple, _output: object) -> None:
    # A recomputation may stop before its end (torch's checkpoint stops once it has what
    # backward needs), so no hook of it may leave state for the next forward to find.
    if recorder.enabled and not recorder.in_backward(unit):
        recorder.close(unit, "fwd")


def _mark_backward_start(recorder: Recorder, unit: str, _module: nn.Module, _args: tuple, output: object) -> None:
    if (recorder.enabled and not recorder.in_backward(unit) and recorder.timed_backward.get(unit)
            and torch.is_tensor(output) and output.requires_grad):
        output.register_hook(partial(_backward_starts, recorder, unit))


def _backward_starts(recorder: Recorder, unit: str, grad: torch.Tensor) -> None:
    if recorder.enabled:
        recorder.open(unit, "bwd")
