"""The trace's device clock, on CPU: a device whose marks get their times only when it is
synchronised stands in for CUDA events, so that what a GPU run's trace does with them (defer,
resolve once per minibatch against an anchor, the engine's spans on the same clock) is checked
here; tests/integration/test_gpu.py checks the same on a real GPU."""

from __future__ import annotations

import uuid

import pytest
import torch
from torch import nn

from odc_bench.run.trace import Recorder, instrument
from odc_core.engine.base import EngineContext
from odc_core.engine.odc import build
from odc_core.engine.registry import OdcOptions


class LaggingDevice:
    """Marks a queue of work: each mark's device time is known only after synchronize(), and the
    device runs `lag` seconds behind the host plus `work` seconds per mark (it is busy)."""

    def __init__(self, lag: float = 5.0, work: float = 0.25) -> None:
        self.lag, self.work = lag, work
        self.taken = 0
        self.unsynced: list[dict] = []
        self.syncs = 0

    def mark(self) -> dict:
        self.taken += 1
        m = {"n": self.taken, "at": None}
        self.unsynced.append(m)
        return m

    def synchronize(self) -> None:
        self.syncs += 1
        for m in self.unsynced:
            m["at"] = self.lag + self.work * m["n"]
        self.unsynced = []

    def elapsed_ms(self, start: dict, end: dict) -> float:
        assert start["at"] is not None and end["at"] is not None, "read before the device reached it"
        return (end["at"] - start["at"]) * 1e3


def test_device_spans_wait_for_resolve_and_measure_device_time():
    device = LaggingDevice()
    recorder = Recorder(rank=0)
    recorder.start(device=device)
    host, anchor = recorder._anchor
    t0 = recorder.now()
    fwd = recorder.now()
    recorder.add("microbatch", t0, recorder.now(), fwd_end=fwd, tokens=7)
    assert recorder.events == [], "nothing is read from the device before resolve()"
    syncs = device.syncs
    recorder.resolve()
    assert device.syncs == syncs + 2, "one wait for the spans, one for the new anchor"
    (event,) = recorder.events
    # Marks 2, 3 and 4 after the anchor (mark 1): device seconds from the anchor, on the host's clock.
    assert event["t0"] == pytest.approx(host + 0.25)
    assert event["t1"] == pytest.approx(host + 0.75)
    assert event["fwd_s"] == pytest.approx(0.25)
    assert "fwd_end" not in event and event["tokens"] == 7
    recorder.resolve()  # nothing pending: no wait
    assert device.syncs == syncs + 2


def test_host_clock_records_at_once():
    recorder = Recorder(rank=3)
    recorder.start()
    t0 = recorder.now()
    assert isinstance(t0, float)
    recorder.add("gc", t0, t0 + 2.0, fwd_end=t0 + 0.5)
    assert recorder.events[0]["t1"] - recorder.events[0]["t0"] == 2.0
    assert recorder.events[0]["fwd_s"] == 0.5


def test_units_and_the_engine_report_spans_on_the_device_clock(one_rank_group):
    """Unit compute, the engine's gathers, pushes, sync and optimizer step are all marked by the
    recorder's clock and resolved once per minibatch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    engine = build(EngineContext(torch.device("cpu"), one_rank_group, uuid.uuid4().hex[:8], 30.0, "fp32"),
                   OdcOptions(transport="shm", prefetch=False))
    device = LaggingDevice()
    recorder = Recorder(rank=0)
    try:
        units = [model[0], model[2]]
        engine.wrap(model, units)
        instrument(recorder, [("a", units[0]), ("b", units[1])])
        engine.configure_optimizer(lambda params: torch.optim.SGD(params, lr=0.1))
        recorder.start(device=device)
        engine.trace, engine.clock = recorder.add, recorder.now
        recorder.enabled = True
        for k in range(2):
            recorder.minibatch = k
            engine.begin_minibatch()
            model(torch.randn(3, 4)).sum().backward()
            engine.finish_minibatch()
            assert recorder.events == [], "resolved only at the minibatch's end"
            recorder.resolve()
            kinds = {e["kind"] for e in recorder.events if e["minibatch"] == k}
            assert {"fwd", "bwd", "gather", "push", "sync", "optimizer"} <= kinds
            recorder.events.clear()
    finally:
        engine.close()


def test_on_cuda_the_peak_is_read_once_per_minibatch_not_at_every_unit(monkeypatch):
    """CUDA's allocator keeps its own high-water mark: the units' marks leave it alone (reading it
    costs host time on the launch path) and the minibatch's sample still sees the peak."""
    allocator = {"reads": 0, "peak": 100}

    def max_memory_allocated() -> int:
        allocator["reads"] += 1
        return allocator["peak"]

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", max_memory_allocated)
    recorder = Recorder(rank=0)
    recorder.start(cuda=True, device=LaggingDevice())
    for unit, peak in (("layer0", 700), ("layer1", 400)):
        recorder.open(unit, "fwd")
        allocator["peak"] = max(allocator["peak"], peak)
        recorder.close(unit, "fwd")
    assert allocator["reads"] == 0
    recorder.sample_memory()  # the worker's, at the minibatch's end
    assert (allocator["reads"], recorder.peak_bytes) == (1, 600)
