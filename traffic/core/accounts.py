"""Accounts: which addresses belong to whom, by date (the mapping billing attributes traffic with).

The mapping is a TOML file of ``[[version]]`` tables (see ``traffic/conf/accounts.toml``).
Each version is a complete mapping, account name → CIDR blocks, in force from its
``effective_from`` until the next version's; before the first version, and when there
is no file at all, every address is ``unassigned``. A version has a stable ``id``
(its name and a hash of its content) so a frozen period can record the mapping that
produced it, and a later edit of the file cannot pass for the same version.

* Longest prefix wins, across accounts: ``10.1.0.0/16`` of one account carves its block
  out of another account's ``10.0.0.0/8``. An address no block covers is ``unassigned``,
  and so is a null or unparsable address. Addresses are looked up in their stored form
  (``canonical_ip``), where an IPv4-mapped IPv6 address is the IPv4 host it maps; so an IPv4-mapped
  block (``::ffff:10.0.0.0/104``) is read as the IPv4 block it maps (``10.0.0.0/8``): kept as IPv6
  it would never match a stored address.
* An account name is printed on bills, in alert mails and in file names: one with a control or
  format character (a newline, a bidi override, a zero-width space) is refused on load.
* A version may set **limits** per account (``[version.limits.<account>]``): ``quota_bytes``
  (``bytes_total`` per billing period) and ``commit_bps`` (the committed rate the 95th
  percentile is billed against). Alerts are raised when the final panes cross them
  (``traffic.core.alerts``). A version's id covers its limits only when it has any, so the id
  of a version without limits is the same as before limits existed.
* Validation happens on load, and an error names the file, the line and the entry.
  A block with host bits set (``10.1.2.3/16``) is rejected, not normalised: on a bill an
  entry that could mean a /16 or a single host is a typo to fix, not a guess to make.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import ipaddress
import json
import re
import tomllib
import unicodedata
from dataclasses import dataclass, field
from datetime import date, datetime, time, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.periods import as_utc, on_pane_boundary

UNASSIGNED = "unassigned"

_VERSION_KEYS = ("name", "effective_from", "accounts", "limits")
LIMIT_KEYS = ("quota_bytes", "commit_bps")
# Exactly the dotted quads Python's ipaddress accepts (no leading zeros, octets <= 255).
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"^{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}$"
#: Unicode categories an account name may not use: controls, format characters (bidi overrides, zero
#: width), line and paragraph separators, surrogates.
_CONTROL_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs"}
_VERSION_HEADER = re.compile(r"^\s*\[\[\s*version\s*\]\]")


class AccountsError(ValueError):
    """An accounts file a person has to fix; the message names the file, line and entry."""


@dataclass(frozen=True)
class Limits:
    """An account's limits in one version: bytes per billing period and the committed rate (None: no limit)."""

    quota_bytes: int | None = None
    commit_bps: int | float | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in (("quota_bytes", self.quota_bytes), ("commit_bps", self.commit_bps)) if v is not None}


NO_LIMITS = Limits()


@dataclass(frozen=True)
class AccountVersion:
    """One complete mapping, account → canonical CIDR blocks, in force from ``effective_from``."""

    name: str
    effective_from: datetime | None
    accounts: Mapping[str, tuple[str, ...]]
    limits: Mapping[str, Limits] = field(default_factory=dict)
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _scalar: Mapping[int, tuple[tuple[int, Mapping[int, int]], ...]] = field(init=False, repr=False, compare=False)
    _ipv4: tuple[tuple[int, np.ndarray, np.ndarray], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = tuple(sorted(self.accounts))
        # Per family, per prefix length (longest first): network integer → account index.
        by_length: dict[int, dict[int, dict[int, int]]] = {4: {}, 6: {}}
        for index, account in enumerate(names):
            for block in self.accounts[account]:
                network = ipaddress.ip_network(block)
                by_length[network.version].setdefault(network.prefixlen, {})[int(network.network_address)] = index
        scalar = {
            family: tuple((_mask(family, length), tables[length]) for length in sorted(tables, reverse=True))
            for family, tables in by_length.items()
        }
        # The vectorised IPv4 path: per prefix length, sorted networks for searchsorted.
        ipv4 = []
        for mask, table in scalar[4]:
            networks = sorted(table)
            ipv4.append((mask, np.array(networks, dtype=np.uint32), np.array([table[n] for n in networks], np.int32)))
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_scalar", scalar)
        object.__setattr__(self, "_ipv4", tuple(ipv4))

    @property
    def id(self) -> str:
        """``name@hash``: the name, and the first 10 hex digits of a SHA-256 of the content."""
        content = {
            "effective_from": None if self.effective_from is None else self.effective_from.isoformat(),
            "accounts": {name: sorted(self.accounts[name]) for name in sorted(self.accounts)},
        }
        if self.limits:  # only then: a version without limits keeps the id it had before limits existed
            content["limits"] = {name: self.limits[name].as_dict() for name in sorted(self.limits)}
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
        return f"{self.name}@{digest[:10]}"

    def limits_of(self, account: str | None) -> Limits:
        """The account's limits in this version (``NO_LIMITS`` when it has none)."""
        return self.limits.get(account, NO_LIMITS) if account is not None else NO_LIMITS

    def lookup(self, ip: str | None) -> str:
        """The account of one address: longest matching prefix, else ``unassigned``."""
        index = self._owner(ip)
        return UNASSIGNED if index < 0 else self._names[index]

    def lookup_many(self, ips: pa.Array | pa.ChunkedArray | Iterable[str | None]) -> pa.StringArray:
        """The account of every address, vectorised (IPv4 in numpy; each distinct other value once)."""
        if isinstance(ips, pa.ChunkedArray):
            ips = ips.combine_chunks()
        if not isinstance(ips, pa.Array):
            ips = pa.array(list(ips), pa.string())
        encoded = pc.dictionary_encode(ips)
        distinct = encoded.dictionary
        owners = np.full(len(distinct), -1, dtype=np.int32)
        is_ipv4 = pc.match_substring_regex(distinct, _IPV4).to_numpy(zero_copy_only=False)
        ipv4_rows = np.flatnonzero(is_ipv4)
        if ipv4_rows.size:
            owners[ipv4_rows] = self._owners_ipv4(_ipv4_integers(distinct.take(pa.array(ipv4_rows))))
        for row in np.flatnonzero(~is_ipv4):
            owners[row] = self._owner(distinct[int(row)].as_py())
        labels = pa.array(self._names + (UNASSIGNED,), pa.string())
        owners[owners < 0] = len(self._names)
        return labels.take(pa.array(owners)).take(encoded.indices).fill_null(UNASSIGNED)

    def _owner(self, ip: str | None) -> int:
        if ip is None:
            return -1
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return -1
        number = int(address)
        for mask, table in self._scalar[address.version]:
            index = table.get(number & mask)
            if index is not None:
                return index
        return -1

    def _owners_ipv4(self, numbers: np.ndarray) -> np.ndarray:
        owners = np.full(len(numbers), -1, dtype=np.int32)
        pending = np.arange(len(numbers))
        for mask, networks, indexes in self._ipv4:
            keys = numbers[pending] & np.uint32(mask)
            at = np.minimum(np.searchsorted(networks, keys), len(networks) - 1)
            hit = networks[at] == keys
            owners[pending[hit]] = indexes[at[hit]]
            pending = pending[~hit]
            if not pending.size:
                break
        return owners


def _mask(family: int, length: int) -> int:
    bits = 32 if family == 4 else 128
    return ((1 << length) - 1) << (bits - length)


def _ipv4_integers(dotted: pa.Array) -> np.ndarray:
    """Validated dotted quads as uint32 (pyarrow splits and casts; numpy combines)."""
    octets = pc.cast(pc.list_flatten(pc.split_pattern(dotted, ".")), pa.uint32()).to_numpy().reshape(-1, 4)
    return (octets[:, 0] << 24) | (octets[:, 1] << 16) | (octets[:, 2] << 8) | octets[:, 3]


NO_ACCOUNTS = AccountVersion("none", None, {})


@dataclass(frozen=True)
class AccountMap:
    """Every version of the mapping, oldest first; ``version_at`` picks the one in force."""

    versions: tuple[AccountVersion, ...] = ()

    def version_at(self, ts: datetime) -> AccountVersion:
        """The version in force at ``ts``: the last one effective at or before it (else no accounts)."""
        starts = [version.effective_from for version in self.versions]
        position = bisect.bisect_right(starts, as_utc(ts))
        return self.versions[position - 1] if position else NO_ACCOUNTS

    def by_id(self, version_id: str | None) -> AccountVersion | None:
        """The version with this id (``name@hash``), if the file still has it unchanged."""
        return next((v for v in self.versions if v.id == version_id), None)

    @property
    def has_limits(self) -> bool:
        """Whether any version sets a limit for any account."""
        return any(v.limits for v in self.versions)

    def versions_during(self, start: datetime, end: datetime) -> tuple[AccountVersion, ...]:
        """The versions in force at some time in ``[start, end)``, oldest first."""
        start, end = as_utc(start), as_utc(end)
        first = self.version_at(start)
        later = tuple(v for v in self.versions if start < v.effective_from < end)
        return (first, *later)


def load_accounts(path: str | Path | None) -> AccountMap:
    """The mapping in ``path`` (TOML); ``None`` means no mapping: every address is unassigned."""
    if path is None:
        return AccountMap()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AccountsError(f"accounts file {path} does not exist") from None
    return parse_accounts(text, str(path))


def parse_accounts(text: str, source: str = "<accounts>") -> AccountMap:
    """Validate the text of an accounts file (``source`` names it in errors) into an ``AccountMap``."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise AccountsError(f"{source}: not valid TOML: {error}") from None
    where = _Where(source, text.splitlines())
    for key in document:
        if key != "version":
            raise where.error(None, f"unknown key {key!r} (an accounts file has only [[version]] tables)", key=key)
    entries = document.get("version")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise AccountsError(f"{source}: no [[version]] tables (each gives effective_from and [version.accounts])")
    where.expect_versions(len(entries))
    versions: list[AccountVersion] = []
    for number, entry in enumerate(entries, 1):
        version = _parse_version(entry, number, where)
        if versions and version.effective_from <= versions[-1].effective_from:
            previous = versions[-1]
            problem = "has the same effective_from as" if version.effective_from == previous.effective_from \
                else "is not after"
            raise where.error(number, f"version {number} ({version.name}) effective "
                                      f"{version.effective_from.isoformat()} {problem} version {number - 1} "
                                      f"({previous.name}) effective {previous.effective_from.isoformat()}; "
                                      f"list versions oldest first", key="effective_from")
        if any(version.name == v.name for v in versions):
            raise where.error(number, f"version {number}: name {version.name!r} is already used by an earlier "
                                      f"version", key="name")
        versions.append(version)
    return AccountMap(tuple(versions))


def _parse_version(entry: Mapping[str, Any], number: int, where: _Where) -> AccountVersion:
    for key in entry:
        if key not in _VERSION_KEYS:
            raise where.error(number, f"version {number}: unknown key {key!r} (known: {', '.join(_VERSION_KEYS)})",
                              key=key)
    if "effective_from" not in entry:
        raise where.error(number, f"version {number}: effective_from is missing (e.g. 2026-01-01)")
    effective_from = _parse_effective_from(entry["effective_from"], number, where)
    name = entry.get("name", _default_name(effective_from))
    if not isinstance(name, str) or not name.strip():
        raise where.error(number, f"version {number}: name must be a non-empty string, not {name!r}", key="name")
    label = f"version {number} ({name})"
    accounts = entry.get("accounts")
    if not isinstance(accounts, dict):
        raise where.error(number, f"{label}: needs a [version.accounts] table (account = [CIDR, ...])",
                          key="accounts")
    owner_of: dict[ipaddress.IPv4Network | ipaddress.IPv6Network, str] = {}
    blocks: dict[str, tuple[str, ...]] = {}
    for account, values in accounts.items():
        if not account.strip() or account != account.strip():
            raise where.error(number, f"{label}: account name {account!r} is empty or has surrounding spaces",
                              key=account)
        control = _control_characters(account)
        if control:
            raise where.error(number, f"{label}: account name {account!r} has a control character ({control}); a "
                                      f"name is printed on bills, in alert mails and in file names: remove it",
                              key=account)
        if account.lower() == UNASSIGNED:
            raise where.error(number, f"{label}: account name {account!r} is reserved for addresses no block "
                                      f"covers", key=account)
        entry_label = f"{label}, account {account!r}"
        if not isinstance(values, list):
            raise where.error(number, f"{entry_label}: give a list of CIDR blocks, not {values!r}", key=account)
        networks = []
        for value in values:
            network = _parse_block(value, entry_label, number, where)
            if network in owner_of:
                other = owner_of[network]
                problem = "is listed twice" if other == account else f"is also given to account {other!r}"
                raise where.error(number, f"{entry_label}: {value!r} {problem}; a block belongs to one account",
                                  key=account)
            owner_of[network] = account
            networks.append(str(network))
        blocks[account] = tuple(networks)
    return AccountVersion(name, effective_from, blocks, _parse_limits(entry.get("limits"), blocks, label, number,
                                                                      where))


def _control_characters(name: str) -> str:
    """The control and format characters of ``name``, escaped (empty when it has none).

    A newline in a name breaks a mail's header and a log line; a bidi override or zero-width
    character makes one name look like another on a bill. Spaces of any script are fine.
    """
    found = dict.fromkeys(char for char in name if unicodedata.category(char) in _CONTROL_CATEGORIES)
    return ", ".join(char.encode("unicode_escape").decode("ascii") for char in found)


def _parse_limits(value: Any, accounts: Mapping[str, tuple[str, ...]], label: str, number: int,
                  where: _Where) -> dict[str, Limits]:
    """``[version.limits.<account>]`` tables: positive ``quota_bytes`` (integer) and/or ``commit_bps``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise where.error(number, f"{label}: limits must be tables [version.limits.<account>], not {value!r}",
                          key="limits")
    limits: dict[str, Limits] = {}
    for account, table in value.items():
        entry_label = f"{label}, limits of account {account!r}"
        if account not in accounts:
            raise where.limit_error(number, account, None,
                                    f"{entry_label}: the account is not in this version's [version.accounts] "
                                    f"(accounts: {', '.join(sorted(accounts)) or 'none'})")
        if not isinstance(table, dict) or not table:
            raise where.limit_error(number, account, None, f"{entry_label}: give quota_bytes and/or commit_bps")
        for key, amount in table.items():
            if key not in LIMIT_KEYS:
                raise where.limit_error(number, account, key, f"{entry_label}: unknown key {key!r} (known: "
                                                              f"{', '.join(LIMIT_KEYS)})")
            whole = isinstance(amount, int) and not isinstance(amount, bool)
            number_ok = whole or (key == "commit_bps" and isinstance(amount, float) and math.isfinite(amount))
            if not number_ok or amount <= 0:
                kind = "a positive whole number of bytes" if key == "quota_bytes" else "a positive number of bits/s"
                raise where.limit_error(number, account, key, f"{entry_label}: {key} = {amount!r} is not {kind}")
        limits[account] = Limits(table.get("quota_bytes"), table.get("commit_bps"))
    return limits


def _parse_block(value: Any, label: str, number: int, where: _Where) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    if not isinstance(value, str):
        raise where.error(number, f"{label}: {value!r} is not a CIDR block in quotes (\"10.1.0.0/16\")", value=value)
    try:
        return _ipv4_if_mapped(ipaddress.ip_network(value))
    except ValueError:
        pass
    try:
        network = _ipv4_if_mapped(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise where.error(number, f"{label}: {value!r} is not a CIDR block (e.g. 10.1.0.0/16, 2001:db8:1::/48)",
                          value=value) from None
    raise where.error(number, f"{label}: {value!r} has host bits set; did you mean {str(network)!r}?", value=value)


def _ipv4_if_mapped(network: ipaddress.IPv4Network | ipaddress.IPv6Network
                    ) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An IPv4-mapped block (``::ffff:10.0.0.0/104``) as the IPv4 block it maps (``10.0.0.0/8``).

    Addresses are stored as the IPv4 host a mapped address maps (``canonical_ip``), so a mapped block
    kept as IPv6 would never match anything.
    """
    if network.version == 6 and network.prefixlen >= 96 and network.network_address.ipv4_mapped is not None:
        return ipaddress.IPv4Network((network.network_address.ipv4_mapped, network.prefixlen - 96))
    return network


def _parse_effective_from(value: Any, number: int, where: _Where) -> datetime:
    parsed: datetime | None = None
    if isinstance(value, str):  # quoted by mistake: read it as TOML would have
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            pass
    if isinstance(value, datetime):
        parsed = as_utc(value)
    elif isinstance(value, date):
        parsed = datetime.combine(value, time(0), tzinfo=timezone.utc)
    if parsed is None:
        raise where.error(number, f"version {number}: effective_from {value!r} is not a date (2026-01-01, UTC "
                                  f"midnight) or a time (2026-01-15T12:00:00Z)", key="effective_from")
    # Mapping changes take effect on a 5-minute pane boundary, so every pane has one version.
    if not on_pane_boundary(parsed):
        raise where.error(number, f"version {number}: effective_from {parsed.isoformat()} is not on a 5-minute "
                                  f"pane boundary; a pane has one mapping", key="effective_from")
    return parsed


def _default_name(effective_from: datetime) -> str:
    if effective_from.time() == time(0):
        return effective_from.date().isoformat()
    return effective_from.strftime("%Y-%m-%dT%H:%MZ")


@dataclass
class _Where:
    """Finds the line of an entry so errors can say ``file:line``."""

    source: str
    lines: list[str]
    headers: list[int] = field(default_factory=list)

    def expect_versions(self, count: int) -> None:
        """Remember where each ``[[version]]`` starts (unknown when written as inline tables)."""
        headers = [i for i, line in enumerate(self.lines) if _VERSION_HEADER.match(line)]
        self.headers = headers if len(headers) == count else []

    def error(self, number: int | None, message: str, key: str | None = None, value: Any = None) -> AccountsError:
        """An error in version ``number`` (None: top level), at the line of ``key`` or ``value`` if found."""
        line = self._line(number, key, value)
        return AccountsError(f"{self.source}:{line}: {message}" if line else f"{self.source}: {message}")

    def limit_error(self, number: int, account: str, key: str | None, message: str) -> AccountsError:
        """An error in ``[version.limits.<account>]`` of version ``number``, at the line of ``key`` in that table."""
        line = None
        if self.headers:
            first = self.headers[number - 1]
            last = self.headers[number] if number < len(self.headers) else len(self.lines)
            header = re.compile(rf"""^\s*\[\s*version\s*\.\s*limits\s*\.\s*(["']?){re.escape(account)}\1\s*\]""")
            key_line = re.compile(rf"""^\s*(["']?){re.escape(key)}\1\s*=""") if key else None
            start = next((i for i in range(first, last) if header.match(self.lines[i])), None)
            if start is not None:
                line = start + 1
                if key_line is not None:
                    for index in range(start + 1, last):
                        code = self.lines[index].split("#", 1)[0]
                        if code.strip().startswith("["):
                            break
                        if key_line.match(code):
                            line = index + 1
                            break
            else:
                line = self._line(number, account if key is None else key, None)
        return AccountsError(f"{self.source}:{line}: {message}" if line else f"{self.source}: {message}")

    def _line(self, number: int | None, key: str | None, value: Any) -> int | None:
        if number is None:
            first, last = 0, self.headers[0] if self.headers else len(self.lines)
        elif self.headers:
            first = self.headers[number - 1]
            last = self.headers[number] if number < len(self.headers) else len(self.lines)
        else:
            return None
        key_line = re.compile(rf"""^\s*(["']?){re.escape(key)}\1\s*=""") if key is not None else None
        for index in range(first, last):
            code = self.lines[index].split("#", 1)[0]
            if (key_line and key_line.match(code)) or (value is not None and str(value) in code):
                return index + 1
        return first + 1 if number is not None else None
