"""The warehouse's lease on object storage (``traffic.storage.lease``) against a real S3 server: one holder at a
time, expiry, takeover with a larger fencing token, a lost lease refusing to commit, and writers in separate
processes racing for it."""

from __future__ import annotations

import json
import multiprocessing
import time
import uuid

import obstore
import pytest

from traffic.storage.lease import LEASE_KEY, Lease, LeaseHeld, LeaseKeeper, LeaseLost, lease_lock
from traffic.core.location import ObjectLocation


@pytest.fixture
def store(seaweed):
    return ObjectLocation.parse(seaweed.url(f"lease-{uuid.uuid4().hex}"), seaweed.environ()).store()


def _stored(store) -> dict:
    return json.loads(bytes(obstore.get(store, LEASE_KEY).bytes()))


def test_one_holder_at_a_time_and_release_keeps_the_token_counting(store):
    first = Lease(store, "ingest on a", ttl=30).acquire()
    assert first.token == 1
    with pytest.raises(LeaseHeld, match="ingest on a holds"):
        Lease(store, "close on b", ttl=30).acquire()
    first.check()
    first.release()
    assert _stored(store) == {"holder": "", "token": 1, "expires": 0.0}
    second = Lease(store, "close on b", ttl=30).acquire()
    assert second.token == 2


def test_an_expired_lease_is_taken_over_and_its_old_holder_may_not_commit(store):
    old = Lease(store, "crashed", ttl=2.5).acquire()
    with pytest.raises(LeaseHeld):
        Lease(store, "new", ttl=30).acquire()
    time.sleep(2.6)
    new = Lease(store, "new", ttl=30).acquire()
    assert new.token == old.token + 1
    with pytest.raises(LeaseLost):
        old.check()
    with pytest.raises(LeaseLost):
        old.renew()
    old.release()  # quiet, and it does not free the new holder's lease
    assert _stored(store)["holder"] == "new"
    new.check()


def test_a_lease_taken_over_while_its_holder_paused_refuses_the_commit(store):
    """The holder's own clock says it has time left, but the object says otherwise: ``check`` reads the store."""
    paused = Lease(store, "paused", ttl=60).acquire()
    current = obstore.get(store, LEASE_KEY)
    obstore.put(store, LEASE_KEY, json.dumps({"holder": "other", "token": 2, "expires": time.time() + 60}).encode(),
                mode={"e_tag": current.meta["e_tag"]})
    with pytest.raises(LeaseLost, match="taken over by token 2"):
        paused.check()


def test_the_keeper_renews_a_live_holder_past_its_time_to_live(store):
    lease = Lease(store, "long job", ttl=3).acquire()
    with LeaseKeeper(lease) as keeper:
        time.sleep(5)
        keeper.check()
        with pytest.raises(LeaseHeld):
            Lease(store, "other", ttl=3).acquire()
    lease.release()


def test_a_check_during_the_holders_own_renewal_is_not_a_takeover(store):
    """Found by the crash suite on S3: the keeper's renewal has put the new version but not yet noted its ETag when
    a commit's ``check`` reads the object. That is the holder's own lease (same token), not a takeover: ``check``
    must wait for the renewal, never refuse the commit."""
    import threading

    lease = Lease(store, "close", ttl=30).acquire()
    written, go_on = threading.Event(), threading.Event()
    write = lease._write

    def slow_write(*args):
        etag = write(*args)  # the store has the new version ...
        written.set()
        go_on.wait(5)  # ... and the holder has not noted its ETag yet
        return etag

    lease._write = slow_write
    renewal = threading.Thread(target=lease.renew)
    renewal.start()
    assert written.wait(10)
    checked = threading.Thread(target=lease.check)
    outcome = []
    checked.run = lambda: outcome.append(_check(lease))
    checked.start()
    time.sleep(0.3)  # the check is under way while the renewal is half done
    go_on.set()
    renewal.join(10)
    checked.join(10)
    assert outcome == [None], outcome
    assert _stored(store)["token"] == 1 and lease.token == 1


def _check(lease):
    try:
        lease.check()
    except LeaseLost as lost:
        return str(lost)
    return None


def test_lease_lock_waits_then_fails_naming_the_holder(store):
    with lease_lock(store, "traffic ingest", timeout_seconds=5, ttl=10):
        started = time.monotonic()
        with pytest.raises(LeaseHeld, match=r"traffic ingest \(host .*\) holds the warehouse's lease .* \(waited 1 s\)"):
            with lease_lock(store, "traffic close", timeout_seconds=1.0, ttl=10, poll=0.1):
                pass
        assert 1.0 <= time.monotonic() - started < 5
    with lease_lock(store, "traffic close", timeout_seconds=1.0, ttl=10) as keeper:
        keeper.check()


def _race(url: str, environ: dict, name: str, rounds: int, queue) -> None:
    """One writer process: take the lease ``rounds`` times, and while holding it bump a counter object
    with a plain read-modify-write (safe only if nobody else holds the lease at the same time)."""
    store = ObjectLocation.parse(url, environ).store()
    for _ in range(rounds):
        with lease_lock(store, name, timeout_seconds=60, ttl=10, poll=0.05) as keeper:
            try:
                n = int(bytes(obstore.get(store, "counter").bytes()))
            except FileNotFoundError:
                n = 0
            keeper.check()
            obstore.put(store, "counter", str(n + 1).encode())
            queue.put((name, keeper.lease.token))


def test_writers_in_separate_processes_never_hold_it_at_once(seaweed):
    url = seaweed.url(f"race-{uuid.uuid4().hex}")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    writers = [context.Process(target=_race, args=(url, seaweed.environ(), f"w{n}", 5, queue)) for n in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
    assert [w.exitcode for w in writers] == [0, 0, 0]
    tokens = sorted(queue.get(timeout=5)[1] for _ in range(15))
    assert tokens == list(range(1, 16))  # every holding had its own, larger token
    store = ObjectLocation.parse(url, seaweed.environ()).store()
    assert int(bytes(obstore.get(store, "counter").bytes())) == 15  # no update lost to an overlap
