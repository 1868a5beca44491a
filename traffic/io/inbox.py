"""The inbox: which files are new, who sent them, and what part of them is still to be counted.

A file is keyed by (source, sha256 of its content). Conventions a sender follows:

* write to a hidden name (``.name``) or one ending in ``.tmp``/``.part``/``.partial`` and
  rename when complete; such files are never taken (``min_file_age`` adds a quiet period);
* ``inbox/<source>/…`` gives the source; files directly in the inbox are ``default``.

Appending to an already counted file counts only the new tail when the counted content is
an unchanged prefix; any other change to a counted file is rejected whole, with a reason.

Only regular files inside the inbox are read (a link counts when it resolves to one); links
that leave the inbox, FIFOs, sockets and devices are never opened, only recorded by name. A
text file's unterminated last line waits until it is terminated, or until the file has been
unchanged for ``partial_line_grace``. Planning pins what each parse task reads: the exact byte
range and its sha256, which the task checks before it counts anything.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass, replace
from pathlib import Path

from traffic.core.location import is_object_url
from traffic.io.files import PieceChanged, open_regular, size_and_mtime
from traffic.core.records import source_problem
from traffic.core.settings import Settings
from traffic.io.readers import CAPTURE, CSV_HEADER, FLOWS, FLOWS_SUFFIX, ROUTER_FEED, detect_format

ACCOUNTED = "accounted"
DUPLICATE = "duplicate"
APPENDED = "appended"
CHANGED = "rejected"
REPLAYED = "replayed"
SKIPPED = "skipped"  # not a regular file inside the inbox: never opened
UNREADABLE = "unreadable"  # the operating system refused to open it
VANISHED = "vanished"  # gone before its batch read it
RETRY = "retry"  # its bytes changed between planning and reading: taken again by the next batch
TO_READ = (ACCOUNTED, APPENDED, REPLAYED)
#: Outcomes that are not final: the file is looked at again when it next appears unchanged.
NOT_FINAL = (UNREADABLE, VANISHED, RETRY)
_INCOMPLETE_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload")


class InboxError(RuntimeError):
    """The inbox cannot be read; the message says why."""


@dataclass(frozen=True)
class InboxFile:
    """One file of the inbox and what this batch does with it."""

    name: str  # path relative to the inbox
    path: str  # absolute path
    source: str
    size: int
    mtime_ns: int
    sha256: str = ""
    status: str = ACCOUNTED
    start: int = 0  # first byte still to count (appended files)
    note: str = ""
    format: str = ""  # readers' format name, decided when planned
    header: str = ""  # a header CSV's header line, for a task that reads an appended tail
    pieces: tuple = ()  # (start, end, sha256) per parse task: exactly the bytes each one reads


def scan(inbox: Path | str, min_age_seconds: float = 0.0, now: float | None = None) -> list[InboxFile]:
    """Complete files of the inbox, sorted by name (hidden and in-progress names are skipped).

    Entries that are not regular files inside the inbox (links leading out of it, dangling
    links, FIFOs, sockets, devices, links to folders) come back with status ``skipped`` and a
    note: they are recorded by name and never opened. An ``s3://`` inbox is scanned by listing
    its objects (``scan_objects``).
    """

    if is_object_url(str(inbox)):
        return scan_objects(str(inbox), min_age_seconds, now)
    inbox = Path(inbox)
    if not inbox.exists():
        raise InboxError(f"inbox {inbox} does not exist (create it, or set TRAFFIC_INBOX / --inbox)")
    if not inbox.is_dir():
        raise InboxError(f"inbox {inbox} is not a directory")
    now = time.time() if now is None else now
    root_real = os.path.realpath(inbox)
    found = []
    for root, dirs, files in os.walk(inbox):
        names = sorted(d for d in dirs if not d.startswith((".", "_")))
        dirs[:] = [d for d in names if not os.path.islink(os.path.join(root, d))]
        linked_dirs = [d for d in names if d not in dirs]
        for name in sorted([*files, *linked_dirs]):
            if not _taken(name):
                continue
            path = Path(root) / name
            relative = path.relative_to(inbox)
            source = relative.parts[0] if len(relative.parts) > 1 else "default"
            try:
                info = os.lstat(path)
            except FileNotFoundError:  # gone since the folder was listed
                continue
            target, problem = str(path), _not_regular(path, info, root_real)
            if problem is None and stat.S_ISLNK(info.st_mode):
                target = os.path.realpath(path)
                info = os.stat(target)
            if problem is None:
                problem = source_problem(source)
                if problem is not None:
                    problem = f"inbox folder {problem}"
            if problem is not None:
                found.append(InboxFile(relative.as_posix(), str(path), source, 0, info.st_mtime_ns,
                                       status=SKIPPED, note=problem))
                continue
            if now - info.st_mtime < min_age_seconds:
                continue
            found.append(InboxFile(relative.as_posix(), target, source, info.st_size, info.st_mtime_ns))
    return found


def scan_objects(url: str, min_age_seconds: float = 0.0, now: float | None = None) -> list[InboxFile]:
    """``scan`` of an inbox on object storage: its objects by key, with the names a folder's scan takes.

    A key is a file's path: ``<source>/<name>`` gives the source, a segment starting with ``.`` or ``_``
    or a name ending like an upload in progress is not taken, and an object is young by its
    last-modified time. Uploads are whole objects, so no object is ever read half-written.
    """
    from traffic.io.objects import addressable, list_objects  # deferred: only an inbox on object storage needs obstore

    now = time.time() if now is None else now
    try:
        listed = list_objects(url)  # an absent prefix lists empty
    except Exception as error:  # noqa: BLE001 - the store's errors say in their text what went wrong
        raise InboxError(f"inbox {url} cannot be listed: {str(error).splitlines()[0][:300]}") from None
    found = []
    for entry in listed:
        parts = entry.name.split("/")
        if any(p.startswith((".", "_")) for p in parts[:-1]) or not _taken(parts[-1]):
            continue
        source = parts[0] if len(parts) > 1 else "default"
        problem = source_problem(source)
        if problem is not None:
            problem = f"inbox folder {problem}"
        elif not addressable(entry.name):
            problem = ("its key has a control character or an empty, '.' or '..' folder name, which the object "
                       "store client cannot read: never read")
        if problem is not None:
            found.append(InboxFile(entry.name, entry.url, source, 0, entry.mtime_ns, status=SKIPPED, note=problem))
            continue
        if now - entry.mtime_ns / 1e9 < min_age_seconds:
            continue
        found.append(InboxFile(entry.name, entry.url, source, entry.size, entry.mtime_ns))
    return found


def _taken(name: str) -> bool:
    """Whether a file name is one the inbox takes (not hidden, not an upload in progress)."""
    return not name.startswith((".", "_")) and not name.lower().endswith(_INCOMPLETE_SUFFIXES)


def _not_regular(path: Path, info: os.stat_result, root_real: str) -> str | None:
    """Why an inbox entry is not taken (it is not a regular file inside the inbox), or None."""
    if stat.S_ISREG(info.st_mode):
        return None
    if not stat.S_ISLNK(info.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file")
        return f"not a regular file ({kind}): never read"
    target = os.path.realpath(path)
    if os.path.commonpath([root_real, target]) != root_real:
        return "a link to a place outside the inbox: never read"
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return "a dangling link: never read"
    if not stat.S_ISREG(mode):
        return "a link to something that is not a regular file: never read"
    return None


def sha256_of(path: str, limit: int | None = None) -> str:
    """Hex sha256 of a file's content (of its first ``limit`` bytes when given)."""
    digest = hashlib.sha256()
    remaining = limit
    with open_regular(path) as handle:
        while True:
            size = 8 << 20 if remaining is None else min(8 << 20, remaining)
            if size == 0:
                break
            block = handle.read(size)
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Cutting:
    """How the bytes a batch counts are cut into parse tasks, and when an unterminated line is taken."""

    split_bytes: int = 64 << 20
    parallelism: int = 1
    slots: int = 1
    partial_line_grace: float = 300.0  # seconds a file must stay unchanged before its unterminated line counts
    telemetry_sources: frozenset = frozenset()  # sources whose captures hold export datagrams (DESIGN §7a)


def cutting(settings: Settings, slots: int) -> Cutting:
    """How this warehouse's batches cut files into parse tasks, given the task ``slots`` Spark offers."""
    return Cutting(split_bytes=settings.split_bytes, parallelism=settings.shuffle_partitions, slots=slots,
                   partial_line_grace=settings.partial_line_grace.total_seconds(),
                   telemetry_sources=frozenset(settings.telemetry_sources))


#: A piece is never cut smaller than this (below it, a task's fixed cost dominates).
MIN_SPLIT_BYTES = 4 * 1024 * 1024


def piece_bytes(size: int, split_bytes: int, parallelism: int) -> int:
    """Bytes per parse task of a text file: at most ``split_bytes``, in equal pieces.

    A file a little over ``split_bytes`` would otherwise be one full task and a sliver (one core
    does all the work); a file of several MiB is spread over ``parallelism`` tasks, never into
    pieces under ``MIN_SPLIT_BYTES``.
    """
    pieces = max(-(-size // split_bytes), min(parallelism, size // MIN_SPLIT_BYTES), 1)
    rounds = -(-pieces // parallelism) * parallelism  # whole rounds: 11 tasks on 2 cores idle one for the last
    if pieces > parallelism and size // rounds >= MIN_SPLIT_BYTES:
        pieces = rounds
    return max(1, -(-size // pieces))


def survey(f: InboxFile, cutting: Cutting) -> tuple[InboxFile, str]:
    """``f`` with its format, the end of what can be counted now, its sha256 and its pieces, and
    the sha256 of its first ``f.start`` bytes (the part counted before, for the append rule).

    One read of the file. A text file's pieces start and end on line boundaries and each carries
    the sha256 of its bytes; a capture's pieces are byte ranges that each decode the frames
    starting in them, checked against the whole file's sha256 (each task reads it all). An
    unterminated last line is left out (``size`` stops after the last newline) while the file
    is younger than the grace period. OSError when the file cannot be read.
    """

    with open_regular(f.path) as handle:
        file_size, file_mtime = size_and_mtime(handle)
        head = handle.read(4096)
        fmt = detect_format(f.name, head)
        if fmt == CAPTURE and (f.name.lower().endswith(FLOWS_SUFFIX) or f.source in cutting.telemetry_sources):
            fmt = FLOWS  # one task reads all of a source's telemetry files of a batch, in order (templates)
        end = min(f.size, file_size)
        if fmt not in (CAPTURE, FLOWS) and end > f.start and time.time() - file_mtime < cutting.partial_line_grace:
            end = _after_last_newline(handle, f.start, end)
        cuts = [f.start, end]
        if fmt == CAPTURE and end - f.start >= 2 * MIN_SPLIT_BYTES:
            length, n = end - f.start, cutting.slots
            cuts = [f.start + length * i // n for i in range(n + 1)]
        elif fmt == ROUTER_FEED and end > f.start:
            step = piece_bytes(end - f.start, cutting.split_bytes, cutting.parallelism)
            cuts = sorted({f.start, end, *(_line_start(handle, c, end) for c in range(f.start + step, end, step))})
        if end == f.start < f.size:  # nothing complete beyond what was counted before: no need to read it
            return replace(f, format=fmt, size=end), ""
        header = b""
        if fmt == CSV_HEADER and f.start > 0:
            handle.seek(0)
            header = handle.read(min(f.start, 1 << 16)).split(b"\n", 1)[0]
        spans = list(zip(cuts, cuts[1:]))
        whole, prefix, *parts = _hash_ranges(handle, [(0, end), (0, f.start), *spans])
    pieces = tuple((a, b, whole if fmt in (CAPTURE, FLOWS) else digest) for (a, b), digest in zip(spans, parts))
    return replace(f, format=fmt, size=end, sha256=whole, pieces=pieces,
                   header=header.decode("utf-8", "replace")), prefix


def _after_last_newline(handle, start: int, end: int) -> int:
    """The offset just after the last newline in ``[start, end)`` (``start`` when there is none)."""
    position = end
    while position > start:
        block = min(1 << 20, position - start)
        handle.seek(position - block)
        found = handle.read(block).rfind(b"\n")
        if found >= 0:
            return position - block + found + 1
        position -= block
    return start


def _line_start(handle, offset: int, end: int) -> int:
    """The first line boundary at or after ``offset`` (a line belongs to the piece its first byte is in)."""
    handle.seek(offset - 1)
    position = offset - 1
    while position < end:
        block = handle.read(min(1 << 20, end - position))
        if not block:
            break
        found = block.find(b"\n")
        if found >= 0:
            return min(end, position + found + 1)
        position += len(block)
    return end


def _hash_ranges(handle, ranges: list[tuple[int, int]]) -> list[str]:
    """The sha256 of each byte range of the file, in one read of it (ranges may overlap).

    The first range (the whole content) is hashed on a second thread while this one hashes the
    others: ``hashlib`` releases the GIL, so planning costs one hash of the file, not two.
    """
    from concurrent.futures import ThreadPoolExecutor

    end = max((b for _, b in ranges), default=0)
    digests = [hashlib.sha256() for _ in ranges]
    handle.seek(0)
    position = 0
    with ThreadPoolExecutor(1) as helper:
        pending = None
        while position < end:
            block = handle.read(min(8 << 20, end - position))
            if not block:
                raise PieceChanged(f"{handle.name} is shorter than planned ({position} of {end} bytes)")
            if pending is not None:
                pending.result()
            (a, b), rest = ranges[0], zip(digests[1:], ranges[1:])
            pending = helper.submit(digests[0].update, block[max(0, a - position): b - position])
            for digest, (a, b) in rest:
                if a < position + len(block) and b > position:
                    digest.update(block[max(0, a - position): b - position])
            position += len(block)
        if pending is not None:
            pending.result()
    return [d.hexdigest() for d in digests]


def unhandled(found: list[InboxFile], known: list[dict]) -> list[InboxFile]:
    """The found files no earlier batch has handled as they are now (same name, size and mtime).

    A file whose last outcome was not final (unreadable, vanished, changed while read) is looked
    at again; a skipped entry is recorded once.
    """
    handled = {(k["source"], k["name"], k["size"], k.get("mtime_ns")) for k in known
               if k["status"] not in NOT_FINAL}
    return [f for f in found if (f.source, f.name, f.size, f.mtime_ns) not in handled]


def plan_files(found: list[InboxFile], known: list[dict], cutting: Cutting | None = None) -> list[InboxFile]:
    """Decide each found file's fate against what earlier batches recorded (``batches.files``).

    Files already handled under the same name, size and mtime are left out without being
    read again, so a batch costs what is new, not what the inbox has accumulated.
    """
    cutting = cutting or Cutting()
    # Content replayed for a time range counts as seen: a later delivery of it must not count that range twice.
    by_content = {(k["source"], k["sha256"]) for k in known if k["status"] in TO_READ}
    latest_by_name: dict[tuple[str, str], dict] = {}
    unreadable = {(k["source"], k["name"], k["size"], k.get("mtime_ns")) for k in known if k["status"] == UNREADABLE}
    for k in known:
        if k["status"] in (ACCOUNTED, APPENDED):
            latest_by_name[(k["source"], k["name"])] = k
    planned: list[InboxFile] = []
    seen_now: set[tuple[str, str]] = set()
    for f in unhandled(found, known):
        if f.status == SKIPPED:
            planned.append(f)
            continue
        previous = latest_by_name.get((f.source, f.name))
        grown = previous is not None and f.size > previous["size"]
        try:
            surveyed, prefix = survey(replace(f, start=previous["size"] if grown else 0), cutting)
        except OSError as error:
            if (f.source, f.name, f.size, f.mtime_ns) not in unreadable:
                planned.append(replace(f, status=UNREADABLE, note=f"cannot be read ({why(error)}): nothing of it was counted; it is read once it can be"))
            continue
        if surveyed.size == surveyed.start and surveyed.size < f.size:
            continue  # nothing complete to count yet: an unterminated line waits for its end
        f, prefix_same = surveyed, grown and prefix == previous["sha256"]
        key = (f.source, f.sha256)
        if key in by_content or key in seen_now:
            planned.append(replace(f, status=DUPLICATE, note="same content already accounted for this source"))
            continue
        if previous is not None:
            old_size = previous["size"]
            if prefix_same:
                planned.append(replace(f, status=APPENDED))
            else:
                planned.append(replace(f, status=CHANGED, pieces=(), note=(
                    f"file changed after it was counted (was {old_size} bytes, sha256 {previous['sha256'][:12]}…, "
                    f"now {f.size} bytes): only appending to a counted file is allowed; deliver corrections "
                    "as a new file or restate the range")))
        else:
            planned.append(f)
        seen_now.add(key)
    return planned


def why(error: OSError) -> str:
    """An OS error as a person reads it, without the path (the file is named beside it)."""
    return error.strerror or str(error) or type(error).__name__
