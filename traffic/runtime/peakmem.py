"""Peak memory of a process and all its children (driver, JVM, Python workers).

Used by the memory test and the benchmarks to hold the whole process tree to a bound; sampled
every 0.1 s on a background thread while a ``with`` block runs. Each process counts its
proportional set size (PSS): pages shared between processes are split among them, not counted
once per process. Plain RSS double-counts the JVM whenever it spawns a Python worker (the
short-lived ``jspawnhelper`` child maps the whole JVM), which overstated a 3 GiB tree as 4.6 GiB.
"""

from __future__ import annotations

import threading
import time

import psutil


class PeakMemory:
    """Samples the memory (PSS) of one process tree; ``peak`` is the largest sum seen (bytes)."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            total = 0
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            for process in tree:
                try:
                    total += process.memory_full_info().pss
                except psutil.AccessDenied:
                    total += process.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self.samples += 1
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
