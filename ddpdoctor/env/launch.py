"""The launch environment: rendezvous variables, NCCL/gloo settings, CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import ipaddress
import os
from typing import Callable, Mapping, Optional

from ddpdoctor.env import network
from ddpdoctor.env.report import GpuInfo, Interface, LaunchInfo, MasterCheck, VisibleDevices

NAMED_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "OMP_NUM_THREADS",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
)
PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCHELASTIC_", "HOROVOD_")


def relevant_variables(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        key: environ[key]
        for key in sorted(environ)
        if key in NAMED_VARIABLES or key.startswith(PREFIXES)
    }


def parse_visible_devices(spec: Optional[str], gpus: Optional[list[GpuInfo]]) -> VisibleDevices:
    """What CUDA makes of CUDA_VISIBLE_DEVICES.

    CUDA reads the list left to right and stops at the first entry it cannot map to a device
    (a bad index, "-1", an unknown UUID): everything after it is dropped without a word. A
    device named twice leaves no device visible at all (torch's own parser mirrors this).
    `gpus` is None when NVML could not list the GPUs: indices are then not range-checked and
    only the count of visible devices is known.

    Indices are taken as NVML's (PCI bus) order. CUDA's default order is fastest-first, which
    equals bus order on nodes with one GPU model (every training node this is meant for);
    on mixed nodes set CUDA_DEVICE_ORDER=PCI_BUS_ID, as nvidia-smi users must anyway.
    """
    if spec is None:
        if gpus is None:
            return VisibleDevices(None, None, None)
        return VisibleDevices(None, [g.index for g in gpus], len(gpus))
    entries = [e.strip() for e in spec.split(",")] if spec.strip() else []
    result = VisibleDevices(spec=spec, visible=[] if gpus is not None else None, count=0)
    seen: set[object] = set()
    for position, entry in enumerate(entries):
        key = _resolve_entry(entry, gpus)
        if key is None and position == 0 and entry == "-1":
            # The documented way to hide every GPU (CPU-only runs): deliberate, not invalid.
            result.ignored = entries[1:]
            break
        if key is None:
            result.invalid.append(entry)
            result.ignored = entries[position + 1 :]
            break
        if key in seen:
            result.duplicates.append(entry)
            continue
        seen.add(key)
        result.count = (result.count or 0) + 1
        if isinstance(key, int) and result.visible is not None:
            result.visible.append(key)
    if result.duplicates:
        result.visible = [] if result.visible is not None else None
        result.count = 0
    return result


def _decimal(text: str) -> Optional[int]:
    """`text` as a small decimal integer (an optional minus sign, ASCII digits, at most 18 of them), or
    None. str.isdigit() also accepts digits int() refuses ('²') and int() refuses more than 4,300
    digits: a launch variable is anything a user or a script put there."""
    digits = text[1:] if text.startswith("-") else text
    if not (0 < len(digits) <= 18 and digits.isascii() and digits.isdigit()):
        return None
    return int(text)


def _resolve_entry(entry: str, gpus: Optional[list[GpuInfo]]) -> Optional[object]:
    """The NVML index an entry names, a string key for a device NVML cannot place, or None."""
    if entry.lstrip("-").isdigit():
        index = _decimal(entry)
        if index is None or index < 0 or (gpus is not None and index >= len(gpus)):
            return None
        return index
    if entry.startswith("MIG-"):
        # A MIG instance; NVML's GPU list cannot map it back, but it is one CUDA device.
        if gpus is not None and not any(g.mig_enabled for g in gpus):
            return None
        return entry
    if entry.startswith("GPU-"):
        if gpus is None:
            return entry
        # CUDA accepts any unique prefix of a GPU UUID.
        matches = [g.index for g in gpus if g.uuid and g.uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None


def check_master(
    environ: Mapping[str, str],
    interfaces: list[Interface],
    host: str,
    resolve: Callable[[str], list[str]] = network.resolve_host,
    port_free: Callable[[str, int], bool] = network.port_is_free,
) -> MasterCheck:
    check = MasterCheck(addr=environ.get("MASTER_ADDR"), port=environ.get("MASTER_PORT"))
    if not check.addr:
        return check
    check.resolved = resolve(check.addr)
    if not check.resolved:
        check.resolve_error = f"{check.addr!r} does not resolve on this host"
        return check
    local = network.local_addresses(interfaces)
    check.is_local = check.addr in (host, "localhost") or any(
        a in local or ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in check.resolved
    )
    if check.port is None:
        return check
    port = _decimal(check.port)
    if port is None or not 0 < port < 65536:
        check.port_free = False
        check.port_note = f"MASTER_PORT={check.port!r} is not a TCP port number"
        return check
    if not check.is_local:
        check.port_note = "not checked: the master is another host"
        return check
    if "RANK" in environ or "TORCHELASTIC_RUN_ID" in environ:
        # Inside a launched job rank 0's TCPStore already holds the port; that is not a fault.
        check.port_note = "not checked: running inside a launched job"
        return check
    address = next(
        (a for a in check.resolved if a.split("%", 1)[0] in local or _is_loopback(a)),
        check.resolved[0],
    )
    check.port_free = port_free(address, port)
    if not check.port_free:
        check.port_note = f"something on this host already listens on {address}:{check.port}"
    return check


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback


def collect_launch(
    environ: Mapping[str, str],
    gpus: Optional[list[GpuInfo]],
    torch_device_count: Optional[int],
    interfaces: Optional[list[Interface]] = None,
    interfaces_source: str = "",
    host: Optional[str] = None,
) -> LaunchInfo:
    if interfaces is None:
        interfaces, interfaces_source = network.read_interfaces()
    host = host or network.hostname()
    visible = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    # NVML's view filtered through CUDA_VISIBLE_DEVICES; torch's count when NVML is unavailable.
    visible_count = visible.count if gpus is not None else torch_device_count
    return LaunchInfo(
        variables=relevant_variables(environ),
        hostname=host,
        cpu_count=os.cpu_count(),
        interfaces=interfaces,
        interfaces_source=interfaces_source,
        master=check_master(environ, interfaces, host),
        nccl_socket=network.choose_nccl_interfaces(interfaces, environ),
        gloo_socket=network.choose_gloo_interfaces(
            interfaces, environ, host, network.resolve_host
        ),
        cuda_visible_devices=visible,
        visible_gpu_count=visible_count,
    )
