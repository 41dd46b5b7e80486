"""Per-GPU facts read through NVML, each field degrading to None + reason on its own."""

from __future__ import annotations

from typing import Any, Optional

from ddpdoctor.env import nvml as nv
from ddpdoctor.env.report import GpuInfo


def collect_gpus(session: nv.NvmlSession) -> tuple[list[GpuInfo], list[Any]]:
    """Every GPU NVML sees (ignores CUDA_VISIBLE_DEVICES, like nvidia-smi), and their handles."""
    count, reason = session.call("nvmlDeviceGetCount")
    if not isinstance(count, int):
        return [], []
    gpus: list[GpuInfo] = []
    handles: list[Any] = []
    for index in range(count):
        handle, reason = session.call("nvmlDeviceGetHandleByIndex", index)
        info = GpuInfo(index=index)
        if handle is None:
            # A GPU that fell off the bus (GpuIsLost) still gets a row, so it is not silently
            # missing from the report.
            info.unavailable["handle"] = reason or "unknown"
        else:
            _fill(session, handle, info)
        gpus.append(info)
        handles.append(handle)
    return gpus, handles


def _fill(session: nv.NvmlSession, handle: Any, info: GpuInfo) -> None:
    def read(field: str, name: str, *args: Any) -> Any:
        value, reason = session.call(name, handle, *args)
        if reason is not None:
            info.unavailable[field] = reason
        return value

    info.name = nv.text(read("name", "nvmlDeviceGetName"))
    info.uuid = nv.text(read("uuid", "nvmlDeviceGetUUID"))
    pci = read("pci_bus_id", "nvmlDeviceGetPciInfo")
    info.pci_bus_id = nv.text(getattr(pci, "busId", None)) if pci is not None else None

    memory = read("memory", "nvmlDeviceGetMemoryInfo")
    if memory is not None:
        info.memory_total = int(memory.total)
        info.memory_used = int(memory.used)

    temperature = read("temperature_c", "nvmlDeviceGetTemperature", nv.TEMPERATURE_GPU)
    info.temperature_c = int(temperature) if temperature is not None else None
    draw = read("power_draw_w", "nvmlDeviceGetPowerUsage")
    info.power_draw_w = round(draw / 1000.0, 1) if draw is not None else None  # milliwatts
    limit = read("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit")
    info.power_limit_w = round(limit / 1000.0, 1) if limit is not None else None

    mask = _clock_event_mask(session, handle, info)
    if mask is not None:
        info.clock_event_mask = int(mask)
        info.clock_event_reasons = [
            label for bit, label in nv.CLOCK_EVENT_REASONS.items() if mask & bit
        ]

    info.ecc_uncorrected_volatile = read(
        "ecc_uncorrected_volatile",
        "nvmlDeviceGetTotalEccErrors",
        nv.MEMORY_ERROR_TYPE_UNCORRECTED,
        nv.VOLATILE_ECC,
    )
    info.ecc_uncorrected_aggregate = read(
        "ecc_uncorrected_aggregate",
        "nvmlDeviceGetTotalEccErrors",
        nv.MEMORY_ERROR_TYPE_UNCORRECTED,
        nv.AGGREGATE_ECC,
    )
    single = read(
        "retired_pages", "nvmlDeviceGetRetiredPages", nv.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT
    )
    double = read("retired_pages", "nvmlDeviceGetRetiredPages", nv.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT)
    if single is not None and double is not None:
        info.retired_pages = len(single) + len(double)
    pending = read("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus")
    info.retired_pages_pending = bool(pending) if pending is not None else None
    # Ampere and later replace page retirement with row remapping; a pending remap or a failed
    # one is the same "reset this GPU / RMA it" signal.
    rows = read("remapped_rows", "nvmlDeviceGetRemappedRows")
    if rows is not None:
        _corrected, _uncorrected, remap_pending, remap_failure = rows
        info.remapped_rows_pending = bool(remap_pending)
        info.remapped_rows_failure = bool(remap_failure)

    mode = read("compute_mode", "nvmlDeviceGetComputeMode")
    if mode is not None:
        info.compute_mode = nv.COMPUTE_MODES.get(int(mode), f"Unknown({mode})")
    mig = read("mig_mode", "nvmlDeviceGetMigMode")
    if mig is not None:
        info.mig_enabled = bool(mig[0])
        info.mig_pending = bool(mig[1])

    info.pcie_gen = read("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration")
    info.pcie_gen_max = read("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration")
    info.pcie_width = read("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")
    info.pcie_width_max = read("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")

    info.nvlinks_up = _nvlinks_up(session, handle, info)


def _clock_event_mask(session: nv.NvmlSession, handle: Any, info: GpuInfo) -> Optional[int]:
    # ClocksEventReasons is the current name (driver 535+); ThrottleReasons the old one.
    mask, reason = session.call("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:
        mask, reason = session.call("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if mask is None:
        info.unavailable["clock_event_reasons"] = reason or "unknown"
    return int(mask) if mask is not None else None


def _nvlinks_up(session: nv.NvmlSession, handle: Any, info: GpuInfo) -> Optional[int]:
    up = 0
    for link in range(nv.NVLINK_MAX_LINKS):
        state, reason = session.call("nvmlDeviceGetNvLinkState", handle, link)
        if state is None:
            if link == 0:
                # No NVLink at all on this GPU (PCIe cards): n/a rather than 0.
                info.unavailable["nvlinks_up"] = reason or "unknown"
                return None
            break  # past the GPU's last link
        if state:
            up += 1
    return up


def nvlink_peers(session: nv.NvmlSession, handle: Any) -> dict[str, int]:
    """Remote PCI bus id -> number of active links to it (an NVSwitch shows as one peer)."""
    peers: dict[str, int] = {}
    for link in range(nv.NVLINK_MAX_LINKS):
        state, _ = session.call("nvmlDeviceGetNvLinkState", handle, link)
        if state is None:
            break
        if not state:
            continue
        remote, _ = session.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        bus = nv.text(getattr(remote, "busId", None)) if remote is not None else None
        if bus:
            peers[_bus_key(bus)] = peers.get(_bus_key(bus), 0) + 1
    return peers


def _bus_key(bus_id: str) -> str:
    # NVML returns "00000000:07:00.0" in some calls and "0000:07:00.0" in others.
    domain, _, rest = bus_id.partition(":")
    try:
        return f"{int(domain, 16):08x}:{rest.lower()}" if rest else bus_id.lower()
    except ValueError:
        return bus_id.lower()


def bus_key(bus_id: Optional[str]) -> Optional[str]:
    return _bus_key(bus_id) if bus_id else None
