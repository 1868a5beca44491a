"""``traffic collect``'s run: a collector in this process until SIGTERM or SIGINT, its start and stop on stderr."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Mapping

from traffic.app.collect.options import MIB, CollectOptions
from traffic.app.collect.receiver import Collector


def run(inbox: Path, exporters: Mapping[str, str], options: CollectOptions) -> int:
    """Run the collector in this process until SIGTERM or SIGINT; 0 once every file is complete."""
    collector = Collector(inbox, exporters, options)
    # Before ``start``: once the status file exists a supervisor may stop us, and that must be a clean stop.
    previous = {sig: signal.signal(sig, lambda *_: collector.stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        collector.start()
        collector.log(f"collect: writing to {inbox}/<source>/, a file per source every {options.rotate:g} s; "
                      "stop with SIGTERM or Ctrl-C")
        if collector.upload is not None:
            collector.log(f"collect: sending each completed file to {collector.upload.location}/<source>/ as one "
                          f"object, then removing it from {inbox}")
        try:
            collector.serve()
        finally:
            collector.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    datagrams, size, drops = collector.totals()
    collector.log(f"collect: stopped: {datagrams:,} datagrams ({size / MIB:,.1f} MiB), kernel drops {drops:,}, "
                  f"{collector.files_written:,} file(s) written{collector._refused_summary()}")
    return 0
