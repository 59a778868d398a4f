"""The two engines' timelines, computed for every minibatch at once.

Every minibatch begins with all ranks together (collective: the first all-gather is a
barrier; ODC: the parameters become visible after the optimizer step) and ends together,
so a minibatch's timeline relative to its own start does not depend on the ones before it.
The loops below therefore run over a microbatch's positions only, each step vectorised over
minibatches (and ranks).

Collective (FSDP2): every position is a barrier. Its compute starts on all ranks when the
slowest rank has finished the previous position (plus the serial overhead `pre`) and its
all-gather has arrived. All-gathers are prefetched one position ahead (issued when the
previous position starts) and reduce-scatters issued when a backward position ends; both
share one FIFO channel, as NCCL runs a process group's collectives in issue order. With
hybrid sharding each reduce-scatter (within the node) is followed by an all-reduce of the
unit's gradient shard across nodes, on a second FIFO channel (another process group). A
microbatch ends when its last reduce-scatter (and all-reduce) is done.

ODC: each rank runs alone: a position's compute waits only for its own previous compute and
its gather, prefetched one position ahead on the rank's own gather channel; pushes
(scatter-accumulate) run on a push channel after each backward position. Transfer times
depend on how many ranks are communicating at that moment (hardware.Network); which ranks
are still working is taken from the previous pass's finish times, starting from "all of
them", for a few fixed-point passes (contention.py). At the end of its microbatches a rank
waits until every rank's pushes have landed (one barrier), then (hybrid sharding) all-reduces
its shard's gradient across nodes, then steps the optimizer. With topology-aware fetch, a
gather takes its remote shards from a rank of its own node that holds the unit at that moment
(whose hold intervals come from the previous pass, as the counts do), when that is faster.

Compute comes per (unit kind, direction) column, `comp` (M, R, J, K), with `columns` (P,)
naming each position's column: every decoder layer costs the same, so the (M, R, J, P) array
is never built. Per-position start times, (M, R, J, P), are kept only when the trace needs
them (`record`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odc_bench.sim.contention import Contention, Holders
from odc_bench.sim.hardware import EngineCosts


@dataclass
class Timeline:
    """Times relative to each minibatch's start; shapes (M, R, J, P) (None unless recorded),
    (M, R, J), (M, R), (M,)."""

    start: np.ndarray | None
    mb_t0: np.ndarray
    mb_t1: np.ndarray
    sync_t0: np.ndarray
    sync_t1: np.ndarray
    opt_t1: np.ndarray
    duration: np.ndarray


def concatenated(parts: list[Timeline]) -> Timeline:
    """The timelines of consecutive runs of minibatches, as one (each field joined along M)."""
    start = None if any(p.start is None for p in parts) else np.concatenate([p.start for p in parts])
    return Timeline(start=start, **{f: np.concatenate([getattr(p, f) for p in parts])
                                    for f in ("mb_t0", "mb_t1", "sync_t0", "sync_t1", "opt_t1", "duration")})


def _columns(comp: np.ndarray, columns: np.ndarray | None) -> np.ndarray:
    return np.arange(comp.shape[3]) if columns is None else np.asarray(columns)


def collective(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, c: EngineCosts, *,
               columns: np.ndarray | None = None) -> Timeline:
    """comp: (M, R, J, K) compute seconds per column, position p reading columns[p] (default:
    one column per position); nmb: (M, R) microbatches per rank (equal across ranks);
    tokens: (M, R, J) per microbatch."""
    cols = _columns(comp, columns)
    M, R, J, _ = comp.shape
    P = cols.size
    D = comp.max(axis=1)
    most = tokens.max(axis=1)
    nj = nmb.max(axis=1)
    start = np.zeros((M, J, P))
    mb_t0, mb_t1 = np.zeros((M, J)), np.zeros((M, J))
    chan = np.zeros(M)
    t = np.zeros(M)
    ag_end = np.full(M, c.ag[0])  # the minibatch's first all-gather, issued at its start
    chan[:] = ag_end
    rs_done = np.zeros(M)
    ar_chan, ar_done = np.zeros(M), np.zeros(M)
    for j in range(J):
        act = j < nj
        begin = t + c.prep
        mb_t0[:, j] = begin
        prev_end = begin
        for p in range(P):
            b = np.maximum(prev_end + c.pre[p] + c.pre_tok[p] * most[:, j], ag_end)
            start[:, j, p] = b
            nxt_act = act if p + 1 < P else (j + 1 < nj)
            nxt_ag = c.ag[(p + 1) % P]
            if nxt_ag > 0:
                ag_end = np.maximum(b, chan) + nxt_ag
                chan = np.where(nxt_act, ag_end, chan)
            else:
                ag_end = np.zeros(M)
            e = b + D[:, j, cols[p]]
            if c.rs[p] > 0:
                rs_end = np.maximum(e, chan) + c.rs[p]
                chan = np.where(act, rs_end, chan)
                rs_done = np.where(act, rs_end, rs_done)
                if c.ar is not None and c.ar[p] > 0:
                    # The replicas' all-reduce runs on its own process group, in issue order.
                    ar_end = np.maximum(rs_end, ar_chan) + c.ar[p]
                    ar_chan = np.where(act, ar_end, ar_chan)
                    ar_done = np.where(act, ar_end, ar_done)
            prev_end = e
        end = np.maximum(prev_end, rs_done)
        if c.ar is not None:
            end = np.maximum(end, ar_done)
        end = end + c.tail + c.tail_tok * most[:, j]
        mb_t1[:, j] = end
        t = np.where(act, end, t)
    sync_t1 = t + c.sync_s
    opt_t1 = sync_t1 + c.optimizer_s
    rep = (M, R)
    return Timeline(start=np.broadcast_to(start[:, None], (M, R, J, P)),
                    mb_t0=np.broadcast_to(mb_t0[:, None], (M, R, J)),
                    mb_t1=np.broadcast_to(mb_t1[:, None], (M, R, J)),
                    sync_t0=np.broadcast_to(t[:, None], rep), sync_t1=np.broadcast_to(sync_t1[:, None], rep),
                    opt_t1=np.broadcast_to(opt_t1[:, None], rep), duration=opt_t1)


def odc(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, c: EngineCosts, passes: int = 3, *,
        columns: np.ndarray | None = None, record: bool = True) -> Timeline:
    """comp: (M, R, J, K) compute seconds per column (see `collective`); nmb: (M, R)
    microbatches per rank (may differ, may be 0); tokens: (M, R, J) per microbatch."""
    cols = _columns(comp, columns)
    finish = np.where(nmb > 0, np.inf, -np.inf)
    net = c.network
    # Within one node the counts never change a transfer (Network), so one pass is the fixed point.
    n = max(1, passes) if net is not None and (net.nodes > 1 or c.fetch_nearest) else 1
    holders = None
    for i in range(n):
        last = i == n - 1
        timeline, finish, held = _odc_pass(comp, cols, nmb, tokens, c, finish, holders,
                                           record=record and last, holds=c.fetch_nearest and not last)
        if held is not None:
            assert net is not None
            holders = Holders(net, *held, nmb)
    return timeline


def _odc_pass(comp: np.ndarray, cols: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, c: EngineCosts,
              finish: np.ndarray, holders: Holders | None, record: bool, holds: bool
              ) -> tuple[Timeline, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """One pass; with `holds` also when each rank held each position's unit (from its gather's
    end to its compute's end, (M, R, J, P) each), for the next pass's topology-aware fetch."""
    M, R, J, _ = comp.shape
    P = cols.size
    contention = Contention(c.network, finish) if c.network is not None else None
    units = np.concatenate([np.arange(P // 2), np.arange(P // 2)[::-1]])
    serial = bool(np.any(c.pre) or np.any(c.pre_tok))

    def transfer(nbytes: float, at: np.ndarray, needed: np.ndarray, from_peer: float | np.ndarray = 0.0
                 ) -> np.ndarray | float:
        if nbytes <= 0 or contention is None:
            return 0.0
        return contention.transfer(nbytes, at, from_peer, needed)

    start = np.zeros((M, R, J, P)) if record else None
    hold_s, hold_e = (np.zeros((M, R, J, P)), np.zeros((M, R, J, P))) if holds else (None, None)
    mb_t0, mb_t1 = np.zeros((M, R, J)), np.zeros((M, R, J))
    p_chan = np.zeros((M, R))
    t = np.full((M, R), c.barrier_s)  # parameters of the last optimizer step become visible
    g_end = t + transfer(c.gather_load[0], t, nmb > 0)
    g_chan = g_end.copy()
    peer = np.zeros((M, R), bool)  # whether the gather now arriving came from a rank of the node
    b, g_start = np.empty((M, R)), np.empty((M, R))
    for j in range(J):
        act = j < nmb
        more = j + 1 < nmb
        # Ranks past their last microbatch keep their channels: a select by a mask that mixes
        # them in at random mispredicts a branch per rank, so their values are put back by index.
        idle, idle_next = np.flatnonzero(~act), np.flatnonzero(~more)
        begin = t + c.prep
        mb_t0[:, :, j] = begin
        prev_end = begin
        tok = tokens[:, :, j]
        # Each column's compute of this microbatch, contiguous: read once per position.
        comp_j = np.ascontiguousarray(np.moveaxis(comp[:, :, j, :], 2, 0))
        for p in range(P):
            if serial:
                np.maximum(prev_end + c.pre[p] + c.pre_tok[p] * tok, g_end, out=b)
            else:
                np.maximum(prev_end, g_end, out=b)
            if start is not None:
                start[:, :, j, p] = b
            nxt_act = act if p + 1 < P else more
            np.maximum(b, g_chan, out=g_start)
            q = (p + 1) % P
            took = transfer(c.gather_load[q], g_start, nxt_act)
            was_peer = peer
            if holders is not None and c.gather_bytes is not None and c.gather_load[q] > 0:
                held = holders.held(int(units[q]), g_start)
                via_peer = transfer(c.gather_load[q], g_start, nxt_act, float(c.gather_bytes[q]))
                peer = held & (via_peer < took)
                took = np.where(peer, via_peer, took)
            g_end_next = g_start + took
            g_chan = _kept(g_end_next, g_chan, idle if p + 1 < P else idle_next)
            e = b + comp_j[cols[p]]
            if hold_s is not None and hold_e is not None:
                hold_s[:, :, j, p] = g_end
                hold_e[:, :, j, p] = e
            g_end = g_end_next
            if c.push_load[p] > 0:
                p_start = np.maximum(e, p_chan)
                gathered = 0.0 if holders is None or c.gather_bytes is None else np.where(
                    was_peer, c.gather_bytes[p], 0.0)
                p_chan = _kept(p_start + transfer(c.push_load[p], p_start, act, gathered), p_chan, idle)
            prev_end = e
        end = prev_end + c.tail + c.tail_tok * tok if c.tail or c.tail_tok else prev_end
        mb_t1[:, :, j] = end
        t = np.where(act, end, t)
    done = np.maximum(t, p_chan)
    sync_t1 = done.max(axis=1, keepdims=True) + c.barrier_s + c.sync_s
    sync_t1 = np.broadcast_to(sync_t1, (M, R))
    opt_t1 = sync_t1 + c.optimizer_s
    finish = np.where(nmb > 0, np.maximum(done, g_chan), -np.inf)
    timeline = Timeline(start=start, mb_t0=mb_t0, mb_t1=mb_t1, sync_t0=t, sync_t1=sync_t1, opt_t1=opt_t1,
                        duration=opt_t1[:, 0].copy())
    return timeline, finish, None if hold_s is None or hold_e is None else (hold_s, hold_e)


def _kept(new: np.ndarray, old: np.ndarray, idle: np.ndarray) -> np.ndarray:
    """np.where(working, new, old), the ranks not working listed (flat) in `idle`. Neither `new`
    nor the result (which may be `new` itself) is written in place afterwards."""
    if not idle.size:
        return new
    out = new.copy()
    out.ravel()[idle] = old.ravel()[idle]
    return out


def odc_alone(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, c: EngineCosts, *,
              columns: np.ndarray | None = None, record: bool = True) -> tuple[Timeline, np.ndarray]:
    """Every rank's ODC timeline of each minibatch as if it started at once (every rank with
    work counted as communicating), and when its last push lands (-inf without work): what the
    stale-synchronous timeline (stale.py) shifts to each rank's own start."""
    timeline, finish, _ = _odc_pass(comp, _columns(comp, columns), nmb, tokens, c, np.where(nmb > 0, np.inf, -np.inf),
                                    None, record=record, holds=False)
    return timeline, finish
