"""The accounts mapping: longest prefix wins, versions by date, every load error names file, line and entry."""

from __future__ import annotations

import ipaddress
import random
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

import traffic
from traffic.core.accounts import NO_ACCOUNTS, UNASSIGNED, AccountsError, load_accounts, parse_accounts

NESTED = """
[[version]]
name = "v1"
effective_from = 2026-01-01

[version.accounts]
a = ["10.0.0.0/8", "2001:db8::/32"]
b = ["10.1.0.0/16", "2001:db8:1::/48"]
c = ["10.1.2.0/24", "2001:db8:1:2::/64", "192.0.2.7"]
"""


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def _both_ways(version, ips):
    """Scalar and vectorised lookups, which must agree."""
    scalar = [version.lookup(ip) for ip in ips]
    assert version.lookup_many(ips).to_pylist() == scalar
    return scalar


def test_longest_prefix_wins_ipv4_and_ipv6():
    version = parse_accounts(NESTED).versions[0]
    ips = ["10.9.9.9", "10.1.9.9", "10.1.2.3", "10.1.2.255", "10.1.3.0", "192.0.2.7", "192.0.2.8",
           "2001:db8:ffff::1", "2001:db8:1:ffff::1", "2001:db8:1:2::abcd", "2001:db9::1"]
    assert _both_ways(version, ips) == ["a", "b", "c", "c", "b", "c", UNASSIGNED,
                                        "a", "b", "c", UNASSIGNED]


def test_unmatched_null_and_unparsable_addresses_are_unassigned():
    version = parse_accounts(NESTED).versions[0]
    ips = ["11.0.0.1", None, "", "10.1.2", "10.1.2.256", "010.1.2.3", " 10.1.2.3", "not an ip",
           "::ffff:10.1.2.3", "::1"]
    assert _both_ways(version, ips) == [UNASSIGNED] * len(ips)


def test_lookup_many_takes_arrow_arrays_of_any_string_type():
    version = parse_accounts(NESTED).versions[0]
    chunked = pa.chunked_array([["10.1.2.3", None], ["10.9.0.1", "10.1.2.3"]])
    assert version.lookup_many(chunked).to_pylist() == ["c", UNASSIGNED, "a", "c"]
    large = pa.array(["10.1.0.1", "2001:db8::1"], pa.large_string())
    result = version.lookup_many(large)
    assert result.type == pa.string() and result.to_pylist() == ["b", "a"]
    assert version.lookup_many([]).to_pylist() == []


def _random_mapping(rng: random.Random) -> tuple[str, list[tuple[ipaddress._BaseNetwork, str]]]:
    """Overlapping blocks of many prefix lengths in few accounts, as TOML and as a list."""
    blocks: dict[ipaddress._BaseNetwork, str] = {}
    for _ in range(300):
        account = rng.choice(["red", "green", "blue", "grey"])
        if rng.random() < 0.8:
            base = ipaddress.IPv4Address((10 << 24) | rng.getrandbits(24))
            network = ipaddress.ip_network(f"{base}/{rng.randint(8, 32)}", strict=False)
        else:
            base = ipaddress.IPv6Address((0x20010db8 << 96) | rng.getrandbits(96))
            network = ipaddress.ip_network(f"{base}/{rng.randint(32, 128)}", strict=False)
        blocks.setdefault(network, account)
    by_account: dict[str, list[str]] = {}
    for network, account in blocks.items():
        by_account.setdefault(account, []).append(f'"{network}"')
    text = "[[version]]\neffective_from = 2026-01-01\n[version.accounts]\n" + "".join(
        f"{account} = [{', '.join(networks)}]\n" for account, networks in by_account.items())
    return text, list(blocks.items())


def _reference(blocks, ip: str | None) -> str:
    """Brute force: the account of the longest block that holds the address."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return UNASSIGNED
    holding = [(n.prefixlen, a) for n, a in blocks if n.version == address.version and address in n]
    return max(holding)[1] if holding else UNASSIGNED


def test_vectorised_lookup_equals_scalar_and_brute_force_on_random_addresses():
    rng = random.Random(20260101)
    text, blocks = _random_mapping(rng)
    version = parse_accounts(text).versions[0]
    ips: list[str | None] = []
    for _ in range(4000):
        roll = rng.random()
        if roll < 0.3:  # near the blocks: inside or just past one
            network = rng.choice(blocks)[0]
            offset = rng.choice([0, network.num_addresses - 1, network.num_addresses, rng.getrandbits(8)])
            ips.append(str(ipaddress.ip_address(min(int(network.network_address) + offset,
                                                    2 ** network.max_prefixlen - 1))))
        elif roll < 0.75:
            ips.append(str(ipaddress.IPv4Address((10 << 24) | rng.getrandbits(24))))
        elif roll < 0.85:
            ips.append(str(ipaddress.IPv4Address(rng.getrandbits(32))))
        elif roll < 0.95:
            ips.append(str(ipaddress.IPv6Address((0x20010db8 << 96) | rng.getrandbits(96))))
        else:
            ips.append(rng.choice([None, "", "10.0.0", "300.1.1.1", "fe80::1::1"]))
    expected = [_reference(blocks, ip) for ip in ips]
    assert len(set(expected)) == 5  # every account and unassigned occur
    assert [version.lookup(ip) for ip in ips] == expected
    assert version.lookup_many(pa.array(ips, pa.string())).to_pylist() == expected


def test_versions_apply_from_their_date_and_everything_before_is_unassigned():
    accounts = parse_accounts(NESTED + """
[[version]]
name = "v2"
effective_from = 2026-03-15T12:00:00Z
[version.accounts]
b = ["10.0.0.0/8"]
""")
    v1, v2 = accounts.versions
    assert accounts.version_at(_utc(2025, 12, 31, 23, 59)) is NO_ACCOUNTS
    assert NO_ACCOUNTS.lookup("10.1.2.3") == UNASSIGNED and NO_ACCOUNTS.id.startswith("none@")
    assert accounts.version_at(_utc(2026, 1, 1)) is v1
    assert accounts.version_at(_utc(2026, 3, 15, 11, 55)).lookup("10.1.2.3") == "c"
    assert accounts.version_at(_utc(2026, 3, 15, 12)) is v2
    assert accounts.version_at(datetime(2026, 3, 15, 12)).lookup("10.1.2.3") == "b"  # naive is UTC
    assert accounts.versions_during(_utc(2026, 3, 1), _utc(2026, 4, 1)) == (v1, v2)
    assert accounts.versions_during(_utc(2026, 3, 1), _utc(2026, 3, 15, 12)) == (v1,)
    assert accounts.versions_during(_utc(2025, 12, 1), _utc(2026, 1, 1, 0, 5)) == (NO_ACCOUNTS, v1)


def test_version_id_is_name_and_content_hash():
    v1 = parse_accounts(NESTED).versions[0]
    assert v1.id.startswith("v1@") and len(v1.id) == len("v1@") + 10
    assert parse_accounts(NESTED).versions[0].id == v1.id
    reordered = NESTED.replace('a = ["10.0.0.0/8", "2001:db8::/32"]', 'a = ["2001:db8::/32", "10.0.0.0/8"]')
    assert parse_accounts(reordered).versions[0].id == v1.id
    moved = parse_accounts(NESTED.replace('"192.0.2.7"', '"192.0.2.8"')).versions[0]
    assert moved.id != v1.id and moved.id.startswith("v1@")
    unnamed = parse_accounts(NESTED.replace('name = "v1"\n', "")).versions[0]
    assert unnamed.name == "2026-01-01"
    noon = parse_accounts(NESTED.replace('name = "v1"\n', "").replace("2026-01-01", "2026-01-01T12:00:00+01:00"))
    assert noon.versions[0].name == "2026-01-01T11:00Z"


def test_no_file_means_everything_unassigned_and_a_missing_file_is_an_error(tmp_path):
    accounts = load_accounts(None)
    assert accounts.version_at(_utc(2026, 1, 1)) is NO_ACCOUNTS
    with pytest.raises(AccountsError, match=f"accounts file {tmp_path / 'nope.toml'} does not exist"):
        load_accounts(tmp_path / "nope.toml")


def test_the_shipped_example_loads_and_does_what_its_comments_say():
    accounts = load_accounts(Path(traffic.__file__).parent / "conf" / "accounts.toml")
    initial, grows = accounts.versions
    assert (initial.name, grows.name) == ("initial", "acme-grows")
    assert _both_ways(initial, ["192.0.2.1", "192.0.2.200", "198.51.100.1", "198.51.100.70", "2001:db8:a::1"]) \
        == ["acme", UNASSIGNED, "globex", "globex-lab", "acme"]
    assert accounts.version_at(_utc(2026, 7, 1)).lookup("192.0.2.200") == "acme"


HEADER = '[[version]]\nname = "v1"\neffective_from = 2026-01-01\n[version.accounts]\n'


@pytest.mark.parametrize("text,message", [
    ("not toml = = 1", "acc.toml: not valid TOML: Expected '=' after a key in a key/value pair (at line 1, column 5)"),
    ("", "acc.toml: no [[version]] tables (each gives effective_from and [version.accounts])"),
    ("owner = 'me'\n" + HEADER,
     "acc.toml:1: unknown key 'owner' (an accounts file has only [[version]] tables)"),
    (HEADER.replace("name", "label"),
     "acc.toml:2: version 1: unknown key 'label' (known: name, effective_from, accounts, limits)"),
    (HEADER.replace("effective_from = 2026-01-01\n", ""),
     "acc.toml:1: version 1: effective_from is missing (e.g. 2026-01-01)"),
    (HEADER.replace("2026-01-01", '"soon"'),
     "acc.toml:3: version 1: effective_from 'soon' is not a date (2026-01-01, UTC midnight) "
     "or a time (2026-01-15T12:00:00Z)"),
    (HEADER.replace("2026-01-01", "2026-01-01T00:02:00Z"),
     "acc.toml:3: version 1: effective_from 2026-01-01T00:02:00+00:00 is not on a 5-minute pane boundary; "
     "a pane has one mapping"),
    (HEADER.replace('"v1"', '""'), "acc.toml:2: version 1: name must be a non-empty string, not ''"),
    (HEADER.replace("[version.accounts]\n", ""),
     "acc.toml:1: version 1 (v1): needs a [version.accounts] table (account = [CIDR, ...])"),
    (HEADER + 'a = ["10.0.0.0/33"]\n',
     "acc.toml:5: version 1 (v1), account 'a': '10.0.0.0/33' is not a CIDR block (e.g. 10.1.0.0/16, "
     "2001:db8:1::/48)"),
    (HEADER + 'a = ["10.0.0.0/8"]\nb = ["10.1.2.3/16"]\n',
     "acc.toml:6: version 1 (v1), account 'b': '10.1.2.3/16' has host bits set; did you mean '10.1.0.0/16'?"),
    (HEADER + 'a = ["2001:db8::1/32"]\n',
     "acc.toml:5: version 1 (v1), account 'a': '2001:db8::1/32' has host bits set; did you mean '2001:db8::/32'?"),
    (HEADER + 'a = ["2001:db8::/32"]\nb = ["10.0.0.0/8", "2001:DB8:0::/32"]\n',
     "acc.toml:6: version 1 (v1), account 'b': '2001:DB8:0::/32' is also given to account 'a'; "
     "a block belongs to one account"),
    (HEADER + 'a = ["10.0.0.0/8", "10.0.0.0/8"]\n',
     "acc.toml:5: version 1 (v1), account 'a': '10.0.0.0/8' is listed twice; a block belongs to one account"),
    (HEADER + 'a = "10.0.0.0/8"\n',
     "acc.toml:5: version 1 (v1), account 'a': give a list of CIDR blocks, not '10.0.0.0/8'"),
    (HEADER + "a = [10]\n",
     "acc.toml:5: version 1 (v1), account 'a': 10 is not a CIDR block in quotes (\"10.1.0.0/16\")"),
    (HEADER + 'b = ["10.0.0.0/8"]\n"" = ["10.1.0.0/16"]\n',
     "acc.toml:6: version 1 (v1): account name '' is empty or has surrounding spaces"),
    (HEADER + '" a" = ["10.1.0.0/16"]\n',
     "acc.toml:5: version 1 (v1): account name ' a' is empty or has surrounding spaces"),
    (HEADER + 'Unassigned = ["10.1.0.0/16"]\n',
     "acc.toml:5: version 1 (v1): account name 'Unassigned' is reserved for addresses no block covers"),
    (HEADER + HEADER.replace('"v1"', '"v2"').replace("2026-01-01", "2025-12-01"),
     "acc.toml:7: version 2 (v2) effective 2025-12-01T00:00:00+00:00 is not after version 1 (v1) effective "
     "2026-01-01T00:00:00+00:00; list versions oldest first"),
    (HEADER + HEADER.replace('"v1"', '"v2"'),
     "acc.toml:7: version 2 (v2) effective 2026-01-01T00:00:00+00:00 has the same effective_from as version 1 "
     "(v1) effective 2026-01-01T00:00:00+00:00; list versions oldest first"),
    (HEADER + HEADER.replace("2026-01-01", "2026-02-01"),
     "acc.toml:6: version 2: name 'v1' is already used by an earlier version"),
])
def test_every_load_error_names_file_line_and_entry(text, message):
    with pytest.raises(AccountsError) as error:
        parse_accounts(text, "acc.toml")
    assert str(error.value) == message


def test_load_errors_name_the_file_path(tmp_path):
    path = tmp_path / "accounts.toml"
    path.write_text(HEADER + 'a = ["10.1.2.3/16"]\n')
    with pytest.raises(AccountsError) as error:
        load_accounts(path)
    assert str(error.value).startswith(f"{path}:5: version 1 (v1), account 'a': '10.1.2.3/16' has host bits set")


@pytest.mark.parametrize("name, shown", [("evil\\nname", "'evil\\nname'"), ("acme\\u202e", "'acme\\u202e'"),
                                         ("zero\\u200bwidth", "'zero\\u200bwidth'"), ("tab\\there", "'tab\\there'")])
def test_an_account_name_with_a_control_or_format_character_is_refused_with_one_line(name, shown):
    with pytest.raises(AccountsError) as error:
        parse_accounts(HEADER + f'"{name}" = ["10.1.0.0/16"]\n', "acc.toml")
    message = str(error.value)
    assert message.startswith(f"acc.toml:") and f"account name {shown} has a control character" in message
    assert "\n" not in message


def test_account_names_in_any_script_with_spaces_inside_are_kept():
    text = HEADER + '"株式会社\u3000東京" = ["10.1.0.0/16"]\n"Société Générale" = ["10.2.0.0/16"]\n'
    assert sorted(parse_accounts(text).versions[0].accounts) == ["Société Générale", "株式会社\u3000東京"]
