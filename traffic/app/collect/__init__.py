"""``traffic collect``: receive flow telemetry over UDP and store every datagram, undecoded, in the inbox.

    traffic collect [--listen HOST:PORT ...] [--allow BLOCKS | --allow-any] [--inbox DIR] [--rotate 60s]
                    [--status FILE] [--metrics 127.0.0.1:9155] [--upload s3://bucket/prefix]

DESIGN §7a. Each datagram is written with its receive time (the kernel's, ``SO_TIMESTAMP``) and its
exporter's address and port as one record of a classic pcap (``traffic.io.datagrams``) in
``inbox/<source>/``, where the source is the ``exporters`` setting's name for the address, else
the address itself (``source_folder``). A file is written under a hidden name (``.<name>``, which
the inbox never takes) while it is open, and fsynced and renamed to ``<UTC time of its first
datagram>-<pid>.flows.pcap`` when its rotation period ends or the collector stops: one file per source
per period, and only for sources that sent something.

Who may export (§7a): UDP senders can be spoofed, so only datagrams from the ``allowed_exporters``
blocks are written; any other sender's are dropped and counted, one by one for the first
``REFUSED_SENDERS`` senders and together as ``others`` after that, so spoofed addresses cost a fixed
amount of memory and make no file or source. A listen another machine can reach needs that list or
an explicit ``--allow-any``, checked before anything is bound; a loopback-only listen (the default,
the demo, the tests) takes every sender, since only this machine can reach it.

Periods (``--rotate``, ``--flush``, ``--status-every``, ``--log-every``) are bare seconds or durations
(``2s``, ``15m``), read by the settings' ``parse_duration`` like every other duration.

What a crash loses: received datagrams are handed to the operating system every ``flush`` seconds
and every ``flush_datagrams`` datagrams, so a SIGKILL loses at most those received since the last
flush (and whatever still sat in the socket buffer). The next start completes a hidden file a
killed collector left (``recover``): its whole records are kept, a torn last record is cut, and it
is renamed, so nothing flushed is lost. A hidden file is only taken when no process holds its lock
(each open file is ``flock``-ed), so two collectors may share an inbox.

With ``--upload s3://bucket/prefix`` the inbox is a local spool: each completed file is sent to the store
as one object, never over another, and removed once the store has it (``upload``).

The package, by role: ``options`` (what the command is told, checked before anything is bound),
``receiver`` (the collector as a library: sockets and the receive loop), ``files`` (one file per
source and period, its rotation, ``recover``), ``counts`` (per exporter and refused sender, and
their Prometheus view), ``upload`` (completed files to object storage), ``service`` (the command's
run: signals, start and stop lines).

Operator documentation: ``docs/collect.md``.
"""

from traffic.app.collect.files import SUFFIX, complete_length, recover
from traffic.app.collect.options import DEFAULT_LISTEN, MIB, REFUSED_SENDERS, CollectError, CollectOptions, Endpoint, \
    build_options, check_who_may_export, ipv4_blocks, parse_allowed, parse_listen, parse_seconds, parse_size, \
    sender_allowed, source_folder
from traffic.app.collect.receiver import Collector, kernel_drops, set_receive_buffer
from traffic.app.collect.service import run

__all__ = ["DEFAULT_LISTEN", "MIB", "REFUSED_SENDERS", "SUFFIX", "CollectError", "CollectOptions", "Collector",
           "Endpoint", "build_options", "check_who_may_export", "complete_length", "ipv4_blocks", "kernel_drops",
           "parse_allowed", "parse_listen", "parse_seconds", "parse_size", "recover", "run", "sender_allowed",
           "set_receive_buffer", "source_folder"]
