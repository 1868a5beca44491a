"""traffic.io.orientation: which side is local, the direction it gives and the neither-local reject text."""

from __future__ import annotations

import ipaddress

import numpy as np
import pyarrow as pa
import pytest

from traffic.io.orientation import (
    DIRECTION_TEXTS,
    IN,
    INTERNAL,
    OUT,
    UNKNOWN,
    LocalNetworks,
    direction_codes,
    local_keys,
    local_networks,
    local_texts,
    neither_local_reason,
)

NETWORKS = ["10.0.0.0/8", " 192.168.1.0/24 ", "2001:db8::/32", "fe80::1/128"]


def key(address: str) -> list[int]:
    """The 17-byte key the capture reader builds: family byte, then 16 address bytes (IPv4 last)."""
    ip = ipaddress.ip_address(address)
    return [ip.version] + [0] * (16 - len(ip.packed)) + list(ip.packed)


def test_local_networks_reads_cidr_as_network_and_mask_per_family():
    got = local_networks(["10.1.2.3/8", "2001:db8::/32"])
    assert got == LocalNetworks(v4=((0x0A000000, 0xFF000000),),
                                v6=((0x20010DB8 << 96, ((1 << 32) - 1) << 96),))
    assert local_networks([]) == LocalNetworks()


def test_local_networks_rejects_a_bad_entry_and_a_bare_string():
    with pytest.raises(ValueError, match=r"local_networks: '10\.0\.0\.0/33' is not a CIDR network"):
        local_networks(["10.0.0.0/8", "10.0.0.0/33"])
    with pytest.raises(TypeError, match="a list of CIDR strings, not one string"):
        local_networks("10.0.0.0/8")
    with pytest.raises(ValueError, match=r"local_networks: \['x'\] is not a CIDR network"):
        local_networks([["x"]])


ADDRESSES = {
    "10.0.0.1": True, "10.255.255.255": True, "11.0.0.0": False, "9.255.255.255": False,
    "192.168.1.77": True, "192.168.2.1": False,
    "2001:db8::1": True, "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff": True, "2001:db9::": False,
    "fe80::1": True, "fe80::2": False,
    "::a00:1": False,  # the bytes of 10.0.0.1, but IPv6: families never mix
}


def test_local_keys_matches_each_family_against_its_own_networks():
    keys = np.array([key(a) for a in ADDRESSES] + [[0] * 17], np.uint8)  # last: a frame that is no IP packet
    got = local_keys(keys, local_networks(NETWORKS))
    assert got.tolist() == [*ADDRESSES.values(), False]


def test_local_texts_agrees_with_local_keys_and_null_is_never_local():
    addresses = pa.chunked_array([list(ADDRESSES)[:5], [*list(ADDRESSES)[5:], None, "10.0.0.1"]])
    got = local_texts(addresses, local_networks(NETWORKS))
    assert got.tolist() == [*ADDRESSES.values(), False, True]


def test_nothing_is_local_without_networks():
    keys = np.array([key(a) for a in ADDRESSES], np.uint8)
    assert not local_keys(keys, LocalNetworks()).any()
    assert not local_texts(pa.array(list(ADDRESSES)), LocalNetworks()).any()
    assert local_texts(pa.array([None, None], pa.string()), local_networks(NETWORKS)).tolist() == [False, False]


def test_direction_from_which_sides_are_local():
    src = np.array([True, True, False, False])
    dst = np.array([True, False, True, False])
    codes = direction_codes(src, dst)
    assert codes.tolist() == [INTERNAL, OUT, IN, UNKNOWN]
    assert DIRECTION_TEXTS.take(pa.array(codes)).to_pylist() == ["internal", "out", "in", None]


def test_the_neither_local_reject_text():
    got = neither_local_reason(pa.array(["192.0.2.1", "2001:db9::1"]), pa.array(["198.51.100.7", "2001:dba::"]))
    assert got.to_pylist() == [
        "neither address is in local_networks (192.0.2.1 → 198.51.100.7)",
        "neither address is in local_networks (2001:db9::1 → 2001:dba::)",
    ]
