"""How many ranks share the network at a moment of an ODC minibatch, from a previous pass.

The ODC timeline (timeline.py) is a fixed point: each pass times transfers by the ranks still
working at that moment according to the pass before (all of them in the first). Those counts
are step functions of time with one step per rank finishing, so a pass tabulates them once per
minibatch and each batch of transfers looks them up with one sorted search: O(M R log R) to
build and O(M R (log R + g)) per lookup for M minibatches, R ranks and g ranks per node (the
counts of a rank's own node and rail are summed over its node's ranks directly), whatever the
node count; lookups before a minibatch's first rank finishes need no search.

Every search compares a minibatch's values with its own queries, in seconds from its own
start, and nothing else: a minibatch's counts are those of simulating it alone, to the bit, so
the minibatches of a run can be simulated in any grouping (sim/__init__.py splits a large run's
between processes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odc_bench.sim.hardware import Network


class Contention:
    """Active-rank counts at given times, from each rank's finish time in the previous pass.

    finish: (M, R) seconds from the minibatch's start; +inf where not known yet (a rank with
    work in the first pass: active throughout), -inf for a rank without work (never active).
    """

    def __init__(self, net: Network, finish: np.ndarray) -> None:
        M, R = finish.shape
        self.net, self.shape = net, (M, R)
        if net.nodes == 1:
            return
        g = net.gpus_per_node
        finite = finish[np.isfinite(finish)]
        # Queries are clipped to just past the last finite finish, so that ranks without a
        # finish time yet stay active, and ranks without work (finished "before time 0")
        # never count. The horizon is the run's, but only orders a minibatch's finishes and
        # queries as its own values do, so no count depends on another minibatch.
        self.horizon = float(finite.max()) if finite.size else 0.0
        f = np.where(finish == -np.inf, -1.0, np.where(finish == np.inf, self.horizon + 1.0, finish))
        self.finish = f
        order = np.argsort(f, axis=1)
        self.keys = _SortedRows(np.take_along_axis(f, order, 1))
        rank = np.arange(R)
        local = rank % g
        self.node_group = (np.arange(M)[:, None] * net.nodes + rank // g).ravel()  # (M * R,): group of node_finish
        self.node_finish = _Groups(f.reshape(M * net.nodes, g))
        per_rail = g // net.rails
        self.rail_group = self.node_group * net.rails + np.tile(local % net.rails, M)
        on_rail = np.swapaxes(f.reshape(M, net.nodes, per_rail, net.rails), 2, 3)
        self.rail_finish = _Groups(on_rail.reshape(-1, per_rail))
        # The most finished ranks in any node, and in any node but that one, after k ranks have
        # finished (k = 0..R): each finish raises its node's count by one, to its rank among
        # the node's finishes (`occ`); the largest count so far is a running maximum of occ,
        # the second largest (another node's) a running maximum of the occ values that a
        # second node has reached.
        node = net.node_of()[order]
        by_node = np.argsort(node, axis=1, kind="stable")
        sorted_node = np.take_along_axis(node, by_node, 1)
        first = np.concatenate([np.ones((M, 1), bool), sorted_node[:, 1:] != sorted_node[:, :-1]], axis=1)
        occ = np.empty((M, R), np.int64)
        np.put_along_axis(occ, by_node, _rank_in_group(first), 1)
        by_occ = np.argsort(occ, axis=1, kind="stable")
        sorted_occ = np.take_along_axis(occ, by_occ, 1)
        first = np.concatenate([np.ones((M, 1), bool), sorted_occ[:, 1:] != sorted_occ[:, :-1]], axis=1)
        arrival = np.empty((M, R), np.int64)
        np.put_along_axis(arrival, by_occ, _rank_in_group(first), 1)
        zero = np.zeros((M, 1), np.int64)
        self.most = np.concatenate([zero, np.maximum.accumulate(occ, axis=1)], axis=1).ravel()
        self.second = np.concatenate([zero, np.maximum.accumulate(np.where(arrival > 1, occ, 0), axis=1)],
                                     axis=1).ravel()
        # Until a minibatch's first rank finishes, only the ranks without work count as done, so
        # a transfer's counts there are fixed per rank (`early`), and so is its time for a given
        # size: most transfers fall there and take a time computed once per size; the rest
        # (`late`) are counted by a search. A row whose first finish lies past the horizon (none
        # known yet) has no late transfers.
        idle = f == -1.0
        working = np.where(idle, np.inf, f)
        first = working.min(axis=1)
        self.first = np.where(first <= self.horizon + 0.5, first, np.inf)[:, None]
        idle_count = idle.sum(axis=1)
        idle_in_node = idle.reshape(M, net.nodes, g).sum(axis=2).repeat(g, axis=1)
        by_rail = idle.reshape(M, net.nodes, per_rail, net.rails)
        idle_on_rail = np.broadcast_to(by_rail.sum(axis=2, keepdims=True), by_rail.shape).reshape(M, R)
        row = np.arange(M) * (R + 1) + idle_count
        # A rank is busy at its own transfer even if the previous pass had it finish earlier
        # (counted as done by the same clipped time as the others): before the first finish
        # only a rank without work is done itself.
        self.early = Counts(loc=g - idle_in_node + idle, tot=(R - idle_count)[:, None] + idle,
                            min_remote=g - np.where(idle_in_node == self.most[row, None], self.second[row, None],
                                                    self.most[row, None]),
                            rail=None if net.rails == 1 else per_rail - idle_on_rail + idle)
        # After a minibatch's first finish a transfer's time can still be its early one: until a
        # rank of its own node finishes, its node's (and rail's) counts are the early ones, and
        # the busiest remote NIC only gets less busy (each finish elsewhere removes a rank from
        # the total and adds at most one to the least busy other node's idle ranks). Where that
        # NIC did not set the early time, the time stays until then: `quiet`, the first finish
        # among the rank's working node-mates (+inf when none is known), needs no search before.
        node_f = np.where(idle, np.inf, f).reshape(M, net.nodes, g)
        lowest = np.sort(node_f, axis=2)[:, :, :2] if g > 1 else np.full((M, net.nodes, 2), np.inf)
        mates = np.where(node_f == lowest[:, :, :1], lowest[:, :, 1:], lowest[:, :, :1]).reshape(M, R)
        self.quiet = np.where(mates <= self.horizon + 0.5, mates, np.inf)
        self._early_times: dict[tuple[float, float], tuple[np.ndarray, np.ndarray]] = {}

    def late(self, at: np.ndarray, needed: np.ndarray | None = None, since: np.ndarray | None = None) -> np.ndarray:
        """The transfers starting at `at` (M, R) whose counts may differ from `early` (flat
        indices): only where `needed`, and at or after `since`, (M, 1) or (M, R): by default
        the minibatch's first finish."""
        after = at >= (self.first if since is None else since)
        return np.flatnonzero(after if needed is None else after & needed)

    def counts(self, at: np.ndarray, late: np.ndarray) -> Counts:
        """The counts of the transfers starting at `at` (M, R) at the flat indices `late`."""
        net, R, g = self.net, self.shape[1], self.net.gpus_per_node
        # take() rather than [] for these gathers from large flat arrays: the same values, sooner.
        q = np.minimum(at.ravel().take(late), self.horizon + 0.5)
        done = self.finish.ravel().take(late) <= q
        m = late // R
        k = self.keys.count(m, q)
        node_done = self.node_finish.count(self.node_group.take(late), q)
        row = m * (R + 1) + k
        most, second = self.most.take(row), self.second.take(row)
        rail = None
        if net.rails > 1:
            rail_done = self.rail_finish.count(self.rail_group.take(late), q)
            rail = (g // net.rails - rail_done) + done
        return Counts(loc=(g - node_done) + done, tot=(R - k) + done,
                      min_remote=g - np.where(node_done == most, second, most), rail=rail)

    def transfer(self, nbytes: float, at: np.ndarray, from_peer: float | np.ndarray = 0.0,
                 needed: np.ndarray | None = None) -> np.ndarray:
        """Seconds of every rank's transfer of `nbytes` starting at `at` (M, R); `from_peer`
        bytes of it taken from a rank of the node (Network.transfer_time). Where `needed` is
        False (a rank past its last microbatch) the result is not used, and not searched for.
        The result may be shared between calls: not to be written to."""
        net = self.net
        if net.nodes == 1:
            one = np.ones(at.shape)
            return net.transfer_time(nbytes, one, one, one)
        since = None
        if np.ndim(from_peer):
            out = net.transfer_time(nbytes, *self.early.args(), from_peer)
        else:
            key = (float(nbytes), float(from_peer))
            if key not in self._early_times:
                remote = net.remote_sets_time(nbytes, *self.early.args(), float(from_peer))
                self._early_times[key] = (net.transfer_time(nbytes, *self.early.args(), from_peer),
                                          np.where(remote, self.first, self.quiet))
            out, since = self._early_times[key]
        # Most batches of transfers lie wholly before their minibatch's first finish (or their
        # node's): nothing to count, the early times stand.
        late = self.late(at, needed, since)
        if late.size:
            out = out.copy()
            peer = np.ravel(from_peer)[late] if np.ndim(from_peer) else from_peer
            out.ravel()[late] = net.transfer_time(nbytes, *self.counts(at, late).args(), peer)
        return out


@dataclass(frozen=True)
class Counts:
    """Active ranks at transfers (Network.transfer_time's arguments): in the rank's node (itself
    included), in all, in the least busy other node, and on the rank's rail (None: one rail)."""

    loc: np.ndarray
    tot: np.ndarray
    min_remote: np.ndarray
    rail: np.ndarray | None

    def args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        return self.loc, self.tot, self.min_remote, self.rail


class _SortedRows:
    """Rows of values, each sorted: how many of a query's row are <= it, all queries at once
    (np.searchsorted(row, query, side="right") per query).

    A sorted search per query costs a mispredicted branch per halving; here each row's span is
    cut into a uniform grid of buckets, the values below a query's bucket are read off a table
    and the few inside it compared one by one. A row's values and its queries go through the
    same monotone arithmetic to find their buckets, so the count is exact, and it depends on
    that row alone.
    """

    def __init__(self, rows: np.ndarray, per_value: int = 8) -> None:
        M, R = rows.shape
        self.width = R
        self.values = rows.ravel()
        self.buckets = max(1, per_value * R)  # per row
        self.lo = np.ascontiguousarray(rows[:, 0]) if R else np.zeros(M)
        span = rows[:, -1] - self.lo if R else np.zeros(M)
        self.scale = np.where(span > 0, self.buckets / np.where(span > 0, span, 1.0), 1.0)
        # start[m * buckets + b]: the first value of row m in bucket b or after it (rows in order,
        # each sorted, so the buckets of the flat values never decrease).
        row = np.repeat(np.arange(M), R)
        self.start = np.searchsorted(self._bucket(row, self.values), np.arange(M * self.buckets + 1))

    def _bucket(self, row: np.ndarray, x: np.ndarray) -> np.ndarray:
        # Clipped before the cast: a row whose values lie within a few ulps has a huge scale, and a
        # query far from them would overflow int64.
        b = (x - self.lo.take(row)) * self.scale.take(row)
        np.clip(b, 0, self.buckets - 1, out=b)
        return b.astype(np.int64) + row * self.buckets

    def count(self, row: np.ndarray, query: np.ndarray) -> np.ndarray:
        bucket = self._bucket(row, query)
        at, end = self.start.take(bucket), self.start.take(bucket + 1)
        todo = np.flatnonzero(at < end)
        while todo.size:
            todo = todo[self.values[at[todo]] <= query[todo]]
            at[todo] += 1
            todo = todo[at[todo] < end[todo]]
        return at - row * self.width


class _Groups:
    """Small groups of values (a node's ranks): how many of a group's values are <= each query,
    all queries at once (each group sorted)."""

    def __init__(self, values: np.ndarray) -> None:
        self.width = values.shape[1]
        self.values = np.sort(values, axis=1).ravel()

    def count(self, group: np.ndarray, query: np.ndarray) -> np.ndarray:
        return _count_in_groups(self.values, self.width, group, query)


def _count_in_groups(values: np.ndarray, width: int, group: np.ndarray, query: np.ndarray) -> np.ndarray:
    """How many values of each query's group are <= it: `values` holds groups of `width`, each
    sorted, one after the other. A branchless binary search: every group is as wide, so every
    query halves the same range at once."""
    base = group * width
    if not width:
        return base
    # The count lies in [base, base + n]: halve n, moving base past values <= the query.
    n = width
    while n > 1:
        half = n // 2
        base += half * (values.take(base + half) <= query)
        n -= half
    return base - group * width + (values.take(base) <= query)


def _rank_in_group(first: np.ndarray) -> np.ndarray:
    """1-based position of each element in its run of equal keys (`first` marks each run's start), per row."""
    idx = np.broadcast_to(np.arange(first.shape[1]), first.shape)
    start = np.maximum.accumulate(np.where(first, idx, 0), axis=1)
    return idx - start + 1


class Holders:
    """Which ranks hold a unit's whole parameters when, from a previous pass (topology-aware fetch).

    A rank holds the unit of a position from the end of its gather to the end of that
    position's compute (the engine frees it after, as FSDP reshards after forward). Positions
    run embed, layers, head forward and back again, so unit u is at positions u and P-1-u.
    Per unit, the intervals of every rank are sorted per (minibatch, node); the ranks of a node
    holding a unit at a time are the intervals begun by then minus those ended by then (two
    searches within the node's group for a batch of queries).
    """

    def __init__(self, net: Network, hold_s: np.ndarray, hold_e: np.ndarray, nmb: np.ndarray) -> None:
        M, R, J, P = hold_s.shape
        g, U = net.gpus_per_node, P // 2
        self.shape = (M, R)
        empty = np.arange(J)[None, None, :, None] >= nmb[:, :, None, None]
        self.horizon = float(hold_e[~np.broadcast_to(empty, hold_e.shape)].max(initial=0.0))
        never = self.horizon + 2.0
        s = np.where(empty, never, hold_s)
        e = np.where(empty, never, np.maximum(hold_e, hold_s))
        at = np.stack([np.arange(U), P - 1 - np.arange(U)], axis=1)  # (U, 2): the positions of each unit
        self.own_s = s[:, :, :, at]  # (M, R, J, U, 2)
        self.own_e = e[:, :, :, at]
        self.width = g * J * 2
        self.group = (np.arange(M)[:, None] * net.nodes + np.arange(R)[None, :] // g).ravel()

        def grouped(x: np.ndarray) -> np.ndarray:  # (U, M * nodes * width), sorted per (minibatch, node)
            per_unit = np.moveaxis(x, 3, 0).reshape(U, M * net.nodes, self.width)
            return np.sort(per_unit, axis=-1).reshape(U, -1)

        self.starts, self.ends = grouped(self.own_s), grouped(self.own_e)

    def held(self, unit: int, at: np.ndarray) -> np.ndarray:
        """(M, R): whether another rank of the node holds `unit` at `at`."""
        M, R = self.shape
        query = np.minimum(at, self.horizon + 0.5)
        key = query.ravel()
        begun = _count_in_groups(self.starts[unit], self.width, self.group, key)
        ended = _count_in_groups(self.ends[unit], self.width, self.group, key)
        q = query[:, :, None, None]
        own = ((self.own_s[:, :, :, unit] <= q) & (q < self.own_e[:, :, :, unit])).sum(axis=(2, 3))
        return (begun - ended).reshape(M, R) - own > 0
