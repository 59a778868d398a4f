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

    comp: (M, R, J, P) compute seconds; nmb: (M, R); tokens, samples: (M, R, J).
    """
    M, R, J, P = comp.shape
    offset = np.concatenate([[0.0], np.cumsum(tl.duration)[:-1]])
    has_mb = np.arange(J)[None, None, :] < nmb[:, :, None]

    # Unit compute spans.
    mask = has_mb[..., None] & layout.traced[None, None, None, :]
    m, r, j, p = np.nonzero(mask)
    t0 = offset[m] + tl.start[m, r, j, p]
    unit = layout.position_unit[p]
    parts = [dict(rank=r, minibatch=m, microbatch=j, kind=layout.position_phase[p], unit=unit, t0=t0,
                  t1=t0 + comp[m, r, j, p])]

    # Microbatches: forward plus backward, communication included.
    m, r, j = np.nonzero(has_mb)
    head_fwd = layout.units - 1
    mb0 = offset[m] + tl.mb_t0[m, r, j]
    fwd_end = offset[m] + tl.start[m, r, j, head_fwd] + comp[m, r, j, head_fwd]
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
