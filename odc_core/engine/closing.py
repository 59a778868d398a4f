"""What a closing engine tells its peers through the run's store, and what a peer makes of it.

An engine closed between minibatches by a rank that ran fewer of them than its peers, or
closed while an error unwinds, leaves its peers waiting (ODC) or in a collective (FSDP2) that
the closed rank will never join. The closing rank records when it closed and the error it
closed on; a peer whose wait or collective fails looks that up and says which rank ended the
run, when and why, instead of a timeout or a transport's "connection closed".
"""

from __future__ import annotations

import contextlib
import json

import torch.distributed as dist

from odc_core.liveness import one_line


def _key(job_id: str, rank: int) -> str:
    return f"odc_core/closed/{job_id}/{rank}"


def tell_peers(store: dist.Store, job_id: str, rank: int, minibatch: int, inside: bool,
               raised: BaseException | None) -> None:
    """Record that `rank` closed its engine in or after `minibatch` (-1: before its first),
    on `raised` if an error was unwinding."""
    when = f"in minibatch {minibatch}" if inside else f"after minibatch {minibatch}" if minibatch >= 0 \
        else "before its first minibatch"
    closed = json.dumps({"when": when, "error": one_line(raised) if raised is not None else None})
    with contextlib.suppress(Exception):  # a store whose server is gone: nobody is left to tell
        store.set(_key(job_id, rank), closed)


def peer_closed(store: dist.Store, job_id: str, peer: int, what: str) -> str | None:
    """The one-line error of this rank's wait for `what` where `peer` closed its engine; None
    while it has not. The store's own errors propagate."""
    key = _key(job_id, peer)
    if not store.check([key]):
        return None
    closed = json.loads(store.get(key))
    if closed["error"]:
        return f"rank {peer} failed {closed['when']} ({closed['error']}) while this rank waits for {what}"
    return (f"rank {peer} closed its engine {closed['when']} while this rank waits for {what}: every rank must run "
            f"the same minibatches")
