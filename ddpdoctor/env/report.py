"""The data `ddpdoctor env` collects, as plain dataclasses.

Collection (software.py, gpus.py, topology.py, launch.py, network.py) fills these in;
`diagnose.py` reads them and nothing else, so findings can be tested over hand-built reports
and the probe can ship a report across processes as JSON.

`None` always means "could not be read on this host"; the reason sits next to it
(`GpuInfo.unavailable`, `SoftwareInfo.*_error`), and renderers print it as "n/a".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional


@dataclass
class HorovodInfo:
    installed: bool
    version: Optional[str] = None
    frameworks: dict[str, bool] = field(default_factory=dict)
    controllers: dict[str, Optional[bool]] = field(default_factory=dict)
    tensor_operations: dict[str, Optional[bool]] = field(default_factory=dict)
    error: Optional[str] = None


@dataclass
class NvmlStatus:
    available: bool
    # One human line, e.g. "NVML: no NVIDIA driver on this host".
    message: str
    bindings_version: Optional[str] = None
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None
    nvml_version: Optional[str] = None


@dataclass
class SoftwareInfo:
    python: str
    platform: str
    torch: Optional[str] = None
    torch_error: Optional[str] = None
    torch_cuda: Optional[str] = None
    torch_cudnn: Optional[str] = None
    torch_nccl: Optional[str] = None
    distributed_available: bool = False
    # Backend name -> whether this torch build has it; empty when torch is missing.
    backends: dict[str, bool] = field(default_factory=dict)
    # torch.cuda.device_count(): respects CUDA_VISIBLE_DEVICES; used when NVML is unavailable.
    torch_device_count: Optional[int] = None
    horovod: HorovodInfo = field(default_factory=lambda: HorovodInfo(installed=False))
    nvml: NvmlStatus = field(default_factory=lambda: NvmlStatus(False, "NVML: not queried"))


@dataclass
class GpuInfo:
    index: int
    name: Optional[str] = None
    uuid: Optional[str] = None
    pci_bus_id: Optional[str] = None
    memory_total: Optional[int] = None  # bytes
    memory_used: Optional[int] = None  # bytes
    temperature_c: Optional[int] = None
    power_draw_w: Optional[float] = None
    power_limit_w: Optional[float] = None
    clock_event_mask: Optional[int] = None
    clock_event_reasons: Optional[list[str]] = None
    ecc_uncorrected_volatile: Optional[int] = None
    ecc_uncorrected_aggregate: Optional[int] = None
    retired_pages: Optional[int] = None
    retired_pages_pending: Optional[bool] = None
    remapped_rows_pending: Optional[bool] = None
    remapped_rows_failure: Optional[bool] = None
    compute_mode: Optional[str] = None
    mig_enabled: Optional[bool] = None
    mig_pending: Optional[bool] = None
    pcie_gen: Optional[int] = None
    pcie_gen_max: Optional[int] = None
    pcie_width: Optional[int] = None
    pcie_width_max: Optional[int] = None
    nvlinks_up: Optional[int] = None
    # field name -> why it is None ("Not Supported", "Insufficient Permissions", ...).
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"GPU {self.index}"

    @property
    def path(self) -> str:
        # Findings about one GPU carry it as their path. In angle brackets, like `<env>`, so
        # reporters treat it as a pseudo path and do not count it as a file.
        return f"<{self.label}>"


@dataclass
class TopologyInfo:
    gpus: list[int]
    # matrix[i][j]: "X" on the diagonal, "NV<n>", "PIX", "PXB", "PHB", "NODE", "SYS" or "n/a",
    # the legend of `nvidia-smi topo -m`.
    matrix: list[list[str]]
    # p2p_read[i][j]: "OK", "CNS", "GNS", "TNS", "DR", "NS", "U" or "n/a" (nvidia-smi topo -p2p r).
    p2p_read: list[list[str]]


@dataclass
class Interface:
    name: str
    up: bool
    loopback: bool
    addresses: list[str] = field(default_factory=list)


@dataclass
class MasterCheck:
    addr: Optional[str] = None
    port: Optional[str] = None
    resolved: Optional[list[str]] = None
    resolve_error: Optional[str] = None
    is_local: Optional[bool] = None
    # None when not checked; see `port_note` for why.
    port_free: Optional[bool] = None
    port_note: Optional[str] = None


@dataclass
class SocketChoice:
    """Which interfaces a backend's bootstrap would pick, and from which setting."""

    variable: str
    spec: Optional[str]
    chosen: list[str]
    note: str = ""
    # Names the variable asks for that this host does not have (gloo's exact-name list).
    missing: list[str] = field(default_factory=list)


@dataclass
class VisibleDevices:
    spec: Optional[str]
    # NVML indices CUDA would expose, in CUDA order; None when NVML cannot list the GPUs.
    visible: Optional[list[int]]
    # How many CUDA devices that makes (MIG instances included); None when unknown.
    count: Optional[int]
    duplicates: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    # Entries after the first invalid one, which CUDA silently drops.
    ignored: list[str] = field(default_factory=list)


@dataclass
class LaunchInfo:
    variables: dict[str, str]
    hostname: str
    cpu_count: Optional[int]
    interfaces: list[Interface]
    interfaces_source: str
    master: MasterCheck
    nccl_socket: SocketChoice
    gloo_socket: SocketChoice
    cuda_visible_devices: VisibleDevices
    # The number of GPUs the job can use: NVML count filtered by CUDA_VISIBLE_DEVICES, or torch's.
    visible_gpu_count: Optional[int] = None


@dataclass
class EnvReport:
    software: SoftwareInfo
    gpus: list[GpuInfo]
    topology: Optional[TopologyInfo]
    launch: LaunchInfo

    def to_dict(self) -> dict[str, Any]:
        return {
            "software": asdict(self.software),
            "gpus": [asdict(g) for g in self.gpus],
            "topology": asdict(self.topology) if self.topology else None,
            "launch": asdict(self.launch),
        }
