"""``traffic collect --upload s3://bucket/prefix``: each completed file goes to object storage as one object.

An edge collector then needs no folder shared with the pipeline: its inbox is a local spool, and every
file the collector completes (a rotation, a stop, ``recover`` after a crash) is sent as
``<prefix>/<source>/<name>`` with one ``PutObject``, which a store makes visible whole or not at all, and
removed from the spool only once the store has it. A file is sent only if no object has its key yet
(``If-None-Match: *``), so nothing already stored is ever overwritten:

* the same bytes already there (a collector killed between the put and the removal) count as sent;
* other bytes under the same name (another collector's, or a file edited since) make the file go under a
  new name, ``…-u<n>.flows.pcap``, and a line says so.

A store that cannot be reached keeps the files in the spool: they are sent when it answers again (tried
again after 1 s, doubling to a minute), or by the next start, which sends what the spool holds before
anything else. Sending runs in a thread of its own, so a slow store never delays receiving.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from traffic.app.collect.files import SUFFIX, fsync_folder
from traffic.app.collect.options import CollectError
from traffic.core.location import ObjectLocation, StoreUnreachable

#: Between two attempts while the store fails: from the first to the last, doubling.
FIRST_RETRY, LAST_RETRY = 1.0, 60.0
#: How often the thread looks at the spool when nothing woke it (a file ``recover`` completed, say).
IDLE_LOOK = 30.0


class Uploader:
    """Sends the completed files of a spool folder (``<spool>/<source>/*.flows.pcap``) to one location."""

    def __init__(self, spool: Path, location: ObjectLocation, log: Callable[[str], None]):
        self.spool, self.location, self.log = Path(spool), location, log
        self.sent = 0
        self.sent_bytes = 0
        self.last_error = ""
        self._store = None
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one pass at a time (the thread's, and the last one at ``finish``)

    # -- the command's start and stop ------------------------------------------------------------
    def check(self) -> None:
        """Refuse in one line a store that does not answer, has no such bucket or refuses the key."""
        try:
            self.location.check_reachable()
        except StoreUnreachable as error:
            raise CollectError(f"--upload: {error}") from None
        self._store = self.location.store()

    def start(self) -> None:
        """Send what the spool holds, then keep sending in a thread of its own."""
        self._thread = threading.Thread(target=self._loop, name="traffic-collect-upload", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """A file was completed: send it now."""
        self._wake.set()

    def finish(self, timeout: float = 60.0) -> list[str]:
        """Stop the thread after one last pass; the files left in the spool (the store did not take them)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.send_pending()
        left = [f"{p.parent.name}/{p.name}" for p in self.pending()]
        if left:
            self.log(f"collect: {len(left)} file(s) stay in {self.spool} for the next start to send "
                     f"({self.last_error or 'not sent yet'})")
        return left

    def status(self) -> dict:
        return {"to": str(self.location), "sent": self.sent, "sent_bytes": self.sent_bytes,
                "pending": len(self.pending()), "last_error": self.last_error}

    # -- sending ----------------------------------------------------------------------------------
    def pending(self) -> list[Path]:
        """The completed collector files of the spool, oldest name first (hidden ones are still written)."""
        if not self.spool.is_dir():
            return []
        return sorted(path for folder in self.spool.iterdir() if folder.is_dir() and not folder.is_symlink()
                      for path in folder.glob(f"*{SUFFIX}") if not path.name.startswith(".") and path.is_file())

    def send_pending(self) -> bool:
        """One pass over the spool; whether every file went (False: the store failed, the rest wait)."""
        with self._lock:
            for path in self.pending():
                try:
                    self._send(path)
                except FileNotFoundError:
                    continue  # gone meanwhile (another collector on the same spool sent it)
                except Exception as error:  # noqa: BLE001 - the store's errors: keep the file, try again later
                    why = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
                    if why != self.last_error:
                        self.log(f"collect: cannot send {path.parent.name}/{path.name} to {self.location}: {why}; "
                                 "kept, tried again")
                    self.last_error = why
                    return False
            if self.last_error:
                self.log(f"collect: {self.location} takes files again")
            self.last_error = ""
            return True

    def _send(self, path: Path) -> None:
        """Put the file as one object, never over another, then remove it from the spool."""
        import obstore  # deferred: only a collector that uploads needs it
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        data = path.read_bytes()
        source, name = path.parent.name, path.name
        for attempt in range(1000):
            stored = name if attempt == 0 else name.replace(SUFFIX, f"-u{attempt}{SUFFIX}")
            key = f"{source}/{stored}"
            try:
                obstore.put(self._store, key, data, mode="create", use_multipart=False)
            except (AlreadyExistsError, PreconditionError):
                if self._holds(key, data):
                    break  # sent before (a collector stopped between the put and the removal)
                continue
            if attempt:
                self.log(f"collect: {source}/{name} sent as {stored}: another file already has its name there")
            self.sent += 1
            self.sent_bytes += len(data)
            break
        else:
            raise CollectError(f"no free name at {self.location} for {source}/{name}")
        path.unlink()
        fsync_folder(path.parent)

    def _holds(self, key: str, data: bytes) -> bool:
        """Whether the object at ``key`` has exactly these bytes."""
        import obstore  # deferred: only a collector that uploads needs it

        if obstore.head(self._store, key)["size"] != len(data):
            return False
        return bytes(obstore.get(self._store, key).bytes()) == data

    def _loop(self) -> None:
        delay = FIRST_RETRY
        while not self._stop:
            self._wake.clear()  # before the pass: a file completed during it wakes the next one at once
            if self.send_pending():
                delay = FIRST_RETRY
                self._wake.wait(IDLE_LOOK)
            else:
                self._wake.wait(delay)
                delay = min(delay * 2, LAST_RETRY)
