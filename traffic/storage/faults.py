"""The crash tests' kill points: every write passes named steps, and one of them may SIGKILL the process.

A write reaches ``<table>.<op>.files_written`` then ``<table>.<op>.committed``; ``TRAFFIC_FAULT_AT``
(``Settings.fault_at``) names the step, or ``step#n`` its n-th time, at which the process dies.
"""

from __future__ import annotations

import os
import signal

from traffic.core.settings import Settings

#: Every step reached in this process, in order (the crash tests enumerate kill points from it).
STEPS_REACHED: list[str] = []


class FaultInjector:
    """Kills the process (SIGKILL) at a named step: ``name`` or ``name#n`` (its n-th time)."""

    def __init__(self, spec: str | None):
        self.name, _, nth = (spec or "").partition("#")
        self.nth = int(nth) if nth else 1
        self.seen = 0

    def reached(self, step: str) -> None:
        STEPS_REACHED.append(step)
        if step == self.name:
            self.seen += 1
            if self.seen == self.nth:
                os.kill(os.getpid(), signal.SIGKILL)


_INJECTORS: dict[tuple[str | None, int], FaultInjector] = {}


def injector(settings: Settings) -> FaultInjector:
    """One injector per settings object, so ``name#n`` counts across every job run with them."""
    key = (settings.fault_at, id(settings))
    if key not in _INJECTORS:
        _INJECTORS[key] = FaultInjector(settings.fault_at)
    return _INJECTORS[key]
