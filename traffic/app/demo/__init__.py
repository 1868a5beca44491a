"""``traffic demo``: realistic sample traffic through the whole pipeline, then what a person wants to see.

The sample spans 2026-10-31 20:00 → 2026-11-02 02:00 UTC (a day change and a month change)
from four sources: ``edge-a`` (router-feed CSV), ``edge-b`` (JSON lines with directions),
``quiet`` (clock ticks only) and ``router`` (flow telemetry: IPFIX flows and sFlow samples sent
over UDP to a collector on 127.0.0.1). Deliveries arrive every few hours of event time; one of
them carries late records for a closed hour, bad lines and a re-delivered file.

The package, by role: ``deliveries`` (the sample's files), ``exports`` (the router's datagrams),
``telemetry`` (sends them to a collector used as a library, ``traffic.app.collect``), ``run``
(every delivery through ingest and close, then the results).
"""

from traffic.app.demo.deliveries import DEMO_ACCOUNTS, DEMO_COMMIT_BPS, DEMO_NETWORKS, DEMO_QUOTA_BYTES, END, \
    LOCAL_HOSTS, REMOTE_V4, REMOTE_V6, START, add_trouble, generate
from traffic.app.demo.run import run_demo

__all__ = ["DEMO_ACCOUNTS", "DEMO_COMMIT_BPS", "DEMO_NETWORKS", "DEMO_QUOTA_BYTES", "END", "LOCAL_HOSTS", "REMOTE_V4",
           "REMOTE_V6", "START", "add_trouble", "generate", "run_demo"]
