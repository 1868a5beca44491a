"""Rows for other tools: CSV, JSON lines or Parquet, for ``traffic show|top|bill --format`` and ``traffic export``.

One place turns an Arrow table into each machine format, so every command writes the same shapes
(docs/exports.md): every column of the rows, exact values (integers as integers, rates as the doubles
stored), times in ISO-8601 UTC as ``2026-11-01T10:00:00+00:00`` (``.ffffff`` only when a time has
microseconds, as Python's ``isoformat`` writes them), dates as ``2026-11-01``; JSON is one object a
line. A file (``--out``) is written under a temporary name in its folder, synced and renamed, so a
reader never sees half of one; that rename would replace a FIFO or a device file with a regular
file, so ``--out`` onto anything but a regular file (or a new name) is refused before any work.

``traffic export`` streams a table's range one storage key at a time (an hour, a day, a month, or a
merged day or month: a table's file group, asked of the Delta layer by period), so its memory is
that of one key's rows whatever the range. By default it writes final rows of published periods
only (the ledger's ``dq_status``, judged by ``is_published``); ``include_open`` adds the rows of
periods not closed yet. A period that failed its checks is never exported: accept it first.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from traffic.core.periods import as_utc, day_start, hours_between, is_published, month_start, period_end
from traffic.core.settings import SettingsError
from traffic.core.text import human_bytes, printable
from traffic.storage import state as st
from traffic.storage.table import StorageError, Table
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc
#: The machine formats (``table``, the text one, is the commands' own).
FORMATS = ("csv", "json", "parquet")
#: How every time is written: UTC, with its offset spelled out (what ``datetime.isoformat`` gives).
UTC_SUFFIX = "+00:00"
_NEEDS_JSON_ESCAPE = r'[\x00-\x1f"\\]'


@dataclass(frozen=True)
class Exportable:
    """How one table is exported: the time column ``--from/--to`` applies to, the order of its rows, and
    (for accounting tables) the ledger period each row belongs to."""

    time: str
    order: tuple[str, ...] = ()  # after the time column: a stable order within one time
    period: str | None = None  # the column naming the row's period (floored to ``grain``)
    grain: str | None = None  # that period's ledger grain: hour, day or month
    status: bool = False  # rows carry ``status`` open/final


#: The tables ``traffic export`` writes. The accounting outputs are gated by the ledger; the pipeline's own
#: records (the ledger itself, late and rejected records, batches, check results, and bills and alerts, which
#: are stored only once their hours are final and published) are written as they are. ``clocks`` and
#: ``flow_state`` are state, not rows over time. Each time column is one the table's files are keyed by (or
#: whose floor is), so a range reads only the keys it covers; ``batches`` has no key and is read whole.
EXPORTS = {
    "hourly": Exportable("hour", ("local_ip", "remote_ip"), "hour", "hour", status=True),
    "daily": Exportable("day", ("local_ip", "remote_ip"), "day", "day"),
    "monthly": Exportable("month", ("local_ip", "remote_ip"), "month", "month"),
    "panes": Exportable("pane_start", ("source", "account", "direction"), "hour", "hour", status=True),
    "source_panes": Exportable("pane_start", ("source",), "pane_start", "hour"),
    "packets": Exportable("ts", ("source", "local_ip", "remote_ip", "local_port", "remote_port", "protocol"),
                          "hour", "hour"),
    "late_packets": Exportable("ts", ("source", "local_ip", "remote_ip", "local_port", "remote_port", "protocol")),
    "rejects": Exportable("hour", ("batch_id", "source", "input_file")),
    "periods": Exportable("period_start", ("grain",)),
    "bills": Exportable("period_start", ("account",)),
    "alerts": Exportable("period_start", ("hour", "account", "kind")),
    "batches": Exportable("started_at", ("batch_id",)),
    "dq_results": Exportable("period_start", ("table", "grain", "suite", "expectation")),
}


@dataclass
class Written:
    """What one write produced: rows, bytes, where, and (for ``export``) what it read and left out."""

    rows: int = 0
    bytes: int = 0
    path: Path | None = None  # None: the stream (stdout)
    periods: int = 0  # periods of the table's key grain read (hours, days or months)
    left_open: int = 0  # rows of periods not closed yet, left out
    left_unpublished: int = 0  # rows of periods that failed their checks, left out

    def where(self) -> str:
        return printable(self.path) if self.path is not None else "stdout"


# -- output --------------------------------------------------------------------------------------

def output_path(fmt: str, out: str | os.PathLike | None) -> Path | None:
    """The file ``--out`` names, checked before any work (None: the stream); a one-line error otherwise."""
    if fmt not in FORMATS:
        raise SettingsError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if out in (None, ""):
        if fmt == "parquet":
            raise SettingsError("--format parquet writes a binary file, not text for a terminal: give --out PATH")
        return None
    path = Path(out).absolute()
    if path.is_dir():
        raise SettingsError(f"--out {out}: is a folder; give the file's name")
    if not path.parent.is_dir():
        raise SettingsError(f"--out {out}: folder {path.parent} does not exist")
    _refuse_special_file(path, out)
    return path


#: What a file that is not a regular one is, for the error (``stat.S_IFMT`` of its mode).
_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}


def _refuse_special_file(path: Path, out) -> None:
    """A file is written under a temporary name and renamed over ``out``: onto a FIFO or a device that
    would replace it with a regular file (``/dev/null`` too, for root), so only a regular file (or
    nothing) may be there. A symbolic link is judged by what it points at."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError:  # a dangling or looping link, a folder we may not search: the write says why
        return
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a plain file")
        raise SettingsError(f"--out {out}: is {kind}, not a regular file; writing would replace it (give a file's "
                            f"name, or leave --out out to write to stdout)")


class _Counted:
    """A binary sink that counts what passes; Arrow's writers may close it, the owner closes the file."""

    def __init__(self, raw):
        self.raw = raw
        self.count = 0
        self.closed = False
        self.discard = False  # after an abort: a writer's last words go nowhere

    def write(self, data) -> int:
        view = memoryview(data)
        if self.discard:
            return view.nbytes
        self.raw.write(view)
        self.count += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


class RowWriter:
    """Writes tables of one schema as CSV, JSON lines or Parquet: to ``out`` atomically, else to ``stream``.

    Use it as a context manager: leaving it normally renames the finished file into place; leaving it on
    an error removes the temporary file and leaves whatever was at ``out`` before untouched.
    """

    def __init__(self, fmt: str, schema: pa.Schema, out: Path | None = None, stream=None):
        self.fmt, self.schema, self.out = fmt, schema, out
        self.temp = None
        if out is not None:
            self.temp = out.parent / f".{out.name}.{uuid.uuid4().hex[:12]}.tmp"
            self.file = open(self.temp, "xb")
        else:
            stream = stream if stream is not None else sys.stdout
            if hasattr(stream, "buffer"):
                stream.flush()
                stream = stream.buffer
            self.file = stream
        # CSV text to a terminal shows control characters escaped, as every command does (core.text).
        self.escape = out is None and fmt == "csv" and _isatty(self.file)
        self.sink = _Counted(self.file)
        self.written = Written(path=out)
        self._writer = None

    def write(self, table: pa.Table) -> None:
        """Append the rows of ``table`` (columns in the writer's schema's order)."""
        table = table.select(self.schema.names).cast(self.schema)
        if self.fmt == "parquet":
            if table.num_rows:
                self._open().write_table(table)
        elif self.fmt == "csv":
            if table.num_rows:
                self._open().write_table(csv_columns(table, self.escape))
        else:
            for batch in table.to_batches(max_chunksize=65_536):
                self.sink.write("".join(json_lines(pa.Table.from_batches([batch], self.schema))).encode())
        self.written.rows += table.num_rows

    def _open(self):
        if self._writer is None:
            if self.fmt == "parquet":
                self._writer = pq.ParquetWriter(self.sink, self.schema)
            else:
                self._writer = pacsv.CSVWriter(self.sink, csv_columns(self.schema.empty_table(), self.escape).schema)
        return self._writer

    def finish(self) -> Written:
        """Close the format (a CSV header and a Parquet footer even for no rows); rename the file into place."""
        if self.fmt != "json":
            self._open().close()
        self.file.flush()
        self.written.bytes = self.sink.count
        if self.temp is not None:
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.temp, self.out)
            self.temp = None
            folder = os.open(self.out.parent, os.O_RDONLY)
            try:
                os.fsync(folder)  # the rename itself survives a crash
            finally:
                os.close(folder)
        return self.written

    def abort(self) -> None:
        """Give up: the temporary file is removed; what the stream got stays (a reader sees an error too)."""
        self.sink.discard = True
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - the error that made us give up is the one to report
                pass
            self._writer = None
        if self.temp is not None:
            self.file.close()
            self.temp.unlink(missing_ok=True)
            self.temp = None

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.finish()
        else:
            self.abort()


def _isatty(file) -> bool:
    try:
        return os.isatty(file.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def write_rows(table: pa.Table, fmt: str, out: Path | None = None, stream=None) -> Written:
    """``traffic show|top|bill --format``: one table in a machine format, to ``out`` or the stream."""
    out = output_path(fmt, out)
    with RowWriter(fmt, table.schema, out, stream) as writer:
        writer.write(table)
    return writer.written


def rows_table(rows: list[dict], schema: pa.Schema, **constants) -> pa.Table:
    """Row dicts as a table: the type of a column ``schema`` names comes from it, any other is inferred, so
    columns a row gains later are written without a change here; ``constants`` are columns with one value on
    every row (a bill's ``final`` and ``stored``)."""
    names = list(dict.fromkeys(name for row in rows for name in row)) or schema.names
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        columns[name] = pa.array(values, schema.field(name).type) if name in schema.names else pa.array(values)
    for name, value in constants.items():
        columns[name] = pa.array([value] * len(rows), pa.scalar(value).type)
    return pa.table(columns)


# -- formats -------------------------------------------------------------------------------------

def iso_times(column) -> pa.Array:
    """Times as ``2026-11-01T10:00:00+00:00`` (``.ffffff`` when not on a whole second), in UTC."""
    column = column.cast(pa.timestamp("us", tz="UTC"))
    seconds = pc.floor_temporal(column, unit="second")
    stamp = pc.strftime(seconds.cast(pa.timestamp("s", tz="UTC")), format="%Y-%m-%dT%H:%M:%S")
    micros = pc.subtract(column.cast(pa.int64()), seconds.cast(pa.int64()))
    fraction = pc.if_else(pc.equal(micros, 0), "",
                          pc.binary_join_element_wise(".", pc.utf8_lpad(micros.cast(pa.string()), 6, "0"), ""))
    return pc.binary_join_element_wise(stamp, fraction, UTC_SUFFIX, "")


def _plain(value):
    """A nested value's parts as JSON takes them (times and dates in the same ISO form)."""
    if isinstance(value, datetime):
        return as_utc(value).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _json_text(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_plain)


def _nested_text(column) -> pa.Array:
    """A list or struct column as one JSON text per value (null stays null)."""
    return pa.array([_json_text(v) for v in column.to_pylist()], pa.string())


def csv_columns(table: pa.Table, escape: bool = False) -> pa.Table:
    """The table as CSV writes it: times in ISO form, a list or struct as its JSON text; with ``escape``
    (a terminal), control characters in text shown as escapes."""
    columns, fields = [], []
    for field, column in zip(table.schema, table.columns):
        if pa.types.is_timestamp(field.type):
            column = iso_times(column)
        elif pa.types.is_nested(field.type):
            column = _nested_text(column)
        if escape and pa.types.is_string(column.type):
            column = pa.array([None if v is None else printable(v) for v in column.to_pylist()], pa.string())
        columns.append(column)
        fields.append(pa.field(field.name, column.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _json_cells(column, kind: pa.DataType) -> pa.Array:
    """Each value of a column as JSON text, null as ``null``."""
    if pa.types.is_integer(kind):
        cells = column.cast(pa.string())
    elif pa.types.is_boolean(kind):
        cells = pc.if_else(column, "true", "false")
    elif pa.types.is_floating(kind):  # Python's repr: the shortest text that reads back as the same double
        cells = pa.array([_json_text(v if v is None or math.isfinite(v) else None) for v in column.to_pylist()],
                         pa.string())
    elif pa.types.is_timestamp(kind):
        cells = pc.binary_join_element_wise('"', iso_times(column), '"', "")
    elif pa.types.is_date(kind):
        cells = pc.binary_join_element_wise('"', column.cast(pa.string()), '"', "")
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if len(column) and pc.any(pc.match_substring_regex(column, _NEEDS_JSON_ESCAPE)).as_py():
            cells = pa.array([_json_text(v) for v in column.to_pylist()], pa.string())
        else:
            cells = pc.binary_join_element_wise('"', column, '"', "")
    else:
        cells = _nested_text(column)
    return pc.fill_null(cells, "null")


def json_lines(table: pa.Table) -> list[str]:
    """One JSON object per row, each ending in a newline, keys in column order."""
    if not table.num_rows:
        return []
    parts = []
    for position, (field, column) in enumerate(zip(table.schema, table.columns)):
        parts += [("{" if position == 0 else ",") + json.dumps(field.name) + ":",
                  _json_cells(column.combine_chunks(), field.type)]
    return pc.binary_join_element_wise(*parts, "}\n", "").to_pylist()


# -- traffic export ------------------------------------------------------------------------------

def exportable(name: str) -> Exportable:
    """How ``name`` is exported; a one-line error naming the choices for any other table."""
    if name not in EXPORTS:
        raise SettingsError(f"--table {name!r}: not a table export writes; choose one of {', '.join(EXPORTS)}")
    return EXPORTS[name]


@dataclass(frozen=True)
class Publication:
    """What the ledger says of each closed period (its ``dq_status``), and where the frozen hours end."""

    status: dict
    frontier: datetime | None

    @classmethod
    def read(cls, warehouse: Warehouse) -> "Publication":
        ledger = st.read_ledger(warehouse, columns=st.LEDGER_STATUS)
        return cls({(r["grain"], r["period_start"]): r["dq_status"] for r in ledger}, st.frozen_frontier(ledger))

    def state(self, grain: str, start: datetime) -> str:
        """``published``, ``unpublished`` (it failed its checks) or ``open`` (not closed: no ledger row yet).

        An hour before the freeze frontier without a ledger row lies before the first hour (clock ticks
        before the first packet): no period the ledger holds back, so it counts as published.
        """
        status = self.status.get((grain, start))
        if status is not None:
            return "published" if is_published(status) else "unpublished"
        if grain == "hour" and self.frontier is not None and start < self.frontier:
            return "published"
        return "open"


def _floor(moment: datetime, grain: str) -> datetime:
    if grain == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    return day_start(moment.date()) if grain == "day" else month_start(moment)


def _ceil(moment: datetime, grain: str) -> datetime:
    floor = _floor(moment, grain)
    return floor if floor == moment else period_end(floor, grain)


def _periods(grain: str, start: datetime, end: datetime) -> list[datetime]:
    """The periods of ``grain`` that start in ``[start, end)`` (``start`` on a boundary)."""
    if grain == "hour":
        return hours_between(start, end)
    found = []
    while start < end:
        found.append(start)
        start = period_end(start, grain)
    return found


#: A table keyed by hour merges each finished day into one file, a table keyed by day each finished month.
_SPAN = {"hour": "day", "day": "month", "month": "month"}


def _blocks(table: Table, start: datetime, end: datetime) -> Iterator[list[datetime]]:
    """The key periods of ``[start, end)`` one span (the day of hours, the month of days, or one month) at a time,
    only spans the table holds files of when the Delta layer can say so."""
    grain = table.cluster.grain
    span = _SPAN[grain]
    lo, hi = _floor(start, grain), _ceil(end, grain)
    spans = table.files_by_span(lo) if grain in ("hour", "day") else None
    firsts = [s for s in spans if s < hi] if spans is not None else _periods(span, _floor(lo, span), hi)
    for first in firsts:
        if grain == "month":
            yield [first]
        else:
            yield _periods(grain, max(first, lo), min(period_end(first, span), hi))


def _file_groups(table: Table, periods: list[datetime]) -> list[list[datetime]]:
    """The periods read together: each period with files of its own alone, or all of them when a merged
    file (a whole day or month) holds them, so that file is read once."""
    wanted = {table.key_of(p): p for p in periods}
    files = table.files(keys=periods)
    if any(f.key not in wanted for f in files):
        return [periods]
    held = {f.key for f in files}
    return [[p] for key, p in wanted.items() if key in held]


def _chunks(table: Table, start: datetime, end: datetime) -> Iterator[tuple[list, datetime | None, pa.Table]]:
    """(periods read, end of the span read so far, rows) for one file group at a time, in time order."""
    if table.cluster is None:  # a table without a key (batches) is small by nature: a row per batch
        yield [], None, table.read_arrow()
        return
    for block in _blocks(table, start, end):
        through = period_end(block[-1], table.cluster.grain) if block else None
        for group in _file_groups(table, block):
            yield group, through, table.read_arrow(keys=group)


def _in_range(rows: pa.Table, column: str, start: datetime, end: datetime) -> pa.Table:
    """Rows whose ``column`` is in ``[start, end)``; a day or month (a date) is in it when it starts in it."""
    values = rows.column(column)
    if pa.types.is_date(values.type):
        lo, hi = _ceil(start, "day").date(), _ceil(end, "day").date()
        bounds = pa.scalar(lo, values.type), pa.scalar(hi, values.type)
    else:
        bounds = pa.scalar(start, values.type), pa.scalar(end, values.type)
    return rows.filter(pc.and_(pc.greater_equal(values, bounds[0]), pc.less(values, bounds[1])))


def _final_rows(rows: pa.Table, spec: Exportable, publication: Publication, include_open: bool
                ) -> tuple[pa.Table, int, int]:
    """The rows to write, and how many were left out as open and as unpublished."""
    if spec.grain is None or not rows.num_rows:
        return rows, 0, 0
    periods = rows.column(spec.period)
    if pa.types.is_timestamp(periods.type):
        periods = pc.floor_temporal(periods, unit=spec.grain)
    states = {}
    for value in pc.unique(periods).to_pylist():
        start = day_start(value) if not isinstance(value, datetime) else value.astimezone(UTC)
        states.setdefault(publication.state(spec.grain, start), []).append(value)
    failed = pc.is_in(periods, pa.array(states.get("unpublished", []), periods.type))
    opened = pc.is_in(periods, pa.array(states.get("open", []), periods.type))
    if spec.status:
        opened = pc.or_(opened, pc.equal(rows.column("status"), "open"))
    drop = pc.or_(failed, opened) if not include_open else failed
    unpublished = pc.sum(failed).as_py() or 0
    left_open = (pc.sum(pc.and_(opened, pc.invert(failed))).as_py() or 0) if not include_open else 0
    return rows.filter(pc.invert(drop)), left_open, unpublished


def export_table(warehouse: Warehouse, name: str, start: datetime, end: datetime, fmt: str, out: Path | None,
                 include_open: bool = False, progress: Callable[[str], None] | None = None, stream=None,
                 progress_every: float = 5.0) -> Written:
    """Write ``name``'s rows with its time column in ``[start, end)``, in time order, one file group at a time."""
    spec = exportable(name)
    out = output_path(fmt, out)
    if start is None or end is None or start >= end:
        raise SettingsError(f"--from {start:%Y-%m-%d %H:%M:%S} is not before --to {end:%Y-%m-%d %H:%M:%S}"
                            if start is not None and end is not None else "export needs --from and --to")
    if not warehouse.exists():
        raise StorageError(f"no warehouse at {warehouse.root} yet (run `traffic ingest` or `traffic demo`)")
    table = warehouse.table(name)
    publication = Publication.read(warehouse) if spec.grain else None
    order = [(spec.time, "ascending"), *((c, "ascending") for c in spec.order)]
    unit = f"{table.cluster.grain}(s)" if table.cluster else "periods"
    said = time.monotonic()
    with RowWriter(fmt, table.arrow_schema, out, stream) as writer:
        written = writer.written
        for group, through, rows in _chunks(table, start, end):
            rows, left_open, unpublished = _final_rows(_in_range(rows, spec.time, start, end), spec, publication,
                                                       include_open)
            writer.write(rows.sort_by(order))
            written.periods += len(group)
            written.left_open += left_open
            written.left_unpublished += unpublished
            del rows  # one group's rows at a time
            if progress is not None and through is not None and time.monotonic() - said >= progress_every:
                progress(f"export {name}: {written.rows:,} rows of {written.periods:,} {unit} written "
                         f"({human_bytes(writer.sink.count)}), through {min(through, end):%Y-%m-%d %H:%M} …")
                said = time.monotonic()
    return written


def summary(name: str, start: datetime, end: datetime, written: Written) -> str:
    """The one line ``traffic export`` ends with."""
    left = [f"{count:,} {what}" for count, what in ((written.left_open, "open row(s)"),
                                                    (written.left_unpublished, "row(s) of failed periods")) if count]
    return (f"export: {written.rows:,} rows of {name} from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC, "
            f"{human_bytes(written.bytes)} ({written.bytes:,} bytes) written to {written.where()}"
            + (f"; left out: {', '.join(left)}" if left else ""))
