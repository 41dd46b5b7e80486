"""The GPU-to-GPU matrix of `nvidia-smi topo -m` and the P2P matrix of `nvidia-smi topo -p2p r`."""

from __future__ import annotations

from typing import Any, Optional

from ddpdoctor.env import nvml as nv
from ddpdoctor.env.gpus import bus_key, nvlink_peers
from ddpdoctor.env.report import GpuInfo, TopologyInfo

# nvmlGpuTopologyLevel_t -> nvidia-smi's legend.
ANCESTOR_LABELS = {
    0: "X",  # same board (multi-GPU cards such as the K80)
    10: "PIX",  # at most a single PCIe bridge
    20: "PXB",  # multiple PCIe bridges, no host bridge
    30: "PHB",  # through a PCIe host bridge (the CPU)
    40: "NODE",  # across host bridges within one NUMA node
    50: "SYS",  # across the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric)
}

LEGEND = {
    "X": "self",
    "NV#": "bonded set of # NVLinks",
    "PIX": "at most a single PCIe bridge",
    "PXB": "multiple PCIe bridges, no host bridge",
    "PHB": "a PCIe host bridge (typically the CPU)",
    "NODE": "PCIe and the interconnect between host bridges within a NUMA node",
    "SYS": "PCIe and the SMP interconnect between NUMA nodes (slowest)",
}

# nvmlGpuP2PStatus_t -> nvidia-smi's legend.
P2P_LABELS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
P2P_LEGEND = {
    "OK": "supported",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "DR": "disabled by regkey",
    "NS": "not supported",
    "U": "unknown",
}


def collect_topology(
    session: nv.NvmlSession, gpus: list[GpuInfo], handles: list[Any]
) -> Optional[TopologyInfo]:
    if len(gpus) < 2:
        return None
    gpu_buses = {bus_key(g.pci_bus_id) for g in gpus if g.pci_bus_id}
    peers = [nvlink_peers(session, h) if h is not None else {} for h in handles]
    count = len(gpus)
    matrix = [["X" if i == j else "n/a" for j in range(count)] for i in range(count)]
    p2p = [["X" if i == j else "n/a" for j in range(count)] for i in range(count)]
    for i in range(count):
        for j in range(count):
            if i == j or handles[i] is None or handles[j] is None:
                continue
            matrix[i][j] = _link_label(session, handles, gpus, peers, gpu_buses, i, j)
            status, _ = session.call(
                "nvmlDeviceGetP2PStatus", handles[i], handles[j], nv.P2P_CAPS_INDEX_READ
            )
            if status is not None:
                p2p[i][j] = P2P_LABELS.get(int(status), "U")
    return TopologyInfo(gpus=[g.index for g in gpus], matrix=matrix, p2p_read=p2p)


def _link_label(
    session: nv.NvmlSession,
    handles: list[Any],
    gpus: list[GpuInfo],
    peers: list[dict[str, int]],
    gpu_buses: set[Optional[str]],
    i: int,
    j: int,
) -> str:
    # NVLink wins over PCIe, as in nvidia-smi: a direct bond counts the links to that GPU;
    # through an NVSwitch (DGX A100/H100) the links land on the switch, so count those.
    direct = peers[i].get(bus_key(gpus[j].pci_bus_id) or "", 0)
    if direct:
        return f"NV{direct}"
    switch_links = sum(n for bus, n in peers[i].items() if bus not in gpu_buses)
    if switch_links:
        status, _ = session.call(
            "nvmlDeviceGetP2PStatus", handles[i], handles[j], nv.P2P_CAPS_INDEX_NVLINK
        )
        if status == 0:
            return f"NV{switch_links}"
    level, _ = session.call("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
    if level is None:
        return "n/a"
    return ANCESTOR_LABELS.get(int(level), "n/a")
