"""A command's Spark session, started on first use only, so a command with nothing to do never starts a JVM."""

from __future__ import annotations

import sys
import time


class SparkHolder:
    """Starts Spark on first use only (so 'nothing to do' never pays for a JVM), then reuses it."""

    def __init__(self, settings, app_name: str, spark=None):
        self.settings = settings
        self.app_name = app_name
        self.spark = spark
        self.started_in = 0.0

    def __call__(self):
        return self.start()

    def start(self, big_job: str | None = None):
        """The session, started now if need be with the JVM ``big_job`` asks for (why the work is big, or None)."""
        if self.spark is None:
            from traffic.runtime import jvm  # deferred: only a command that needs Spark
            from traffic.runtime.spark import build_spark, resolve_master  # deferred: only a command that needs Spark

            clock = time.perf_counter()
            master = resolve_master(self.settings)
            if master.startswith("sc://"):
                from traffic.runtime.connect import without_token  # deferred: with the session, not at CLI start

                print(f"connecting to the warm Spark at {without_token(master)} …", file=sys.stderr, flush=True)
            else:
                jit = "quick-start JVM" if jvm.quick_for(self.settings.spark_jit, big_job is not None) else \
                    f"full JIT: {big_job}" if big_job else "full JIT"
                print(f"starting Spark ({jit}) …", file=sys.stderr, flush=True)
            self.spark = build_spark(self.settings.replace(spark_master=master), self.app_name, big_job)
            self.started_in = time.perf_counter() - clock
        return self.spark

    def stop(self):
        if self.spark is not None:
            self.spark.stop()
            self.spark = None
