"""Interface discovery and NCCL/gloo interface selection."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.env import network
from ddpdoctor.env.report import Interface

# Recorded from `ip -j addr` on a training node (trimmed); TEST-NET addresses.
IP_JSON = json.dumps(
    [
        {"ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "link_type": "loopback",
         "addr_info": [{"family": "inet", "local": "127.0.0.1"}, {"family": "inet6", "local": "::1"}]},
        {"ifname": "ens5", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "link_type": "ether",
         "addr_info": [{"family": "inet", "local": "192.0.2.10"}]},
        {"ifname": "ib0", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "link_type": "infiniband",
         "addr_info": [{"family": "inet", "local": "198.51.100.10"}]},
        {"ifname": "docker0", "flags": ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"], "link_type": "ether",
         "addr_info": [{"family": "inet", "local": "172.17.0.1"}]},
        {"ifname": "veth1", "flags": ["BROADCAST"], "link_type": "ether", "addr_info": []},
    ]
)


def test_parse_ip_json() -> None:
    interfaces = network.parse_ip_json(IP_JSON)
    assert [i.name for i in interfaces] == ["lo", "ens5", "ib0", "docker0", "veth1"]
    assert interfaces[0].loopback and interfaces[0].addresses == ["127.0.0.1", "::1"]
    assert not interfaces[4].up and interfaces[4].addresses == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("eth", (False, False, ["eth"])),
        ("^docker,lo", (True, False, ["docker", "lo"])),
        ("=eth0,ib0", (False, True, ["eth0", "ib0"])),
        ("^=lo", (True, True, ["lo"])),
        ("eth0:29400,eth1", (False, False, ["eth0", "eth1"])),
    ],
)
def test_parse_ifname_spec(spec: str, expected: tuple) -> None:
    assert network.parse_ifname_spec(spec) == expected


@pytest.mark.parametrize(
    ("name", "spec", "match"),
    [
        ("eth0", "eth", True),
        ("eth10", "=eth1", False),
        ("eth1", "=eth1", True),
        ("eth0", "^eth", False),
        ("lo", "^docker,lo", False),
        ("ens5", "^docker,lo", True),
        ("lo", "^=lo0", True),
    ],
)
def test_matches_spec(name: str, spec: str, match: bool) -> None:
    assert network.matches_spec(name, spec) is match


def test_nccl_default_prefers_ib() -> None:
    choice = network.choose_nccl_interfaces(network.parse_ip_json(IP_JSON), {})
    assert choice.chosen == ["ib0 (198.51.100.10)"] and choice.spec is None


def test_nccl_default_skips_docker_and_lo_then_falls_back() -> None:
    interfaces = [i for i in network.parse_ip_json(IP_JSON) if i.name != "ib0"]
    assert network.choose_nccl_interfaces(interfaces, {}).chosen == ["ens5 (192.0.2.10)"]
    only_lo = [i for i in interfaces if i.name in ("lo", "docker0")]
    assert network.choose_nccl_interfaces(only_lo, {}).chosen == ["docker0 (172.17.0.1)"]
    loopback = [i for i in interfaces if i.name == "lo"]
    choice = network.choose_nccl_interfaces(loopback, {})
    assert choice.chosen == ["lo (127.0.0.1)"] and "multi-node" in choice.note


def test_nccl_honours_ifname_and_family() -> None:
    interfaces = network.parse_ip_json(IP_JSON)
    assert network.choose_nccl_interfaces(interfaces, {"NCCL_SOCKET_IFNAME": "^ib,docker"}).chosen == [
        "lo (127.0.0.1)",
        "ens5 (192.0.2.10)",
    ]
    v6 = network.choose_nccl_interfaces(
        interfaces, {"NCCL_SOCKET_IFNAME": "lo", "NCCL_SOCKET_FAMILY": "AF_INET6"}
    )
    # NCCL skips the IPv6 loopback address, so lo has nothing left in AF_INET6.
    assert v6.chosen == [] and "matches no interface" in v6.note


def test_gloo_exact_names_and_default_resolution() -> None:
    interfaces = network.parse_ip_json(IP_JSON)
    exact = network.choose_gloo_interfaces(interfaces, {"GLOO_SOCKET_IFNAME": "ens5,ens"}, "h", lambda n: [])
    assert exact.chosen == ["ens5 (192.0.2.10)"] and exact.missing == ["ens"]
    default = network.choose_gloo_interfaces(interfaces, {}, "localhost", network.resolve_host)
    assert default.chosen[0].startswith("lo (") and "loopback" in default.note
    unresolved = network.choose_gloo_interfaces(interfaces, {}, "x.invalid", network.resolve_host)
    assert unresolved.chosen == [] and "does not resolve" in unresolved.note


def test_resolve_host_loopback_and_invalid() -> None:
    assert "127.0.0.1" in network.resolve_host("127.0.0.1")
    assert network.resolve_host("nothing-here.invalid") == []


def test_read_interfaces_from_this_host() -> None:
    interfaces, source = network.read_interfaces()
    assert source in ("ip -j addr", "sysfs")
    lo = next(i for i in interfaces if i.name == "lo")
    assert lo.loopback and "127.0.0.1" in lo.addresses


def test_sysfs_fallback_reads_loopback() -> None:
    lo = next(i for i in network.read_sysfs() if i.name == "lo")
    assert lo.loopback and lo.up and "127.0.0.1" in lo.addresses


def test_local_addresses_strip_scope() -> None:
    interfaces = [Interface("eth0", True, False, ["fe80::1%eth0", "192.0.2.1"])]
    assert network.local_addresses(interfaces) == {"fe80::1", "192.0.2.1"}
