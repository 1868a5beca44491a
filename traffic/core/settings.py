"""One settings object, decided in one place: config file < TRAFFIC_* environment < CLI.

Everything else receives a ``Settings``; nothing else reads the environment.

Every value is checked when settings are built, ranges included, so a job never fails halfway on one
(``max_history = 99999999d`` used to pass and then overflow mid-ingest). The largest values taken:
every duration (``max_history``, ``allowed_lateness``, ``max_future_skew``, the retentions, ...)
100 years (``MAX_DURATION``); ``keep_hours`` 876,600 (the same 100 years); ``shuffle_partitions``
100,000; ``split_bytes`` 1 TiB; ``compact_min_files`` 1,000,000; ``max_flow_bps`` 1 Mb/s to 1 Pb/s;
``now`` in the years 1970–9898.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping
from traffic.core.accounts import AccountsError, load_accounts
from traffic.core.location import LocationError, ObjectLocation, is_object_url
from traffic.core.records import canonical_ip, source_problem



#: How the Spark driver's JVM may start (``traffic.runtime.jvm``): ``auto`` picks by the job's size.
JIT_MODES = ("auto", "quick", "full")

#: Where ``make setup`` puts Delta Lake's jars (``scripts/fetch-delta-jars.sh``, pinned in
#: ``scripts/delta-jars.lock``): ``jars/delta`` in the checkout this package is installed from (editable,
#: as set-up installs it). A folder that is not there (no set-up yet, Maven out of reach, an install
#: that is no checkout) holds no jar, and the Delta layer's ``auto`` engine picks rs (delta-rs).
DEFAULT_SPARK_JARS_DIR = Path(__file__).resolve().parents[2] / "jars" / "delta"


class SettingsError(ValueError):
    """A configuration value a person has to fix; the message says which and how."""


_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


#: The longest duration any setting or option takes: 100 years. Times are added to and taken from
#: record and clock times (1970 to 9999), and ``now`` is kept 100 years from either end, so no sum
#: leaves the years ``datetime`` can hold; longer would only ever be a typo (``99999999d``).
MAX_DURATION = timedelta(days=36_525)


def parse_duration(name: str, value: Any) -> timedelta:
    """Seconds as a number, or a number with a unit: ``90s``, ``15m``, ``2h``, ``400d``; at most ``MAX_DURATION``."""
    if isinstance(value, timedelta):
        seconds: float = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        seconds = value
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise SettingsError(f"{name}: {value!r} is not a duration (use seconds, or 90s, 15m, 2h, 400d)")
        seconds = int(match.group(1)) * _UNIT[match.group(2)]
    return _within_max_duration(name, value, seconds)


def _within_max_duration(name: str, value: Any, seconds: float) -> timedelta:
    """A duration no job's datetime arithmetic overflows on (``MAX_DURATION``), else a one-line error."""
    if not 0 <= seconds <= MAX_DURATION.total_seconds():  # also NaN and infinity, from a TOML float
        raise SettingsError(f"{name}: {value!r} is longer than 100 years ({MAX_DURATION.days:,} days), the "
                            f"longest duration a setting takes")
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def _parse_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)):
        items = value
    else:
        items = str(value).split(",")
    return tuple(item.strip() for item in items if str(item).strip())


def _parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise SettingsError(f"{name}: {value!r} is not yes/no")


def _parse_int(name: str, value: Any, minimum: int = 0, maximum: int | None = None) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise SettingsError(f"{name}: {value!r} is not a whole number") from None
    if number < minimum:
        raise SettingsError(f"{name}: {number} must be at least {minimum}")
    if maximum is not None and number > maximum:
        raise SettingsError(f"{name}: {number:,} is more than {maximum:,}, the most it takes")
    return number


def _parse_networks(name: str, value: Any) -> tuple[str, ...]:
    networks = []
    for item in _parse_list(value):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise SettingsError(f"{name}: {item!r} is not a CIDR network (e.g. 10.0.0.0/8, 2001:db8::/32)") from None
    return tuple(networks)


def _parse_folders(name: str, value: Any) -> tuple[Path, ...]:
    """Absolute folders, from a TOML list or a comma-separated text."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    folders = tuple(Path(str(item).strip()).expanduser() for item in items if str(item).strip())
    relative = [str(folder) for folder in folders if not folder.is_absolute()]
    if relative:
        raise SettingsError(f"{name}: {', '.join(relative)} is not an absolute folder")
    return tuple(folder.absolute() for folder in folders)


def parse_time(name: str, value: Any) -> datetime | None:
    """An ISO-8601 time (no offset: UTC) from a setting, an option or a form field; None when empty."""
    if value in (None, ""):
        return None
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise SettingsError(f"{name}: {value!r} is not an ISO-8601 time") from None
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed.astimezone(timezone.utc)


def _connect_url(name: str, value: str) -> str:
    if value and value != "auto" and not value.startswith("sc://"):
        raise SettingsError(f"{name}: {value!r} is not a Spark Connect URL (sc://host:port) or auto")
    if "token=" in value.lower():
        raise SettingsError(f"{name}: put the token in SPARK_CONNECT_AUTHENTICATE_TOKEN, not in the URL "
                            "(settings are logged)")
    return value


@dataclass(frozen=True)
class Settings:
    """Every knob of the pipeline. Durations are ``timedelta``; paths are absolute."""

    warehouse: Path | str = Path("./warehouse")  # a folder, or s3://bucket/prefix (object storage)
    inbox: Path | str = Path("./inbox")  # a folder, or s3://bucket/prefix (objects uploaded whole)
    replay_roots: tuple[Path, ...] = ()  # empty: the inbox and ``archive`` beside it (``replay_folders``)
    keep_hours: int = 24
    allowed_lateness: timedelta = timedelta(0)
    source_timeout: timedelta = timedelta(hours=1)
    local_networks: tuple[str, ...] = ()
    keep_transit: bool = False
    expected_sources: tuple[str, ...] = ()
    max_future_skew: timedelta = timedelta(days=1)
    max_history: timedelta = timedelta(days=400)
    late_retention: timedelta = timedelta(days=90)
    reject_retention: timedelta = timedelta(days=90)
    dq_retention: timedelta = timedelta(days=90)
    # Per-address rows of hours (days) this old go once their day (month) is rolled up and published;
    # None ("keep", the default): kept. monthly and the ledger are never expired (close.per_address_expiry).
    hourly_retention: timedelta | None = None
    daily_retention: timedelta | None = None
    min_file_age: timedelta = timedelta(0)
    partial_line_grace: timedelta = timedelta(minutes=5)
    lock_timeout: timedelta = timedelta(minutes=10)
    # A warehouse on object storage: how long its lease lasts unless renewed (a live job renews it every
    # third of this; a crashed job's lease is taken over once it has run out).
    lease_ttl: timedelta = timedelta(seconds=30)
    engine: str = "auto"
    spark_master: str = "auto"
    spark_jit: str = "auto"
    # A warm Spark Connect server the Airflow tasks use while it answers (``sc://host:port``, its token from
    # SPARK_CONNECT_AUTHENTICATE_TOKEN; ``auto``: the warehouse's own, ``traffic spark start``; empty: none,
    # every Spark task is a spark-submit).
    spark_connect: str = ""
    # Delta Lake's jars (delta-spark, delta-storage), for the spark engine and Spark's classpath: by default the
    # checkout's jars/delta, which `make setup` fills; TRAFFIC_SPARK_JARS_DIR (or the config file) points the
    # project at a platform's own Delta jars instead, and an empty value at none (the rs engine runs).
    spark_jars_dir: Path | None = DEFAULT_SPARK_JARS_DIR
    shuffle_partitions: int = 4
    split_bytes: int = 64 * 1024 * 1024
    compact_min_files: int = 32
    completeness_min_panes: int = 12
    completeness_action: str = "warning"
    accounts_file: Path | None = None
    billing_rule: str = "max"
    billing_cycle_day: int = 1
    billing_timezone: str = "UTC"
    billing_unknown_direction: str = "in"
    # Alerts (``traffic.orchestration.notify``): the Airflow SMTP connection they are mailed through (a log
    # line per alert when it is not configured) and who gets them.
    alerts_smtp_conn_id: str = "smtp_default"
    alerts_email_to: tuple[str, ...] = ()
    exporters: Mapping[str, str] = field(default_factory=dict)  # exporter address → source name (``traffic collect``)
    # Who may send to ``traffic collect`` (DESIGN §7a "Who may export"): address blocks; a datagram from any other
    # sender is dropped and counted. Required for a listen on a non-loopback address (or ``--allow-any``).
    allowed_exporters: tuple[str, ...] = ()
    # Flow telemetry (DESIGN §7a): sources whose captures hold export traffic (a ``.flows.pcap`` file
    # from ``traffic collect`` is telemetry whatever its source), per-source sampling rates (they
    # override what exporters say), per-source allowed lateness (≥ the exporter's active timeout),
    # and how long data waits for its template before it is rejected.
    telemetry_sources: tuple[str, ...] = ()
    sampling_rates: Mapping[str, int] = field(default_factory=dict)
    source_lateness: Mapping[str, timedelta] = field(default_factory=dict)
    template_wait: timedelta = timedelta(hours=1)
    # A flow record lasting longer than this is rejected before it is split into 5-minute shares
    # (§7a "Bounds": one record costs at most max_flow_duration / 5 min shares, 2,305 at 8 days).
    # Routers cut long flows at their active timeout (at most 30-60 minutes); softflowd's default
    # maximum flow life is 7 days, the longest of any exporter we know; 8 days leaves a day's margin.
    max_flow_duration: timedelta = timedelta(days=8)
    # The fastest link a flow record may claim, in bits per second (§7a "Bounds"): a record's bytes × rate
    # above what it carries in the longer of the record's duration and 5 minutes, or its packets × rate
    # above that many minimum frames (84 bytes on the wire), is one reject. Default 1.6 Tb/s (1.6TbE, the
    # fastest Ethernet standard): a real exporter never trips it, and it keeps every sum far from 64 bits.
    # Takes ``1600000000000`` or ``1.6T``, ``400G``, ``100M`` (SI, bits); 1 Mb/s to 1 Pb/s.
    max_flow_bps: int = 1_600_000_000_000
    now: datetime | None = None
    fault_at: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def processing_now(self) -> datetime:
        """The processing machine's clock (only the sanity bound uses it); fixed when ``now`` is set."""
        return self.now or datetime.now(timezone.utc)

    def replay_folders(self) -> tuple[Path, ...]:
        """Folders the replay form of the ``traffic_replay`` DAG may read from (``replay_roots``); by
        default the inbox and the ``archive`` folder next to it (``/data/inbox`` → ``/data/archive``)."""
        if self.replay_roots or is_object_url(self.inbox):  # an archive on object storage is not a folder
            return self.replay_roots
        return (self.inbox, self.inbox.parent / "archive")

    def replace(self, **changes: Any) -> "Settings":
        """A copy with some values changed (validated like any other source)."""
        return build_settings(dataclasses.asdict(self) | changes)


def _at_least(name: str, value: timedelta, floor: timedelta) -> timedelta:
    if value < floor:
        raise SettingsError(f"{name}: {value.total_seconds():g} s is too short (at least {floor.total_seconds():g} s)")
    return value


def _parse_place(name: str, value) -> Path | str:
    """A local folder (made absolute) or an object-storage URL (``s3://bucket/prefix``, checked, kept as text)."""
    text = str(value)
    if "://" not in text:
        return Path(text).expanduser().absolute()
    try:
        return ObjectLocation.parse(text, {}).url
    except LocationError as error:
        raise SettingsError(f"{name}: {error}") from None


_PARSERS = {
    "warehouse": lambda n, v: _parse_place(n, v),
    "inbox": lambda n, v: _parse_place(n, v),
    "replay_roots": lambda n, v: _parse_folders(n, v),
    "keep_hours": lambda n, v: _parse_int(n, v, 0, MAX_KEEP_HOURS),
    "allowed_lateness": parse_duration,
    "source_timeout": parse_duration,
    "local_networks": _parse_networks,
    "keep_transit": _parse_bool,
    "expected_sources": lambda n, v: _parse_list(v),
    "max_future_skew": parse_duration,
    "max_history": parse_duration,
    "late_retention": parse_duration,
    "reject_retention": parse_duration,
    "dq_retention": parse_duration,
    "hourly_retention": lambda n, v: None if v in (None, "", "keep") else parse_duration(n, v),
    "daily_retention": lambda n, v: None if v in (None, "", "keep") else parse_duration(n, v),
    "min_file_age": parse_duration,
    "partial_line_grace": parse_duration,
    "lock_timeout": parse_duration,
    "lease_ttl": lambda n, v: _at_least(n, parse_duration(n, v), timedelta(seconds=3)),
    "engine": lambda n, v: _choice(n, v, ("auto", "rs", "spark")),
    "spark_master": lambda n, v: str(v),
    "spark_jit": lambda n, v: _choice(n, v, JIT_MODES),
    "spark_connect": lambda n, v: _connect_url(n, str(v)),
    "spark_jars_dir": lambda n, v: None if v in (None, "") else Path(v).expanduser().absolute(),
    "shuffle_partitions": lambda n, v: _parse_int(n, v, 1, MAX_PARTITIONS),
    "split_bytes": lambda n, v: _parse_int(n, v, 1024, MAX_SPLIT_BYTES),
    "compact_min_files": lambda n, v: _parse_int(n, v, 2, MAX_COMPACT_MIN_FILES),
    "completeness_min_panes": lambda n, v: _parse_panes(n, v),
    "completeness_action": lambda n, v: _choice(n, v, ("warning", "failure")),
    "accounts_file": lambda n, v: _parse_accounts_file(n, v),
    "billing_rule": lambda n, v: _choice(n, v, ("max", "sum")),
    "billing_cycle_day": lambda n, v: _parse_cycle_day(n, v),
    "billing_timezone": lambda n, v: _parse_timezone(n, v),
    "billing_unknown_direction": lambda n, v: _choice(n, v, ("in", "out", "both", "ignore")),
    "alerts_smtp_conn_id": lambda n, v: str(v).strip() or "smtp_default",
    "alerts_email_to": lambda n, v: _parse_list(v),
    "exporters": lambda n, v: _parse_exporters(n, v),
    "allowed_exporters": lambda n, v: _parse_exporter_blocks(n, v),
    "telemetry_sources": lambda n, v: _parse_list(v),
    "sampling_rates": lambda n, v: _parse_per_source(n, v, _parse_rate),
    "source_lateness": lambda n, v: _parse_per_source(n, v, parse_duration),
    "template_wait": parse_duration,
    "max_flow_duration": parse_duration,
    "max_flow_bps": lambda n, v: _parse_bps(n, v),
    "now": lambda n, v: _parse_now(n, v),
    "fault_at": lambda n, v: None if v in (None, "") else str(v),
    "extra": lambda n, v: dict(v),
}


#: The largest whole-number settings (durations: ``MAX_DURATION``). ``keep_hours`` is a duration in
#: hours; Spark takes partition counts as a 32-bit int, and more than 100,000 tasks per stage is never
#: what a traffic warehouse needs; a split of 1 TiB already means "never split".
MAX_KEEP_HOURS = MAX_DURATION.days * 24
MAX_PARTITIONS = 100_000
MAX_SPLIT_BYTES = 2**40
MAX_COMPACT_MIN_FILES = 1_000_000


_BPS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKMGTP]?)\s*(?:b/s|bps)?\s*$")
_SI = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
FLOW_BPS_RANGE = (10**6, 10**15)  # 1 Mb/s to 1 Pb/s


def _parse_bps(name: str, value: Any) -> int:
    """Bits per second: a whole number, or with an SI prefix (``1.6T``, ``400G``); 1 Mb/s to 1 Pb/s."""
    match = _BPS.match(str(value)) if not isinstance(value, bool) else None
    if not match:
        raise SettingsError(f"{name}: {value!r} is not a rate in bits per second (e.g. 1600000000000, 1.6T, 400G)")
    number, prefix = match.groups()
    whole, _, fraction = number.partition(".")
    bps = (int(whole + fraction) * _SI[prefix]) // 10 ** len(fraction)
    if not FLOW_BPS_RANGE[0] <= bps <= FLOW_BPS_RANGE[1]:
        raise SettingsError(f"{name}: {value!r} is outside 1 Mb/s to 1 Pb/s (1,000,000 to 10**15 bits per second)")
    return bps


def _parse_now(name: str, value: Any) -> datetime | None:
    """The fixed processing clock: within 100 years of the ends of 1970–9999, so ``now`` plus or minus any
    duration stays a time ``datetime`` can hold."""
    now = parse_time(name, value)
    if now is not None and not 1970 <= now.year <= 9898:  # 9898-12-31 + 100 years is still in 9999
        raise SettingsError(f"{name}: {value!r} is outside the years 1970 to 9898")
    return now


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in allowed:
        raise SettingsError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
    return text


def _parse_panes(name: str, value: Any) -> int:
    """How many of an hour's twelve 5-minute panes must have every expected source (0–12)."""
    number = _parse_int(name, value)
    if number > 12:
        raise SettingsError(f"{name}: {number} is more than the 12 five-minute panes of an hour")
    return number


def _parse_accounts_file(name: str, value: Any) -> Path | None:
    """The accounts mapping (TOML), validated now so a typo in it stops the job before any work."""
    if value in (None, ""):
        return None

    path = Path(value).expanduser().absolute()
    try:
        load_accounts(path)
    except AccountsError as error:
        raise SettingsError(f"{name}: {error}") from None
    return path


def _parse_cycle_day(name: str, value: Any) -> int:
    """The day of the month billing periods start on: 1–28, so every month has it."""
    number = _parse_int(name, value, 1)
    if number > 28:
        raise SettingsError(f"{name}: {number} is after the 28th; use 1–28 (every month has those days)")
    return number


def _parse_exporters(name: str, value: Any) -> dict[str, str]:
    """Exporter address → source name, from a TOML table or ``address=name,…`` text.

    Addresses are stored canonically (an IPv4-mapped IPv6 address as its IPv4 address); a name
    must be usable as an inbox folder the inbox reads (no ``/``, not starting with ``.`` or ``_``).
    """
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        pairs = [item.partition("=")[::2] for item in _parse_list(value)]
    mapping: dict[str, str] = {}
    for address, source in pairs:
        address, source = str(address).strip(), str(source).strip()
        try:
            key = canonical_ip(address)
        except ValueError as error:
            raise SettingsError(f"{name}: {address!r} {error} (write address=name, e.g. 192.0.2.1=edge-1)") from None
        problem = source_problem(source) or (
            "it is empty" if not source else
            "it has a /, which an inbox folder name may not have" if "/" in source else
            "it starts with . or _, which the inbox skips" if source.startswith((".", "_")) else None)
        if problem:
            raise SettingsError(f"{name}: the source name for {key} ({source!r}) cannot be used: {problem}")
        mapping[key] = source
    return mapping


def _parse_exporter_blocks(name: str, value: Any) -> tuple[str, ...]:
    """``allowed_exporters``: address blocks (``192.0.2.0/24``, ``2001:db8::/32``, a bare address is a /32 or
    /128), canonical; an IPv4-mapped IPv6 block (``::ffff:10.0.0.0/104``) is written as its IPv4 block, since
    the collector matches an IPv4 sender as IPv4 whichever socket family it arrived on."""
    blocks = []
    for network in _parse_networks(name, value):
        block = ipaddress.ip_network(network)
        if block.version == 6 and block.prefixlen >= 96 and block.network_address.ipv4_mapped is not None:
            block = ipaddress.ip_network(f"{block.network_address.ipv4_mapped}/{block.prefixlen - 96}")
        blocks.append(str(block))
    return tuple(dict.fromkeys(blocks))


def _parse_per_source(name: str, value: Any, parse) -> dict:
    """A per-source setting, from a TOML table or ``source=value,…`` text (e.g. ``edge-1=1000``)."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        pairs = [item.partition("=")[::2] for item in _parse_list(value)]
    mapping = {}
    for source, text in pairs:
        source = str(source).strip()
        if not source or source_problem(source):
            raise SettingsError(f"{name}: {source!r} is not a source name (write source=value, e.g. edge-1=…)")
        mapping[source] = parse(f"{name}.{source}", text)
    return mapping


def _parse_rate(name: str, value: Any) -> int:
    try:
        rate = int(str(value).strip())
    except ValueError:
        raise SettingsError(f"{name}: {value!r} is not a whole number (a sampling rate: 1 in N)") from None
    if not 1 <= rate <= 2**31 - 1:
        raise SettingsError(f"{name}: {rate} is not a sampling rate (1 in N, N from 1 to 2,147,483,647)")
    return rate


def _parse_timezone(name: str, value: Any) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    text = str(value).strip()
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(f"{name}: {value!r} is not an IANA time zone (e.g. UTC, Europe/Berlin)") from None
    return text


def build_settings(values: Mapping[str, Any]) -> Settings:
    """Validate raw values (strings or typed) into a ``Settings``; unknown names are errors."""
    parsed: dict[str, Any] = {}
    for name, value in values.items():
        if name not in _PARSERS:
            known = ", ".join(sorted(_PARSERS))
            raise SettingsError(f"unknown setting {name!r} (known: {known})")
        if value is None and name not in {"now", "fault_at", "spark_jars_dir", "hourly_retention", "daily_retention",
                                          "accounts_file"}:
            continue
        parsed[name] = _PARSERS[name](name, value)
    defaults = Settings()
    for path_name in ("warehouse", "inbox"):
        parsed.setdefault(path_name, getattr(defaults, path_name).absolute())
    rule = parsed.get("billing_rule", defaults.billing_rule)
    if rule == "sum" and parsed.get("billing_unknown_direction", defaults.billing_unknown_direction) == "both":
        raise SettingsError("billing_unknown_direction: 'both' with billing_rule 'sum' would bill unknown traffic "
                            "twice; use in or out")
    return Settings(**parsed)


def load_settings(
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Config file (TOML, ``[traffic]`` table or top level) < ``TRAFFIC_<NAME>`` < overrides."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    config_file = config_file or environ.get("TRAFFIC_CONFIG")
    if config_file:
        path = Path(config_file)
        try:
            document = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SettingsError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as error:
            raise SettingsError(f"config file {path} is not valid TOML: {error}") from None
        values.update(document.get("traffic", document))
    for name in _PARSERS:
        env_name = f"TRAFFIC_{name.upper()}"
        if env_name in environ:
            values[name] = environ[env_name]
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return build_settings(values)


def delta_classpath(folder: Path | None) -> list[Path]:
    """Delta Lake's jars in ``folder`` for Spark's classpath: all its jars when delta-spark is among them
    (what the Delta layer's ``auto`` engine looks for), else none (no folder, no delta-spark)."""
    if folder is None or not folder.is_dir():
        return []
    jars = sorted(folder.glob("*.jar"))
    return jars if any(p.name.startswith(("delta-spark", "delta-core")) for p in jars) else []


def s3a_classpath(folder: Path | None) -> bool:
    """Whether Delta's classpath in ``folder`` has Hadoop's S3A connector too (``hadoop-aws``, pinned beside
    Delta's jars), with which the spark engine writes a warehouse on object storage."""
    return any(p.name.startswith("hadoop-aws-") for p in delta_classpath(folder))
