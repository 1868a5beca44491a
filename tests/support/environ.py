"""The environment of a ``traffic`` process a test starts."""

from __future__ import annotations

import os


def without_traffic_settings() -> dict[str, str]:
    """This process's environment without any ``TRAFFIC_`` setting but the suite's engine (tests/conftest.py):
    the command reads only its own flags and files, and where a test is not about the engine it creates no
    delta-spark tables (a JVM's start-up, ~10 s, each time)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAFFIC_")}
    if "TRAFFIC_ENGINE" in os.environ:
        env["TRAFFIC_ENGINE"] = os.environ["TRAFFIC_ENGINE"]
    return env
