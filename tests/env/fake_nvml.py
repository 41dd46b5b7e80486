"""A recorded NVML for tests: the same function names and signatures as `pynvml`, serving
values recorded from real nodes, and raising the real `pynvml.NVMLError` subclasses where a real
driver does (MIG and row remapping on Volta, ECC on GeForce, NVLink on PCIe cards, ...).

`dgx1_v100()` is an 8 x V100-SXM2 node with the DGX-1 hybrid cube-mesh NVLink topology, GPU 3
carrying uncorrected ECC errors with a page retirement pending and GPU 5 thermally throttled.
`pcie_workstation()` is a 4 x GeForce box with no NVLink and no ECC. Tests edit the `FakeGpu`
records (or the fake's attributes) to make each finding fire.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Optional

import pynvml

NS = pynvml.NVML_ERROR_NOT_SUPPORTED
GiB = 2**30


def _error(code: int) -> pynvml.NVMLError:
    # NVMLError(code) returns the matching subclass (NVMLError_NotSupported, ...), as pynvml does.
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    name: str
    uuid: str
    bus_id: str
    memory_total: int
    memory_used: int
    temperature: int
    power_mw: int
    power_limit_mw: int
    clock_events: int
    # None: the GPU does not support the query (raises NVMLError_NotSupported).
    ecc_volatile: Optional[int]
    ecc_aggregate: Optional[int]
    retired_sbe: Optional[list[int]]
    retired_dbe: Optional[list[int]]
    retired_pending: Optional[int]
    remapped_rows: Optional[tuple[int, int, int, int]]
    compute_mode: int
    mig: Optional[tuple[int, int]]
    pcie: tuple[int, int, int, int]  # current gen, max gen, current width, max width
    # link number -> (active, remote PCI bus id); None: no NVLink on this GPU.
    nvlinks: Optional[dict[int, tuple[int, str]]] = None
    lost: bool = False  # fell off the bus: handle lookups fail with GpuIsLost


@dataclass
class FakeHandle:
    index: int


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    # Unordered GPU index pair -> nvmlGpuTopologyLevel_t value.
    ancestors: dict[frozenset[int], int]
    # Unordered pair -> P2P read status (nvmlGpuP2PStatus_t); missing pairs are OK.
    p2p_read: dict[frozenset[int], int] = field(default_factory=dict)
    driver: str = "535.129.03"
    nvml_version: str = "12.535.129.03"
    cuda_driver: int = 12020
    init_error: Optional[int] = None
    initialized: bool = False
    calls: list[str] = field(default_factory=list)

    # The real exception classes and constants, so `except nvml.NVMLError_NotSupported` and
    # friends in the code under test catch what this fake raises.
    def __getattr__(self, name: str) -> object:
        if name.startswith(("NVMLError", "NVML_")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # --- system -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise _error(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._check()
        self.initialized = False

    def _check(self) -> None:
        if not self.initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check()
        return self.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check()
        return self.cuda_driver

    # --- devices ------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(index)

    def _gpu(self, handle: FakeHandle) -> FakeGpu:
        self._check()
        return self.gpus[handle.index]

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._gpu(handle)
        return SimpleNamespace(busId=gpu.bus_id, busIdLegacy=gpu.bus_id[4:])

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Optional[int] = None) -> SimpleNamespace:
        gpu = self._gpu(handle)
        return SimpleNamespace(
            total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used
        )

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self._gpu(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._gpu(handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._gpu(handle).power_limit_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._gpu(handle).clock_events

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._gpu(handle).clock_events

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, errorType: int, counterType: int) -> int:
        gpu = self._gpu(handle)
        value = gpu.ecc_volatile if counterType == pynvml.NVML_VOLATILE_ECC else gpu.ecc_aggregate
        if value is None:
            raise _error(NS)
        # The fake records uncorrected counts only; corrected ones are not asked for.
        if errorType != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        return value

    def nvmlDeviceGetRetiredPages(self, device: FakeHandle, sourceFilter: int) -> list[int]:
        gpu = self._gpu(device)
        pages = (
            gpu.retired_dbe
            if sourceFilter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            else gpu.retired_sbe
        )
        if pages is None:
            raise _error(NS)
        return list(pages)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: FakeHandle) -> int:
        gpu = self._gpu(device)
        if gpu.retired_pending is None:
            raise _error(NS)
        return gpu.retired_pending

    def nvmlDeviceGetRemappedRows(self, device: FakeHandle) -> tuple[int, int, int, int]:
        gpu = self._gpu(device)
        if gpu.remapped_rows is None:
            raise _error(NS)
        return gpu.remapped_rows

    def nvmlDeviceGetComputeMode(self, handle: FakeHandle) -> int:
        return self._gpu(handle).compute_mode

    def nvmlDeviceGetMigMode(self, device: FakeHandle) -> list[int]:
        gpu = self._gpu(device)
        if gpu.mig is None:
            raise _error(NS)
        return list(gpu.mig)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:
        return self._gpu(handle).pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        return self._gpu(handle).pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        return self._gpu(handle).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:
        return self._gpu(handle).pcie[3]

    def _link(self, device: FakeHandle, link: int) -> tuple[int, str]:
        gpu = self._gpu(device)
        if gpu.nvlinks is None:
            raise _error(NS)
        if link not in gpu.nvlinks:
            # Past the GPU's last link the driver answers InvalidArgument.
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, device: FakeHandle, link: int) -> int:
        return self._link(device, link)[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: FakeHandle, link: int) -> SimpleNamespace:
        active, bus = self._link(device, link)
        if not active:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(busId=bus)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: FakeHandle, device2: FakeHandle) -> int:
        self._check()
        return self.ancestors[frozenset((device1.index, device2.index))]

    def nvmlDeviceGetP2PStatus(self, device1: FakeHandle, device2: FakeHandle, p2pIndex: int) -> int:
        self._check()
        pair = frozenset((device1.index, device2.index))
        if p2pIndex == 2:  # NVML_P2P_CAPS_INDEX_NVLINK
            links = self.gpus[device1.index].nvlinks or {}
            peer = self.gpus[device2.index].bus_id
            connected = any(active and bus == peer for active, bus in links.values())
            return pynvml.NVML_P2P_STATUS_OK if connected else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
        return self.p2p_read.get(pair, pynvml.NVML_P2P_STATUS_OK)


# --- recorded nodes -----------------------------------------------------------------------------

# DGX-1 (V100) bus ids and its hybrid cube-mesh: (gpu, gpu) -> number of NVLinks between them.
DGX1_BUS = [
    "00000000:06:00.0", "00000000:07:00.0", "00000000:0A:00.0", "00000000:0B:00.0",
    "00000000:85:00.0", "00000000:86:00.0", "00000000:89:00.0", "00000000:8A:00.0",
]
DGX1_NVLINK = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}
# What `nvidia-smi topo -m` prints on a DGX-1V.
DGX1_TOPO_MATRIX = [
    ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"],
    ["NV1", "X", "NV2", "NV1", "SYS", "NV2", "SYS", "SYS"],
    ["NV1", "NV2", "X", "NV2", "SYS", "SYS", "NV1", "SYS"],
    ["NV2", "NV1", "NV2", "X", "SYS", "SYS", "SYS", "NV1"],
    ["NV2", "SYS", "SYS", "SYS", "X", "NV1", "NV1", "NV2"],
    ["SYS", "NV2", "SYS", "SYS", "NV1", "X", "NV2", "NV1"],
    ["SYS", "SYS", "NV1", "SYS", "NV1", "NV2", "X", "NV2"],
    ["SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X"],
]


def _dgx1_links(index: int) -> dict[int, tuple[int, str]]:
    links: dict[int, tuple[int, str]] = {}
    for (a, b), count in sorted(DGX1_NVLINK.items()):
        if index in (a, b):
            peer = b if index == a else a
            for _ in range(count):
                links[len(links)] = (1, DGX1_BUS[peer])
    return links


def dgx1_v100() -> FakeNvml:
    gpus = []
    for index in range(8):
        gpus.append(
            FakeGpu(
                name="Tesla V100-SXM2-32GB",
                uuid=f"GPU-{index}c7a1f3e-4b2d-9e8f-1a6b-0c3d5e7f9{index:03d}",
                bus_id=DGX1_BUS[index],
                memory_total=34359738368,
                memory_used=462159872,
                temperature=38 + index,
                power_mw=43_000 + 1_000 * index,
                power_limit_mw=300_000,
                clock_events=0x1,  # GpuIdle: nothing running
                ecc_volatile=0,
                ecc_aggregate=0,
                retired_sbe=[],
                retired_dbe=[],
                retired_pending=0,
                remapped_rows=None,  # Volta retires pages; row remapping is Ampere+
                compute_mode=pynvml.NVML_COMPUTEMODE_DEFAULT,
                mig=None,  # no MIG before Ampere
                pcie=(1, 3, 16, 16),  # idle V100s drop to Gen1; the link trained at Gen3 x16
                nvlinks=_dgx1_links(index),
            )
        )
    # GPU 3: a double-bit error since boot; its page retirement waits for a reset.
    gpus[3].ecc_volatile = 2
    gpus[3].ecc_aggregate = 3
    gpus[3].retired_dbe = [0x1F3A2000]
    gpus[3].retired_pending = 1
    # GPU 5: under load and thermally throttled.
    gpus[5].clock_events = 0x20 | 0x40  # SwThermalSlowdown | HwThermalSlowdown
    gpus[5].temperature = 89
    gpus[5].power_mw = 212_000
    gpus[5].pcie = (3, 3, 16, 16)
    ancestors: dict[frozenset[int], int] = {}
    p2p: dict[frozenset[int], int] = {}
    for a in range(8):
        for b in range(a + 1, 8):
            same_socket = (a < 4) == (b < 4)
            if not same_socket:
                level = pynvml.NVML_TOPOLOGY_SYSTEM
            elif a // 2 == b // 2:
                level = pynvml.NVML_TOPOLOGY_SINGLE  # same PLX switch
            else:
                level = pynvml.NVML_TOPOLOGY_NODE
            ancestors[frozenset((a, b))] = level
            if not same_socket and (a, b) not in DGX1_NVLINK:
                # No PCIe P2P across the QPI link between the two CPUs.
                p2p[frozenset((a, b))] = pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
    return FakeNvml(gpus=gpus, ancestors=ancestors, p2p_read=p2p)


def a100_with_mig() -> FakeNvml:
    """One A100 (Ampere: row remapping and MIG are supported) for ENV001/ENV011 variants."""
    gpu = dataclasses.replace(
        dgx1_v100().gpus[0],
        name="NVIDIA A100-SXM4-80GB",
        uuid="GPU-a100a100-1111-2222-3333-444455556666",
        memory_total=85899345920,
        retired_sbe=None,
        retired_dbe=None,
        retired_pending=None,  # page retirement replaced by row remapping
        remapped_rows=(0, 0, 0, 0),
        mig=(0, 0),
        pcie=(4, 4, 16, 16),
        nvlinks={link: (1, "00000000:C0:00.0") for link in range(12)},  # all to NVSwitches
    )
    return FakeNvml(gpus=[gpu], ancestors={})


def pcie_workstation() -> FakeNvml:
    """4 x GeForce RTX 3090 on PCIe: no ECC, no NVLink, P2P not supported by the GPU."""
    bus = ["00000000:01:00.0", "00000000:21:00.0", "00000000:41:00.0", "00000000:61:00.0"]
    gpus = [
        FakeGpu(
            name="NVIDIA GeForce RTX 3090",
            uuid=f"GPU-3090{index:04d}-aaaa-bbbb-cccc-ddddeeeeffff",
            bus_id=bus[index],
            memory_total=25769803776,
            memory_used=1073741824,
            temperature=45,
            power_mw=31_000,
            power_limit_mw=350_000,
            clock_events=0x1,
            ecc_volatile=None,
            ecc_aggregate=None,
            retired_sbe=None,
            retired_dbe=None,
            retired_pending=None,
            remapped_rows=None,
            compute_mode=pynvml.NVML_COMPUTEMODE_DEFAULT,
            mig=None,
            pcie=(1, 4, 16, 16),
            nvlinks=None,
        )
        for index in range(4)
    ]
    ancestors = {
        frozenset((0, 1)): pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
        frozenset((2, 3)): pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
        frozenset((0, 2)): pynvml.NVML_TOPOLOGY_SYSTEM,
        frozenset((0, 3)): pynvml.NVML_TOPOLOGY_SYSTEM,
        frozenset((1, 2)): pynvml.NVML_TOPOLOGY_SYSTEM,
        frozenset((1, 3)): pynvml.NVML_TOPOLOGY_SYSTEM,
    }
    p2p = {pair: pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED for pair in ancestors}
    return FakeNvml(gpus=gpus, ancestors=ancestors, p2p_read=p2p)
