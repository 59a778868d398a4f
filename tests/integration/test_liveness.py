"""Heartbeats: a rank tells a dead peer from a live or failed one, and waits name the peer."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from odc_bench.run.worker import RankJob, connect_store
from odc_core.liveness import Liveness, PeerLost, one_line
from odc_core.transport.base import PeerTimeout

TIMEOUT_S = 1.0


def _store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=TIMEOUT_S))


def _client(server: dist.TCPStore) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", server.port, 3, is_master=False, timeout=timedelta(seconds=TIMEOUT_S))


def _liveness(server: dist.TCPStore, rank: int, store_rank: int | None = None) -> Liveness:
    return Liveness(_client(server), _client(server), rank, 3, TIMEOUT_S, store_rank)


def test_rendezvous_names_the_rank_that_never_came():
    server = _store()
    ranks = [_liveness(server, 0), _liveness(server, 1)]
    errors: list[BaseException] = []

    def arrive(r: Liveness) -> None:
        try:
            r.rendezvous()
        except PeerTimeout as e:
            errors.append(e)

    threads = [threading.Thread(target=arrive, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [str(e) for e in errors] == ["timed out after 1.0s waiting for rank 2: rendezvous (the rank never "
                                        "reached the run's store)"] * 2
    assert all(e.peer == 2 for e in errors)
    for r in ranks:
        r.stop(finished=False)


def test_explain_blames_only_the_peer_that_stopped_without_a_word():
    server = _store()
    me, failed, dead = _liveness(server, 0), _liveness(server, 1), _liveness(server, 2)
    error = RuntimeError("[/src/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4242: Connection reset by "
                         "peer. This is typically caused by a remote worker hanging")
    assert me.explain(error) is error, "every peer is beating: nobody to blame"
    failed.explain(ValueError("its own bug"))  # records its failure, keeps beating until it stops
    failed.stop(finished=False)
    dead.stop(finished=False)  # as if SIGKILLed: no beat, no record
    lost = me.explain(error)
    assert isinstance(lost, PeerLost) and lost.peers == [2]
    assert str(lost) == ("rank 2 is gone (no heartbeat for 0.3s): RuntimeError: Read error [127.0.0.1]:4242: "
                         "Connection reset by peer")
    me.stop(finished=False)


def test_a_peer_that_finished_is_not_blamed():
    server = _store()
    me, done, also_done = _liveness(server, 0), _liveness(server, 1), _liveness(server, 2)
    done.stop(finished=True)
    also_done.stop(finished=True)
    error = TimeoutError("late")
    assert me.explain(error) is error
    me.stop(finished=False)


def test_when_the_store_goes_its_host_is_named():
    server = _store()
    me = _liveness(server, 1, store_rank=0)
    del server
    lost = me.explain(PeerTimeout(0, "'odc/flags'[1] >= 2", 5.0))
    assert isinstance(lost, PeerLost) and lost.peers == [0]
    assert str(lost).startswith("rank 0 is gone (it hosts the run's store, which stopped answering): timed out "
                                "after 5.0s waiting for rank 0")
    me.stop(finished=False)


def test_the_heartbeat_says_at_once_when_the_store_goes_and_not_after_stop():
    """A rank polling a flag in shared memory learned that its launcher (and the store it hosts)
    was gone only at its timeout; the heartbeat, which reaches the store every beat, tells it."""
    server, lost = _store(), threading.Event()
    me = Liveness(_client(server), _client(server), 1, 3, TIMEOUT_S, None, lost.set)
    assert not lost.wait(3 * me.period), "the store answers: nothing is lost"
    del server
    assert lost.wait(TIMEOUT_S + 5 * me.period), "told within a few beats of the store's going"
    me.stop(finished=False)

    server, calls = _store(), []
    me = Liveness(_client(server), _client(server), 1, 3, TIMEOUT_S, None, lambda: calls.append(1))
    me.stop(finished=True)
    del server
    time.sleep(3 * me.period)
    assert calls == [], "a rank that stopped beating is told nothing"


@pytest.mark.parametrize(("store_rank", "message"), [
    (None, r"timed out after 0.5s waiting for the launcher: the run's store at 127.0.0.1:\d+"),
    (0, r"timed out after 0.5s waiting for rank 0: the run's store at 127.0.0.1:\d+"),
])
def test_an_unreachable_store_names_who_hosts_it(store_rank, message):
    server = _store()
    port = server.port
    del server
    job = RankJob(spec=None, store_host="127.0.0.1", store_port=port, out_dir="", job_id="x", store_rank=store_rank)
    with pytest.raises(TimeoutError, match=message):
        connect_store(job, 2, 0.5)


def test_one_line_drops_gloo_locations_and_advice_but_keeps_the_cause():
    assert one_line(RuntimeError("[a/b/pair.cc:12] Connection closed by peer [1.2.3.4]:5\nmore")) == \
        "RuntimeError: Connection closed by peer [1.2.3.4]:5"
    assert one_line(PeerTimeout(3, "barrier #2", 1.0)) == "timed out after 1.0s waiting for rank 3: barrier #2"
