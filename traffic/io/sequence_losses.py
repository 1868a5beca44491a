"""Export sequence losses of flow telemetry (DESIGN §7a "Loss"): each stream's numbers, reordering, restarts, gaps.

A stream is (exporter, format, domain). ``judge_sequence`` reads one datagram's sequence number against
its stream; ``close_gaps_by`` decides the gaps no datagram can fill any more. What is lost is counted
per 5-minute pane (``traffic.core.periods``) of the datagram that revealed the gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.periods import PANE_US

__all__ = ["REORDER_WAIT_US", "REORDER_WINDOW", "Stream", "close_gaps_by", "judge_sequence"]

#: Sequence numbers count modulo 2**32 (NetFlow v5 and IPFIX count records, v9 and sFlow datagrams).
_SEQUENCE_SPACE = 1 << 32

#: How many more datagrams of a stream a gap in its sequence waits for a late datagram to fill it,
REORDER_WINDOW = 64
#: ... and for how long at most (receive time): reordering on a network is milliseconds, so a slow
#: exporter's loss is decided by its next datagram a minute on, not 64 datagrams (an hour) later.
REORDER_WAIT_US = 60_000_000
#: Open gaps a stream keeps at most (late datagrams can split a gap; the rest of a split waits whole).
_MAX_GAPS = 4 * REORDER_WINDOW
_RESTART_JUMP = 1 << 31


@dataclass
class Stream:
    """One export stream's sequence between datagrams (and batches): see ``judge_sequence``."""

    next: int | None  # the number the next datagram should carry; None: the last one's length is unknown
    seen: int = 0  # datagrams that moved the stream forward so far
    recent: list = field(default_factory=list)  # the first numbers of the last REORDER_WINDOW of those
    # open gaps: [first number, units, pane µs, ``seen`` when opened, receive µs of the datagram that revealed it]
    gaps: list = field(default_factory=list)
    uptime_ms: int | None = None  # the newest exporter uptime, when the decoder gives it
    candidate: list | None = None  # [number, units] of a datagram that may start a new sequence

    def copy(self) -> Stream:
        return Stream(self.next, self.seen, list(self.recent), [list(g) for g in self.gaps], self.uptime_ms,
                      None if self.candidate is None else list(self.candidate))

    def to_json(self) -> dict:
        return {"next": self.next, "seen": self.seen, "recent": self.recent, "gaps": self.gaps,
                "uptime_ms": self.uptime_ms, "candidate": self.candidate}

    @staticmethod
    def from_json(data) -> Stream:
        if isinstance(data, dict):
            return Stream(data["next"], int(data["seen"]), [int(x) for x in data["recent"]],
                          [[int(x) for x in g] + [0] * (5 - len(g)) for g in data["gaps"]], data.get("uptime_ms"),
                          data.get("candidate"))
        sequence, units = data  # before reordering was judged: (last sequence, its units)
        return Stream(None if units is None else (int(sequence) + int(units)) % _SEQUENCE_SPACE, 1, [int(sequence)])


def _count_losses(sequences: pa.Table, streams: dict, lost: dict[int, int]) -> None:
    """Judge each datagram's sequence number against its stream (``judge_sequence``), in order."""
    if sequences.num_rows == 0:
        return
    uptime = sequences.column("uptime_ms").to_pylist() if "uptime_ms" in sequences.column_names else \
        [None] * sequences.num_rows
    rows = zip(sequences.column("exporter").to_pylist(), sequences.column("format").to_pylist(),
               sequences.column("domain").to_pylist(), sequences.column("sequence").to_pylist(),
               sequences.column("units").to_pylist(),
               pc.cast(sequences.column("receive_ts"), pa.int64()).to_pylist(), uptime)
    for exporter, fmt, domain, sequence, units, received, up in rows:
        if sequence is None:
            continue
        key = (exporter, fmt, domain)
        streams[key] = judge_sequence(streams.get(key), sequence % _SEQUENCE_SPACE, units, received, lost,
                                      uptime_ms=up)


def judge_sequence(stream: Stream | None, sequence: int, units: int | None, received_us: int, lost: dict[int, int],
                   *, uptime_ms: int | None = None) -> Stream:
    """DESIGN §7a "Loss": what one datagram's export sequence number says; returns the stream after it.

    Numbers count modulo 2**32 (NetFlow v5 and IPFIX count records, v9 and sFlow datagrams).

    * A datagram that carries the number expected next continues the stream.
    * A datagram ahead of it by less than 2**31 opens a gap (the units between), which waits: a late
      datagram that arrives in it fills what it covers (reordering is not loss). A gap closes once
      ``REORDER_WINDOW`` (64) more datagrams have moved the stream forward, or ``REORDER_WAIT_US``
      (60 s, receive time) after the datagram that revealed it: a late datagram fills it only before
      both. What is still missing then is lost, counted in the pane of the datagram that revealed the
      gap, so the count per pane is the same however the datagrams fall into batches and whenever
      the gap is looked at next (a later datagram, or the end of a batch: ``close_gaps_by``).
    * A datagram behind it, in no open gap, among the numbers of the last ``REORDER_WINDOW``
      datagrams: a duplicate, nothing lost.
    * Anything else may be a restart: the number went back further, or jumped ahead by 2**31 or more
      (raw numbers: a restart from above 2**31 to 0 is not a wrap with 1.3 G lost). The next datagram
      decides: if it continues that number, a new sequence starts there and loses nothing (the old
      one's open gaps close); if it continues the old stream, the odd one was a stray (a datagram
      later than the window, a duplicate from long ago) and costs nothing. A gap that straddles the
      wrap at 2**32 is taken for a restart too. So is a datagram ahead whose exporter uptime (when
      the decoder gives it) went back by more than a minute, when the next datagram agrees.
    * A datagram whose length is unknown (``units`` None: some of its records could not be counted)
      leaves the next number unknown: the next datagram ahead of it continues the stream from its
      own number, no gap judged. Filling a gap, such a datagram fills it from its number to the
      gap's end.
    """
    if stream is None:
        return _advance(Stream(None), sequence, units, lost, uptime_ms, received_us)
    kind = _kind(stream, sequence, received_us)
    if kind in (_NEXT, _GAP) and uptime_ms is not None and stream.uptime_ms is not None and \
            stream.uptime_ms - uptime_ms > REORDER_WAIT_US // 1000:
        kind = _OTHER  # the exporter's uptime went back (more than reordering explains): a restart, if the next agrees
    if kind != _OTHER:
        stream.candidate = None
        return _act(stream, kind, sequence, units, received_us, lost, uptime_ms)
    if stream.candidate is not None:
        restarted = _advance(Stream(None), *stream.candidate, lost, None, None)
        kind = _kind(restarted, sequence, received_us)
        if kind in (_NEXT, _GAP):  # it continues the candidate: a restart
            _close(stream, lost, None, every=True)
            return _act(restarted, kind, sequence, units, received_us, lost, uptime_ms)
        if kind == _DUPLICATE:
            return stream
    stream.candidate = [sequence, units]
    return stream


_NEXT, _FILL, _DUPLICATE, _GAP, _OTHER = range(5)


def _kind(stream: Stream, sequence: int, received_us: int) -> int:
    """Where a number lies against a stream (``judge_sequence``): next, in a gap, a duplicate, ahead, or other."""
    if stream.gaps and any((sequence - gap[0]) % _SEQUENCE_SPACE < gap[1] and received_us - gap[4] < REORDER_WAIT_US
                           for gap in stream.gaps):
        return _FILL  # (in a gap, and in time: a gap a minute old is decided whenever it is next looked at)
    # Where the stream stands: the number expected next, or (the last length unknown) the last one's number.
    front = stream.recent[-1] if stream.next is None else stream.next
    if sequence == stream.next or (stream.next is None and 0 < sequence - front < _RESTART_JUMP):
        return _NEXT  # (after a datagram of unknown length, any number ahead: the gap cannot be judged)
    behind = (front - sequence) % _SEQUENCE_SPACE
    if behind <= (front - stream.recent[0]) % _SEQUENCE_SPACE and behind < _RESTART_JUMP:
        return _DUPLICATE
    if stream.next is not None and 0 < sequence - stream.next < _RESTART_JUMP:
        return _GAP
    return _OTHER


def _act(stream: Stream, kind: int, sequence: int, units: int | None, received_us: int, lost: dict[int, int],
         uptime_ms: int | None) -> Stream:
    if kind == _FILL:
        _fill(stream, sequence, units, received_us)
    elif kind == _GAP:
        missing, pane = sequence - stream.next, received_us // PANE_US * PANE_US
        if len(stream.gaps) < _MAX_GAPS:
            stream.gaps.append([stream.next, missing, pane, stream.seen, received_us])
        else:  # (bounded state: counted at once)
            lost[pane] = lost.get(pane, 0) + missing
    if kind in (_NEXT, _GAP):
        return _advance(stream, sequence, units, lost, uptime_ms, received_us)
    return stream


def _advance(stream: Stream, sequence: int, units: int | None, lost: dict[int, int], uptime_ms: int | None,
             received_us: int | None) -> Stream:
    """The stream moved forward by a datagram: its next number, its window, the gaps that leave it."""
    stream.next = None if units is None else (sequence + units) % _SEQUENCE_SPACE
    stream.seen += 1
    stream.recent.append(sequence)
    if len(stream.recent) > REORDER_WINDOW:
        del stream.recent[0]
    if uptime_ms is not None:
        stream.uptime_ms = uptime_ms
    if stream.gaps:
        _close(stream, lost, received_us)
    return stream


def close_gaps_by(streams: dict, now_us: int | None, lost: dict[int, int], *,
                  closed_before_us: int | None = None) -> None:
    """Count as lost the gaps of ``streams`` revealed ``REORDER_WAIT_US`` or more before ``now_us`` (the
    later of a batch's newest datagram and the watermark): no datagram can fill them any more, so a
    source that stops sending does not keep its last gap undecided for ever. The same count, in the
    same panes, as when a later datagram of the stream decides them (``judge_sequence``).

    With ``closed_before_us`` (the start of the hour the watermark after the batch lies in), the gaps
    revealed in a pane before it are decided too, however young: their hour is frozen next, and an
    hour's losses must be known when it is frozen (its completeness check counts them). A datagram
    that would have filled such a gap later counts as a duplicate; the loss stays with the hour."""
    if now_us is None and closed_before_us is None:
        return
    for stream in streams.values():
        if stream.gaps:
            _close(stream, lost, now_us, closed_before_us=closed_before_us)


def _close(stream: Stream, lost: dict[int, int], received_us: int | None, every: bool = False,
           closed_before_us: int | None = None) -> None:
    """Count the gaps that left the window (or all, at a restart; or those in a closed hour) as lost, in
    the panes that revealed them."""
    kept = []
    for gap in stream.gaps:
        first, units, pane, opened, revealed = gap
        if every or stream.seen - opened > REORDER_WINDOW or \
                (received_us is not None and received_us - revealed >= REORDER_WAIT_US) or \
                (closed_before_us is not None and pane < closed_before_us):
            lost[pane] = lost.get(pane, 0) + units
        else:
            kept.append(gap)
    stream.gaps = kept


def _fill(stream: Stream, sequence: int, units: int | None, received_us: int) -> bool:
    """Remove what a late datagram covers from the open gaps it is in time for; whether it fell in one."""
    for i, (first, length, pane, opened, revealed) in enumerate(stream.gaps):
        offset = (sequence - first) % _SEQUENCE_SPACE
        if offset >= length or received_us - revealed >= REORDER_WAIT_US:
            continue
        covered = length - offset if units is None else min(units, length - offset)
        if covered == 0:  # (a datagram of no records fills nothing)
            return True
        pieces = [[first, offset, pane, opened, revealed]] if offset else []
        if offset + covered < length:
            pieces.append([(first + offset + covered) % _SEQUENCE_SPACE, length - offset - covered, pane, opened,
                           revealed])
        if len(stream.gaps) - 1 + len(pieces) > _MAX_GAPS:
            return True  # (bounded state: a late datagram that would split one gap too many fills nothing)
        stream.gaps[i:i + 1] = pieces
        return True
    return False
