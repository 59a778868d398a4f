"""Stale-synchronous ODC's timeline (engine.staleness=s >= 1): ranks run apart, bounded by versions.

Within a minibatch a rank runs exactly as under synchronous ODC (timeline.odc_alone: its
compute, gathers and pushes, every rank with work counted as communicating, since without
a barrier ranks rarely idle together). What changes is when its minibatches start:

- rank r starts minibatch k when it has left k - 1 (its pushes of k - 1 landed) and, if it
  has work in k, once version max(0, k - s) is visible; a rank without work passes through;
- step k starts on the owners when every rank's pushes of minibatch k have landed (plus the
  flag's latency, barrier_s, and the sync cost), after step k - 1, and takes optimizer_s; the
  version it makes is visible barrier_s later. The step runs beside the owner's compute and
  does not slow it (on a CPU rank it shares the core: a few milliseconds per step for the
  tiny model);
- the run ends when the last step's version is visible (the worker's drain).

The trace has the real engine's events: the sync span of a minibatch is the rank's wait for
its own pushes (the last one's also the drain), its optimizer span is its server's step,
its minibatch span runs from when it left the previous minibatch to when it left this one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from odc_bench.sim.events import trace_frame
from odc_bench.sim.hardware import EngineCosts
from odc_bench.sim.layout import Layout
from odc_bench.sim.timeline import Timeline, odc_alone


@dataclass
class StaleTimeline:
    """Absolute times. timeline: the per-microbatch spans (its `duration` is zero: every time is
    already absolute); left: (M, R) when each rank left each minibatch; step: (M, 2) each step's
    start and end; visible: (M + 1,) when each version became visible (version 0 at 0)."""

    timeline: Timeline
    left: np.ndarray
    step: np.ndarray
    visible: np.ndarray

    @property
    def duration(self) -> float:
        return float(self.visible[-1])


def stale_odc(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, c: EngineCosts, staleness: int, *,
              columns: np.ndarray | None = None, record: bool = True) -> StaleTimeline:
    """comp: (M, R, J, K) compute seconds per column (timeline.collective); nmb: (M, R)
    microbatches per rank; tokens: (M, R, J). Without `record` the timeline has no start times."""
    if staleness < 1:
        raise ValueError(f"the stale timeline is for staleness >= 1, got {staleness}; timeline.odc is s = 0")
    alone, pushed = odc_alone(comp, nmb, tokens, c, columns=columns, record=record)
    M, R = nmb.shape
    busy = nmb > 0
    # The synchronous pass starts every rank at barrier_s (the parameters becoming visible).
    work = np.where(busy, pushed - c.barrier_s, 0.0)
    begin, left = np.zeros((M, R)), np.zeros((M, R))
    step, visible = np.zeros((M, 2)), np.zeros(M + 1)
    free = np.zeros(R)
    for k in range(M):
        begin[k] = np.where(busy[k], np.maximum(free, visible[max(0, k - staleness)]), free)
        free = begin[k] + work[k]
        left[k] = free
        step[k, 0] = max(free.max() + c.barrier_s + c.sync_s, step[k - 1, 1] if k else 0.0)
        step[k, 1] = step[k, 0] + c.optimizer_s
        visible[k + 1] = step[k, 1] + c.barrier_s
    shift = (begin - c.barrier_s)[..., None]
    sync_t0 = np.where(busy, alone.sync_t0 - c.barrier_s + begin, left)
    sync_t1 = left.copy()
    sync_t1[-1] = visible[-1]  # the last minibatch's wait includes the drain
    start = None if alone.start is None else alone.start + shift[..., None]
    tl = Timeline(start=start, mb_t0=alone.mb_t0 + shift, mb_t1=alone.mb_t1 + shift,
                  sync_t0=sync_t0, sync_t1=sync_t1, opt_t1=sync_t1, duration=np.zeros(M))
    return StaleTimeline(tl, left, step, visible)


def stale_trace(layout: Layout, st: StaleTimeline, comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray,
                samples: np.ndarray) -> pd.DataFrame:
    """The events real ranks write, from a stale timeline."""
    frame = trace_frame(layout, st.timeline, comp, nmb, tokens, samples)
    M, R = nmb.shape
    # trace_frame writes the per-(minibatch, rank) events minibatch by minibatch, ranks inside.
    m, r = np.indices((M, R)).reshape(2, -1)
    optimizer = (frame["kind"] == "optimizer").to_numpy()
    frame.loc[optimizer, "t0"], frame.loc[optimizer, "t1"] = st.step[m, 0], st.step[m, 1]
    spans = (frame["kind"] == "minibatch").to_numpy()
    entered = np.concatenate([np.zeros((1, R)), st.left[:-1]])
    ended = st.left.copy()
    ended[-1] = st.visible[-1]
    frame.loc[spans, "t0"], frame.loc[spans, "t1"] = entered[m, r], ended[m, r]
    return frame


def stale_totals(layout: Layout, st: StaleTimeline, comp: np.ndarray, nmb: np.ndarray, warmup: int
                 ) -> dict[str, float]:
    """events.totals for a stale timeline: what stale_trace's summary reads, without the trace."""
    M, R, J, K = comp.shape
    measured = slice(warmup, M)
    entered = np.concatenate([np.zeros((1, R)), st.left[:-1]])
    ended = st.left.copy()
    ended[-1] = st.visible[-1]
    traced = np.bincount(layout.position_cost_index[layout.traced], minlength=K).astype(float)
    has_mb = np.arange(J)[None, None, :] < nmb[measured, :, None]
    compute = float((comp[measured] @ traced)[has_mb].sum())
    # Every rank's trace carries its server's step of each minibatch (stale_trace).
    optimizer = R * float((st.step[measured, 1] - st.step[measured, 0]).sum())
    tl = st.timeline
    return dict(wall_s=float(ended[measured].max() - entered[measured].min()), busy_s=compute + optimizer,
                compute_s=compute, sync_s=float((tl.sync_t1[measured] - tl.sync_t0[measured]).sum()))
