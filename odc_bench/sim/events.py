"""A simulated timeline as the same event trace real ranks write (results/README.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from odc_bench.sim.layout import Layout
from odc_bench.sim.timeline import Timeline

KIND_NAMES = ["fwd", "bwd", "microbatch", "sync", "optimizer", "minibatch"]
COLUMNS = ["rank", "minibatch", "microbatch", "kind", "unit", "t0", "t1", "fwd_s", "tokens", "samples", "loss_sum"]


def trace_frame(layout: Layout, tl: Timeline, comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray,
                samples: np.ndarray) -> pd.DataFrame:
    """Events of every rank; minibatch m starts when minibatch m-1 ends (at 0 for the first).

    comp: (M, R, J, K) compute seconds per (unit kind, direction), layout.position_cost_index
    naming each position's; nmb: (M, R); tokens, samples: (M, R, J). The timeline must have
    recorded its start times.
    """
    assert tl.start is not None, "the timeline was computed without start times (record=False)"
    column = layout.position_cost_index
    M, R, J, _ = comp.shape
    offset = np.concatenate([[0.0], np.cumsum(tl.duration)[:-1]])
    has_mb = np.arange(J)[None, None, :] < nmb[:, :, None]

    # Unit compute spans.
    mask = has_mb[..., None] & layout.traced[None, None, None, :]
    m, r, j, p = np.nonzero(mask)
    t0 = offset[m] + tl.start[m, r, j, p]
    unit = layout.position_unit[p]
    parts = [dict(rank=r, minibatch=m, microbatch=j, kind=layout.position_phase[p], unit=unit, t0=t0,
                  t1=t0 + comp[m, r, j, column[p]])]

    # Microbatches: forward plus backward, communication included.
    m, r, j = np.nonzero(has_mb)
    head_fwd = layout.units - 1
    mb0 = offset[m] + tl.mb_t0[m, r, j]
    fwd_end = offset[m] + tl.start[m, r, j, head_fwd] + comp[m, r, j, column[head_fwd]]
    parts.append(dict(rank=r, minibatch=m, microbatch=j, kind=2, t0=mb0, t1=offset[m] + tl.mb_t1[m, r, j],
                      fwd_s=fwd_end - mb0, tokens=tokens[m, r, j], samples=samples[m, r, j]))

    # Per rank and minibatch: the sync, the optimizer step, the whole minibatch.
    m, r = np.indices((M, R)).reshape(2, -1)
    minus1 = np.full(m.size, -1)
    sync0, sync1 = offset[m] + tl.sync_t0[m, r], offset[m] + tl.sync_t1[m, r]
    opt1 = offset[m] + tl.opt_t1[m, r]
    parts.append(dict(rank=r, minibatch=m, microbatch=minus1, kind=3, t0=sync0, t1=sync1))
    parts.append(dict(rank=r, minibatch=m, microbatch=minus1, kind=4, t0=sync1, t1=opt1))
    parts.append(dict(rank=r, minibatch=m, microbatch=minus1, kind=5, t0=offset[m], t1=opt1,
                      loss_sum=np.full(m.size, np.nan)))

    cols = {}
    for name in COLUMNS:
        chunks = []
        for part in parts:
            n = part["rank"].size
            if name in part:
                chunks.append(np.broadcast_to(np.asarray(part[name]), (n,)))
            elif name == "unit":
                chunks.append(np.full(n, -1))
            else:
                chunks.append(np.full(n, np.nan))
        cols[name] = np.concatenate(chunks)
    frame = pd.DataFrame(cols)
    frame["kind"] = pd.Categorical.from_codes(cols["kind"], KIND_NAMES)
    unit = cols["unit"]
    frame["unit"] = pd.Categorical.from_codes(np.where(unit < 0, len(layout.unit_names), unit),
                                              [*layout.unit_names, ""])
    return frame


def totals(layout: Layout, tl: Timeline, comp: np.ndarray, nmb: np.ndarray, warmup: int) -> dict[str, float]:
    """What metrics.summarize reads from the trace, straight from the timeline (no events):
    the measured window, and the busy, compute and sync seconds summed over ranks in it.

    A trace of R ranks holds R x J x P unit spans per minibatch; at thousands of ranks that is
    billions of rows, so runs without a trace file (backend.write_trace=false) summarise here,
    in O(M R J) (tests check it against the trace's summary).
    """
    M, R, J, K = comp.shape
    offset = np.concatenate([[0.0], np.cumsum(tl.duration)[:-1]])
    measured = slice(warmup, M)
    ends = offset[measured, None] + tl.opt_t1[measured]
    traced = np.bincount(layout.position_cost_index[layout.traced], minlength=K).astype(float)
    has_mb = np.arange(J)[None, None, :] < nmb[measured, :, None]
    compute = float((comp[measured] @ traced)[has_mb].sum())
    optimizer = float((tl.opt_t1[measured] - tl.sync_t1[measured]).sum())
    return dict(wall_s=float(ends.max() - offset[measured].min()), busy_s=compute + optimizer, compute_s=compute,
                sync_s=float((tl.sync_t1[measured] - tl.sync_t0[measured]).sum()))
