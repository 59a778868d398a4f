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
share one FIFO channel, as NCCL runs a process group's collectives in issue order. A
microbatch ends when its last reduce-scatter is done.

ODC: each rank runs alone: a position's compute waits only for its own previous compute and
its gather, prefetched one position ahead on the rank's own gather channel; pushes
(scatter-accumulate) run on a push channel after each backward position. Transfer times
depend on how many ranks are communicating at that moment (hardware.Network); which ranks
are still working is taken from the previous pass's finish times, starting from "all of
them", for a few fixed-point passes. At the end of its microbatches a rank waits until every
rank's pushes have landed (one barrier), then steps the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odc_bench.sim.hardware import EngineCosts, Network


@dataclass
class Timeline:
    """Times relative to each minibatch's start; shapes (M, R, J, P), (M, R, J), (M, R), (M,)."""

    start: np.ndarray
    mb_t0: np.ndarray
    mb_t1: np.ndarray
    sync_t0: np.ndarray
    sync_t1: np.ndarray
    opt_t1: np.ndarray
    duration: np.ndarray


def collective(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, c: EngineCosts) -> Timeline:
    """comp: (M, R, J, P) compute seconds; nmb: (M, R) microbatches per rank (equal across ranks);
    tokens: (M, R, J) per microbatch."""
    M, R, J, P = comp.shape
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
            e = b + D[:, j, p]
            if c.rs[p] > 0:
                rs_end = np.maximum(e, chan) + c.rs[p]
                chan = np.where(act, rs_end, chan)
                rs_done = np.where(act, rs_end, rs_done)
            prev_end = e
        end = np.maximum(prev_end, rs_done) + c.tail + c.tail_tok * most[:, j]
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


class _Contention:
    """Counts of ranks still working at given times, from a previous pass's finish times.

    The counts are step functions of time with one step per rank finishing, so they are
    tabulated once per pass (per minibatch: active ranks per node after k ranks finished) and
    looked up with one sorted search per batch of queries. Within one node the owners' links
    never limit a symmetric gather (see hardware.Network), so only multi-node runs count.
    """

    def __init__(self, net: Network, finish: np.ndarray) -> None:
        M, R = finish.shape
        self.net, self.node = net, net.node_of()
        finite = finish[np.isfinite(finish)]
        # Queries are clipped to just past the last finite finish, so that ranks without a
        # finish time yet (the first pass) stay active, and ranks without work (finished
        # "before time 0") never count; rows of the flat search keys then never overlap.
        self.horizon = float(finite.max()) if finite.size else 0.0
        f = np.where(finish == -np.inf, -1.0, np.where(finish == np.inf, self.horizon + 1.0, finish))
        self.finish = f
        self.stride = self.horizon + 3.0
        order = np.argsort(f, axis=1)
        self.keys = (np.take_along_axis(f, order, 1) + self.stride * np.arange(M)[:, None]).ravel()
        onehot = np.eye(net.nodes, dtype=np.int64)[self.node[order]]  # (M, R, nodes)
        done = np.concatenate([np.zeros((M, 1, net.nodes), np.int64), np.cumsum(onehot, 1)], 1)
        active = (net.gpus_per_node - done).reshape(M * (R + 1), net.nodes)  # after k ranks finished
        self.active, self.total = active, active.sum(1)
        ranked = np.sort(active, axis=1)
        self.min1, self.min2 = ranked[:, 0], ranked[:, min(1, net.nodes - 1)]
        self.argmin1 = np.argmin(active, axis=1)

    def transfer(self, nbytes: float, at: np.ndarray) -> np.ndarray:
        if self.net.nodes == 1:
            one = np.ones(at.shape)
            return self.net.transfer_time(nbytes, one, one, one)
        M, R = at.shape
        m = np.arange(M)[:, None]
        query = np.minimum(at, self.horizon + 0.5) + self.stride * m
        k = np.searchsorted(self.keys, query.ravel(), side="right").reshape(M, R) - m * R
        row = m * (R + 1) + k
        # A rank is busy at its own transfer even if the previous pass had it finish earlier.
        self_done = self.finish <= at
        k_loc = self.active[row, self.node[None, :]] + self_done
        k_tot = self.total[row] + self_done
        k_min_remote = np.where(self.argmin1[row] == self.node[None, :], self.min2[row], self.min1[row])
        return self.net.transfer_time(nbytes, k_loc, k_tot, k_min_remote)


def odc(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, c: EngineCosts, passes: int = 3) -> Timeline:
    """comp: (M, R, J, P) compute seconds; nmb: (M, R) microbatches per rank (may differ, may be 0);
    tokens: (M, R, J) per microbatch."""
    finish = np.where(nmb > 0, np.inf, -np.inf)
    timeline, finish = _odc_pass(comp, nmb, tokens, c, finish)
    for _ in range(max(1, passes) - 1 if c.network is not None else 0):
        timeline, finish = _odc_pass(comp, nmb, tokens, c, finish)
    return timeline


def _odc_pass(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, c: EngineCosts,
              finish: np.ndarray) -> tuple[Timeline, np.ndarray]:
    M, R, J, P = comp.shape
    contention = _Contention(c.network, finish) if c.network is not None else None

    def transfer(nbytes: float, at: np.ndarray) -> np.ndarray | float:
        if nbytes <= 0 or contention is None:
            return 0.0
        return contention.transfer(nbytes, at)

    start = np.zeros((M, R, J, P))
    mb_t0, mb_t1 = np.zeros((M, R, J)), np.zeros((M, R, J))
    g_chan, p_chan = np.zeros((M, R)), np.zeros((M, R))
    t = np.full((M, R), c.barrier_s)  # parameters of the last optimizer step become visible
    g_end = t + transfer(c.gather_load[0], t)
    g_chan[:] = g_end
    for j in range(J):
        act = j < nmb
        begin = t + c.prep
        mb_t0[:, :, j] = begin
        prev_end = begin
        for p in range(P):
            b = np.maximum(prev_end + c.pre[p] + c.pre_tok[p] * tokens[:, :, j], g_end)
            start[:, :, j, p] = b
            nxt_act = act if p + 1 < P else (j + 1 < nmb)
            g_start = np.maximum(b, g_chan)
            g_end = g_start + transfer(c.gather_load[(p + 1) % P], g_start)
            g_chan = np.where(nxt_act, g_end, g_chan)
            e = b + comp[:, :, j, p]
            if c.push_load[p] > 0:
                p_start = np.maximum(e, p_chan)
                p_chan = np.where(act, p_start + transfer(c.push_load[p], p_start), p_chan)
            prev_end = e
        end = prev_end + c.tail + c.tail_tok * tokens[:, :, j]
        mb_t1[:, :, j] = end
        t = np.where(act, end, t)
    done = np.maximum(t, p_chan)
    sync_t1 = done.max(axis=1, keepdims=True) + c.barrier_s + c.sync_s
    sync_t1 = np.broadcast_to(sync_t1, (M, R))
    opt_t1 = sync_t1 + c.optimizer_s
    finish = np.where(nmb > 0, np.maximum(done, g_chan), -np.inf)
    return Timeline(start=start, mb_t0=mb_t0, mb_t1=mb_t1, sync_t0=t, sync_t1=sync_t1, opt_t1=opt_t1,
                    duration=opt_t1[:, 0].copy()), finish


def odc_alone(comp: np.ndarray, nmb: np.ndarray, tokens: np.ndarray, c: EngineCosts) -> tuple[Timeline, np.ndarray]:
    """Every rank's ODC timeline of each minibatch as if it started at once (every rank with
    work counted as communicating), and when its last push lands (-inf without work): what the
    stale-synchronous timeline (stale.py) shifts to each rank's own start."""
    return _odc_pass(comp, nmb, tokens, c, np.where(nmb > 0, np.inf, -np.inf))
