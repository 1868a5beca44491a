"""The warehouse's single-writer lock on object storage: a lease (DESIGN §8, issue 38).

On a local disk one job at a time is an ``flock``; processes on several hosts sharing only a bucket
need the store itself to decide. The lease is one object, ``_traffic/lease.json``:
``{"holder", "token", "expires"}``.

* **Acquire** creates it only if absent (If-None-Match), or takes over one whose ``expires`` has
  passed by replacing exactly the version read (If-Match on its ETag). Either way the fencing
  ``token`` is one more than the last holder's, so tokens only grow.
* **Renew** and **release** replace exactly the version this holder wrote; if anyone else wrote
  since, the lease is lost. Release leaves the object in place, expired, so the next token still
  counts up.
* **Check** before every commit: a holder whose lease expired, or was taken over (a long pause, a
  partition), raises ``LeaseLost`` instead of committing. ``LeaseKeeper`` renews in the background
  every third of the time to live, so a live holder never expires. A holder's renewal and its checks
  take turns: a check that read the renewal's new version before the holder noted its ETag would take
  the holder's own renewal for a takeover.

Clocks: ``expires`` is the writer's wall clock; hosts are assumed to agree within ``MAX_SKEW``,
and a holder stops committing that long before its own expiry.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

#: The lease object, under the warehouse's prefix: in its run-state folder (``journal.STATE_FOLDER``).
LEASE_KEY = "_traffic/lease.json"
#: How far apart two hosts' clocks may be; a holder stops committing this long before its expiry.
MAX_SKEW = 2.0


class LeaseHeld(RuntimeError):
    """Someone else holds a lease that has not expired."""

    def __init__(self, holder: str, seconds_left: float, waited: float | None = None):
        waiting = f" (waited {waited:.0f} s)" if waited is not None else ""
        super().__init__(f"{holder} holds the warehouse's lease for {seconds_left:.0f} s more{waiting}")
        self.holder, self.seconds_left = holder, seconds_left


class LeaseLost(RuntimeError):
    """This holder's lease expired or was taken over: it must not commit."""


def describe_holder(what: str) -> str:
    """A holder's name: the job, the host and the process (what a waiting job's error names)."""
    return f"{what} (host {socket.gethostname()}, pid {os.getpid()})"


@dataclass
class Lease:
    """One holder's claim on a store's lease object (``store``: an ``obstore`` store at the warehouse)."""

    store: object
    holder: str
    ttl: float = 30.0
    token: int = 0
    _etag: str | None = None
    _expires: float = 0.0
    #: Held while this holder writes the object or compares it with what it wrote (renew, check, release).
    _turn: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    # -- the object -----------------------------------------------------------------------
    def _read(self) -> tuple[dict | None, str | None]:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            result = obstore.get(self.store, LEASE_KEY)
        except (NotFoundError, FileNotFoundError):
            return None, None
        return json.loads(bytes(result.bytes())), result.meta["e_tag"]

    def _write(self, token: int, expires: float, holder: str, mode) -> str:
        import obstore

        body = json.dumps({"holder": holder, "token": token, "expires": expires}).encode()
        return obstore.put(self.store, LEASE_KEY, body, mode=mode)["e_tag"]

    # -- the protocol ---------------------------------------------------------------------
    def acquire(self) -> "Lease":
        """Take the lease or raise ``LeaseHeld``; a lost race to another acquirer also raises it."""
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        current, etag = self._read()
        now = time.time()
        if current is not None and current.get("expires", 0) > now and current.get("holder"):
            raise LeaseHeld(current["holder"], current["expires"] - now)
        token = (current or {}).get("token", 0) + 1
        expires = now + self.ttl
        mode = "create" if etag is None else {"e_tag": etag}
        try:
            self._etag = self._write(token, expires, self.holder, mode)
        except (AlreadyExistsError, PreconditionError):
            winner, _ = self._read()
            winner = winner or {}
            raise LeaseHeld(winner.get("holder", "another writer"), max(0.0, winner.get("expires", 0) - time.time())) \
                from None
        self.token, self._expires = token, expires
        return self

    def renew(self) -> None:
        """Push the expiry ``ttl`` ahead; ``LeaseLost`` if the lease is no longer this holder's."""
        with self._turn:
            self._renew()

    def _renew(self) -> None:
        from obstore.exceptions import NotFoundError, PreconditionError

        if self._etag is None:
            raise LeaseLost("the lease was never acquired")
        if time.time() >= self._expires:
            raise LeaseLost(f"the lease (token {self.token}) expired before it was renewed")
        expires = time.time() + self.ttl
        try:
            self._etag = self._write(self.token, expires, self.holder, {"e_tag": self._etag})
        except (PreconditionError, NotFoundError):
            self._etag = None
            raise LeaseLost(f"the lease (token {self.token}) was taken over by another writer") from None
        self._expires = expires

    def check(self) -> None:
        """Before a commit: raise ``LeaseLost`` unless the lease is still this holder's, with time to spare."""
        with self._turn:
            self._check()

    def _check(self) -> None:
        if self._etag is None:
            raise LeaseLost("this writer holds no lease")
        if time.time() > self._expires - MAX_SKEW:
            raise LeaseLost(f"the lease (token {self.token}) has expired or is about to: not committing")
        current, etag = self._read()
        if etag != self._etag or (current or {}).get("token") != self.token:
            raise LeaseLost(f"the lease (token {self.token}) was taken over by token "
                            f"{(current or {}).get('token')}: not committing")

    def release(self) -> None:
        """Give the lease up (it stays, expired, so that tokens keep counting up); quiet if already lost."""
        with self._turn:
            self._release()

    def _release(self) -> None:
        from obstore.exceptions import NotFoundError, PreconditionError

        if self._etag is None:
            return
        try:
            self._write(self.token, 0.0, "", {"e_tag": self._etag})
        except (PreconditionError, NotFoundError):
            pass
        self._etag = None


class LeaseKeeper:
    """Renews a lease every third of its time to live until stopped; remembers a failure for ``check``."""

    def __init__(self, lease: Lease):
        self.lease = lease
        self.failure: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.lease.ttl / 3):
            try:
                self.lease.renew()
            except LeaseLost as lost:
                self.failure = lost
                return
            except Exception:  # noqa: BLE001 - a store that does not answer: retried next round, check() decides
                continue

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure
        self.lease.check()


@contextmanager
def lease_lock(store, holder: str, timeout_seconds: float, ttl: float = 30.0, poll: float = 0.5):
    """One job at a time on a warehouse on object storage (``journal.warehouse_lock`` uses it): the loser waits
    up to ``timeout_seconds``, then raises ``LeaseHeld`` naming the holder. Yields the ``LeaseKeeper``
    (``check()`` it before each commit)."""
    lease = Lease(store, describe_holder(holder), ttl)
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            lease.acquire()
            break
        except LeaseHeld as held:
            if time.monotonic() >= deadline:
                raise LeaseHeld(held.holder, held.seconds_left, waited=timeout_seconds) from None
            time.sleep(poll)
    try:
        with LeaseKeeper(lease) as keeper:
            yield keeper
    finally:
        lease.release()
