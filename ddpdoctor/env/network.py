"""The host's network interfaces, and which of them NCCL's and gloo's bootstrap would use."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import shutil
import socket
import struct
import subprocess
from pathlib import Path
from typing import Callable, Mapping, Optional

from ddpdoctor.env.report import Interface, SocketChoice

_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8


def read_interfaces() -> tuple[list[Interface], str]:
    """All interfaces with their addresses, and where that came from ("ip -j addr" or "sysfs")."""
    ip = shutil.which("ip")
    if ip:
        try:
            result = subprocess.run(
                [ip, "-j", "addr"], capture_output=True, text=True, timeout=5, check=False
            )
            if result.returncode == 0 and result.stdout.strip():
                return parse_ip_json(result.stdout), "ip -j addr"
        except (OSError, subprocess.SubprocessError, ValueError):
            pass  # busybox `ip` has no -j; fall through to sysfs
    return read_sysfs(), "sysfs"


def parse_ip_json(payload: str) -> list[Interface]:
    interfaces = []
    for entry in json.loads(payload):
        flags = entry.get("flags", [])
        interfaces.append(
            Interface(
                name=entry["ifname"],
                up="UP" in flags,
                loopback="LOOPBACK" in flags or entry.get("link_type") == "loopback",
                addresses=[
                    a["local"]
                    for a in entry.get("addr_info", [])
                    if a.get("family") in ("inet", "inet6") and "local" in a
                ],
            )
        )
    return interfaces


def read_sysfs(root: Path = Path("/sys/class/net")) -> list[Interface]:
    interfaces = []
    ipv6 = _read_ipv6_addresses()
    try:
        names = sorted(p.name for p in root.iterdir())
    except OSError:
        names = [name for _index, name in socket.if_nameindex()]
    for name in names:
        flags = _read_flags(root / name / "flags")
        addresses = []
        ipv4 = _ipv4_address(name)
        if ipv4:
            addresses.append(ipv4)
        addresses.extend(ipv6.get(name, []))
        interfaces.append(
            Interface(
                name=name,
                up=bool(flags & _IFF_UP),
                loopback=bool(flags & _IFF_LOOPBACK),
                addresses=addresses,
            )
        )
    return interfaces


def _read_flags(path: Path) -> int:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return 0


def _ipv4_address(name: str) -> Optional[str]:
    # SIOCGIFADDR returns the interface's primary IPv4 address (one per interface).
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            request = struct.pack("256s", name.encode()[:15])
            reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            return socket.inet_ntoa(reply[20:24])
    except OSError:
        return None


def _read_ipv6_addresses(path: Path = Path("/proc/net/if_inet6")) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) >= 6:
            address = str(ipaddress.IPv6Address(bytes.fromhex(parts[0])))
            found.setdefault(parts[5], []).append(address)
    return found


# --- NCCL --------------------------------------------------------------------------------------


def parse_ifname_spec(spec: str) -> tuple[bool, bool, list[str]]:
    """NCCL_SOCKET_IFNAME syntax: optional '^' (exclude), then optional '=' (exact names),
    then a comma-separated list of prefixes, each optionally suffixed with ':port'."""
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    names = [item.split(":", 1)[0].strip() for item in spec.split(",")]
    return exclude, exact, [n for n in names if n]


def matches_spec(name: str, spec: str) -> bool:
    exclude, exact, names = parse_ifname_spec(spec)
    hit = any(name == n if exact else name.startswith(n) for n in names)
    return not hit if exclude else hit


def _nccl_candidates(interfaces: list[Interface], family: Optional[str]) -> list[Interface]:
    # NCCL walks getifaddrs(): only interfaces holding an IPv4/IPv6 address count, and the IPv6
    # loopback address is skipped. NCCL_SOCKET_FAMILY=AF_INET/AF_INET6 narrows the family.
    out = []
    for interface in interfaces:
        usable = []
        for address in interface.addresses:
            try:
                ip = ipaddress.ip_address(address.split("%", 1)[0])
            except ValueError:
                continue
            if ip.version == 6 and ip.is_loopback:
                continue
            if family == "AF_INET" and ip.version != 4:
                continue
            if family == "AF_INET6" and ip.version != 6:
                continue
            usable.append(address)
        if usable:
            out.append(Interface(interface.name, interface.up, interface.loopback, usable))
    return out


def choose_nccl_interfaces(
    interfaces: list[Interface], environ: Mapping[str, str]
) -> SocketChoice:
    spec = environ.get("NCCL_SOCKET_IFNAME")
    candidates = _nccl_candidates(interfaces, environ.get("NCCL_SOCKET_FAMILY"))

    def pick(pattern: str) -> list[str]:
        return [f"{i.name} ({i.addresses[0]})" for i in candidates if matches_spec(i.name, pattern)]

    if spec:
        chosen = pick(spec)
        note = "from NCCL_SOCKET_IFNAME" if chosen else "NCCL_SOCKET_IFNAME matches no interface"
        return SocketChoice("NCCL_SOCKET_IFNAME", spec, chosen, note)
    # NCCL's own fallback order (bootstrap's ncclFindInterfaces): InfiniBand IPoIB first,
    # then anything but docker and loopback, then docker, then loopback.
    for pattern, note in (
        ("ib", "default: IPoIB interfaces first"),
        ("^docker,lo", "default: any interface except docker* and lo*"),
        ("docker", "default: only docker* interfaces left"),
        ("lo", "default: only loopback left; multi-node jobs will not connect"),
    ):
        chosen = pick(pattern)
        if chosen:
            return SocketChoice("NCCL_SOCKET_IFNAME", None, chosen, note)
    return SocketChoice("NCCL_SOCKET_IFNAME", None, [], "no interface with an address")


# --- gloo --------------------------------------------------------------------------------------


def choose_gloo_interfaces(
    interfaces: list[Interface],
    environ: Mapping[str, str],
    hostname: str,
    resolve: Callable[[str], list[str]],
) -> SocketChoice:
    """GLOO_SOCKET_IFNAME is a comma-separated list of exact interface names (one gloo device
    each); gloo has no prefix or '^' syntax. Unset, gloo binds the address the hostname
    resolves to."""
    spec = environ.get("GLOO_SOCKET_IFNAME")
    by_name = {i.name: i for i in interfaces}
    if spec:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        chosen = [
            f"{n} ({by_name[n].addresses[0]})" if by_name[n].addresses else f"{n} (no address)"
            for n in names
            if n in by_name
        ]
        missing = [n for n in names if n not in by_name]
        note = "from GLOO_SOCKET_IFNAME (exact names)"
        if missing:
            note = f"GLOO_SOCKET_IFNAME names missing interface(s): {', '.join(missing)}"
        return SocketChoice("GLOO_SOCKET_IFNAME", spec, chosen, note, missing)
    addresses = resolve(hostname)
    owners = [
        f"{i.name} ({a})" for a in addresses for i in interfaces if a in i.addresses
    ]
    if not addresses:
        note = f"default: hostname {hostname!r} does not resolve; gloo will fail to start"
    elif all(ipaddress.ip_address(a).is_loopback for a in addresses):
        note = f"default: hostname {hostname!r} resolves to loopback; multi-node gloo will hang"
    else:
        note = f"default: the address hostname {hostname!r} resolves to"
    return SocketChoice("GLOO_SOCKET_IFNAME", None, owners or addresses, note)


def resolve_host(name: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    seen: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in seen:
            seen.append(address)
    return seen


def port_is_free(address: str, port: int) -> bool:
    """Try the bind TCPStore will do. SO_REUSEADDR, as TCPStore sets it, so sockets lingering in
    TIME_WAIT from the last run do not count as busy; a live listener still does."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def local_addresses(interfaces: list[Interface]) -> set[str]:
    return {a.split("%", 1)[0] for i in interfaces for a in i.addresses}


def hostname() -> str:
    return socket.gethostname()

