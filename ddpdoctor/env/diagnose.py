"""Turn an `EnvReport` into `Finding`s. Pure: reads the report, touches nothing on the host,
so every rule is tested over hand-edited reports as well as over collected ones."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ddpdoctor.catalog import rule_info
from ddpdoctor.env import nvml as nv
from ddpdoctor.env.report import EnvReport, GpuInfo
from ddpdoctor.findings import Finding

ENV_PATH = "<env>"

# Clock event bits that mean "slowed down for power or heat", as opposed to idle/app clocks.
THROTTLE_BITS = {
    0x4: "software power cap",
    0x8: "hardware slowdown (power brake or over-temperature)",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}

DISABLE_COSTS = {
    "NCCL_P2P_DISABLE": (
        "GPU-to-GPU traffic inside the node is staged through host memory instead of "
        "NVLink/PCIe peer-to-peer; intra-node all-reduce bandwidth typically drops several-fold"
    ),
    "NCCL_IB_DISABLE": (
        "inter-node traffic falls back to TCP sockets instead of InfiniBand/RoCE RDMA "
        "(and GPUDirect RDMA is off); expect several times lower bandwidth and higher latency"
    ),
    "NCCL_SHM_DISABLE": (
        "ranks on one node that cannot use P2P talk through the network stack instead of "
        "shared memory, adding copies and latency to every intra-node collective"
    ),
}

EXCLUSIVE_MODES = ("Exclusive_Process", "Exclusive_Thread")
NON_NCCL_BACKENDS = ("gloo", "mpi")


def make_finding(
    code: str, message: str, path: str = ENV_PATH, details: Optional[dict[str, Any]] = None
) -> Finding:
    """A Finding whose name and severity come from the catalog page, never from code."""
    info = rule_info(code)
    if info is None:
        raise KeyError(f"no catalog page rules/{code}.md")
    return Finding(
        code=code,
        name=info.name,
        severity=info.severity,
        message=message,
        path=path,
        source="env",
        details=details or {},
    )


def diagnose(
    report: EnvReport,
    nproc: Optional[int] = None,
    backend: Optional[str] = None,
    failing: bool = False,
) -> list[Finding]:
    if backend == "auto":
        backend = None
    ranks = nproc if nproc is not None else _int(report.launch.variables.get("LOCAL_WORLD_SIZE"))
    findings: list[Finding] = []
    for gpu in report.gpus:
        for check in GPU_CHECKS:
            findings.extend(check(gpu, backend))
    findings.extend(_software_and_launch(report, nproc, ranks, backend, failing))
    # Host-wide findings first, then per GPU in index order ("<GPU 10>" after "<GPU 9>").
    return sorted(findings, key=lambda f: (f.path != ENV_PATH, len(f.path), f.path, f.code))


# --- per-GPU rules -----------------------------------------------------------------------------


def _ecc(gpu: GpuInfo, backend: Optional[str]) -> list[Finding]:
    # Volatile counts (since the driver loaded) and pending retirements are current problems;
    # the aggregate count is lifetime history and alone does not make a GPU unhealthy.
    problems = []
    if gpu.ecc_uncorrected_volatile:
        problems.append(f"{gpu.ecc_uncorrected_volatile} uncorrected ECC error(s) since boot")
    if gpu.retired_pages_pending:
        problems.append("page retirement pending (takes effect after a GPU reset)")
    if gpu.remapped_rows_pending:
        problems.append("row remapping pending (takes effect after a GPU reset)")
    if gpu.remapped_rows_failure:
        problems.append("row remapping failed (the GPU is out of spare rows)")
    if not problems:
        return []
    return [
        make_finding(
            "ENV001",
            f"{gpu.label} ({gpu.name or 'unknown'}) has {'; '.join(problems)}: "
            "drain the node, reset the GPU (nvidia-smi -r) and RMA it if errors return",
            path=gpu.path,
            details={
                "uuid": gpu.uuid,
                "ecc_uncorrected_volatile": gpu.ecc_uncorrected_volatile,
                "ecc_uncorrected_aggregate": gpu.ecc_uncorrected_aggregate,
                "retired_pages": gpu.retired_pages,
                "retired_pages_pending": gpu.retired_pages_pending,
                "remapped_rows_pending": gpu.remapped_rows_pending,
                "remapped_rows_failure": gpu.remapped_rows_failure,
            },
        )
    ]


def _throttled(gpu: GpuInfo, backend: Optional[str]) -> list[Finding]:
    mask = gpu.clock_event_mask or 0
    reasons = [text for bit, text in THROTTLE_BITS.items() if mask & bit]
    if not reasons:
        return []
    readings = []
    if gpu.temperature_c is not None:
        readings.append(f"{gpu.temperature_c} C")
    if gpu.power_draw_w is not None and gpu.power_limit_w is not None:
        readings.append(f"{gpu.power_draw_w:.0f} W of {gpu.power_limit_w:.0f} W limit")
    reading = f" ({', '.join(readings)})" if readings else ""
    return [
        make_finding(
            "ENV002",
            f"{gpu.label} is clock-throttled: {', '.join(reasons)}{reading}; every collective "
            "waits for the slowest rank, so this GPU sets the pace of the whole job",
            path=gpu.path,
            details={"clock_event_reasons": gpu.clock_event_reasons, "mask": mask},
        )
    ]


def _pcie(gpu: GpuInfo, backend: Optional[str]) -> list[Finding]:
    problems = []
    if gpu.pcie_width is not None and gpu.pcie_width_max and gpu.pcie_width < gpu.pcie_width_max:
        problems.append(f"width x{gpu.pcie_width} of x{gpu.pcie_width_max}")
    # GPUs drop to a lower PCIe generation when idle to save power; only a busy GPU's
    # generation says anything about the link.
    idle = gpu.clock_event_mask is None or bool(gpu.clock_event_mask & nv.GPU_IDLE)
    if (
        not idle
        and gpu.pcie_gen is not None
        and gpu.pcie_gen_max
        and gpu.pcie_gen < gpu.pcie_gen_max
    ):
        problems.append(f"Gen{gpu.pcie_gen} of Gen{gpu.pcie_gen_max}")
    if not problems:
        return []
    return [
        make_finding(
            "ENV003",
            f"{gpu.label} PCIe link runs below its maximum ({', '.join(problems)}): host<->GPU "
            "copies and PCIe P2P/NCCL traffic through it are slower; reseat the card or check "
            "the slot and BIOS settings",
            path=gpu.path,
            details={
                "pcie_gen": gpu.pcie_gen,
                "pcie_gen_max": gpu.pcie_gen_max,
                "pcie_width": gpu.pcie_width,
                "pcie_width_max": gpu.pcie_width_max,
            },
        )
    ]


def _mig(gpu: GpuInfo, backend: Optional[str]) -> list[Finding]:
    if not gpu.mig_enabled or backend in NON_NCCL_BACKENDS:
        return []
    return [
        make_finding(
            "ENV011",
            f"{gpu.label} has MIG mode enabled: NCCL cannot communicate between MIG instances "
            "in different processes, so multi-rank NCCL jobs on these instances fail; disable "
            "MIG (nvidia-smi -i "
            f"{gpu.index} -mig 0) or train with one rank per whole GPU",
            path=gpu.path,
            details={"mig_pending": gpu.mig_pending},
        )
    ]


GPU_CHECKS: tuple[Callable[[GpuInfo, Optional[str]], list[Finding]], ...] = (
    _ecc,
    _throttled,
    _pcie,
    _mig,
)


# --- software and launch rules -----------------------------------------------------------------


def _software_and_launch(
    report: EnvReport,
    nproc: Optional[int],
    ranks: Optional[int],
    backend: Optional[str],
    failing: bool,
) -> list[Finding]:
    launch = report.launch
    env = launch.variables
    findings: list[Finding] = []

    for variable, cost in DISABLE_COSTS.items():
        value = env.get(variable)
        if value is not None and value.strip() not in ("", "0"):
            findings.append(
                make_finding(
                    "ENV004",
                    f"{variable}={value} is set: {cost}. Unset it unless it works around a "
                    "known hardware or driver bug on this node",
                    details={"variable": variable, "value": value},
                )
            )

    findings.extend(_visible_devices(report))

    visible = launch.visible_gpu_count
    has_gpus = bool(report.gpus) or bool(report.software.torch_device_count)
    if nproc is not None and backend not in NON_NCCL_BACKENDS and (backend == "nccl" or has_gpus):
        count = visible or 0
        if count < nproc:
            cvd = launch.cuda_visible_devices.spec
            where = f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else ""
            if not report.gpus and not report.software.torch_device_count:
                where += f"; {report.software.nvml.message}"
            findings.append(
                make_finding(
                    "ENV006",
                    f"--nproc {nproc} needs {nproc} GPUs, one per rank, but {count} "
                    f"{'is' if count == 1 else 'are'} visible{where}",
                    details={"nproc": nproc, "visible_gpus": count},
                )
            )

    if failing and "NCCL_DEBUG" not in env and backend not in NON_NCCL_BACKENDS:
        findings.append(
            make_finding(
                "ENV007",
                "the job is failing and NCCL_DEBUG is unset: rerun with NCCL_DEBUG=INFO "
                "(and NCCL_DEBUG_SUBSYS=INIT,NET) so NCCL says which transport and interface "
                "it picked and why it gave up",
            )
        )

    master = launch.master
    if master.resolve_error:
        findings.append(
            make_finding(
                "ENV008",
                f"MASTER_ADDR={master.addr} does not resolve on this host: every rank's "
                "rendezvous will fail; use an IP address or a name in DNS/hosts on all nodes",
                details={"addr": master.addr},
            )
        )
    elif master.port_free is False:
        findings.append(
            make_finding(
                "ENV008",
                f"MASTER_PORT={master.port} cannot be used for the rendezvous: "
                f"{master.port_note}; pick a free port (or stop the stale job holding it)",
                details={"addr": master.addr, "port": master.port},
            )
        )

    findings.extend(_backend_available(report, backend))

    if ranks and ranks > 1:
        findings.extend(_exclusive_mode(report, ranks))
        if "OMP_NUM_THREADS" not in env:
            findings.append(
                make_finding(
                    "ENV012",
                    f"OMP_NUM_THREADS is unset with {ranks} ranks on this node: torchrun sets "
                    f"it to 1, but mpirun/horovodrun/srun do not, and then every rank starts "
                    f"one OpenMP thread per core ({launch.cpu_count or '?'}), oversubscribing "
                    f"the CPU; set it to about cores / ranks",
                    details={"ranks": ranks, "cpu_count": launch.cpu_count},
                )
            )

    findings.extend(_socket_ifname(report))
    findings.extend(_launch_variables(env))
    return findings


# What a launcher (torchrun, torch.distributed.launch, mpirun wrappers) sets for each rank.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK")
SIZE_VARIABLES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _launch_variables(env: dict[str, str]) -> list[Finding]:
    """The rank/size variables torch.distributed's env:// rendezvous and scripts read: each an
    integer (ranks from 0, sizes from 1), and together consistent."""
    findings: list[Finding] = []
    values: dict[str, int] = {}
    for variable in RANK_VARIABLES + SIZE_VARIABLES:
        raw = env.get(variable)
        if raw is None:
            continue
        least = 1 if variable in SIZE_VARIABLES else 0
        number = _int(raw.strip())
        if number is None or number < least:
            kind = "a positive integer" if least else "an integer from 0"
            findings.append(
                make_finding(
                    "ENV015",
                    f"{variable}={raw!r} is not {kind}: int(os.environ[{variable!r}]) raises or "
                    "init_process_group(init_method='env://') fails on every rank",
                    details={"variable": variable, "value": raw},
                )
            )
        else:
            values[variable] = number
    for rank, size in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if rank in values and size in values and values[rank] >= values[size]:
            findings.append(
                make_finding(
                    "ENV016",
                    f"{rank}={values[rank]} is not below {size}={values[size]}: ranks count from 0 "
                    "to size - 1, so the rendezvous waits for a rank that never comes",
                    details={rank: values[rank], size: values[size]},
                )
            )
    if "LOCAL_WORLD_SIZE" in values and "WORLD_SIZE" in values and values["LOCAL_WORLD_SIZE"] > values["WORLD_SIZE"]:
        findings.append(
            make_finding(
                "ENV016",
                f"LOCAL_WORLD_SIZE={values['LOCAL_WORLD_SIZE']} is larger than "
                f"WORLD_SIZE={values['WORLD_SIZE']}: one node cannot hold more ranks than the job",
                details={"LOCAL_WORLD_SIZE": values["LOCAL_WORLD_SIZE"], "WORLD_SIZE": values["WORLD_SIZE"]},
            )
        )
    if "LOCAL_RANK" in values and "RANK" in values and values["LOCAL_RANK"] > values["RANK"]:
        findings.append(
            make_finding(
                "ENV016",
                f"LOCAL_RANK={values['LOCAL_RANK']} is larger than RANK={values['RANK']}: a rank's "
                "place on its node cannot exceed its place in the job",
                details={"LOCAL_RANK": values["LOCAL_RANK"], "RANK": values["RANK"]},
            )
        )
    if "RANK" in env and "LOCAL_RANK" not in env:
        findings.append(
            make_finding(
                "ENV017",
                f"RANK={env['RANK']} is set but LOCAL_RANK is not: scripts that pick their GPU "
                "with int(os.environ['LOCAL_RANK']) fail, and those that default it to 0 put every "
                "rank of this node on GPU 0; launch with torchrun, or set LOCAL_RANK per rank",
                details={"RANK": env["RANK"]},
            )
        )
    return findings


def _visible_devices(report: EnvReport) -> list[Finding]:
    cvd = report.launch.cuda_visible_devices
    if cvd.spec is None:
        return []
    if cvd.duplicates or cvd.invalid:
        parts = []
        if cvd.duplicates:
            parts.append(
                f"names {', '.join(cvd.duplicates)} twice, which leaves CUDA no device at all"
            )
        if cvd.invalid:
            parts.append(
                f"has an entry CUDA cannot map to a GPU ({cvd.invalid[0]!r}) and silently drops "
                + (f"it and everything after it ({', '.join(cvd.ignored)})" if cvd.ignored else "it")
            )
        return [
            make_finding(
                "ENV005",
                f"CUDA_VISIBLE_DEVICES={cvd.spec} {' and '.join(parts)}",
                details={"spec": cvd.spec, "duplicates": cvd.duplicates, "invalid": cvd.invalid},
            )
        ]
    total = len(report.gpus)
    if cvd.count is not None and total and cvd.count < total:
        return [
            make_finding(
                "ENV013",
                f"CUDA_VISIBLE_DEVICES={cvd.spec} exposes {cvd.count} of the {total} GPUs on "
                "this host; fine when a scheduler assigned them, a surprise when left over "
                "from an old shell",
                details={"spec": cvd.spec, "visible": cvd.visible, "total": total},
            )
        ]
    return []


def _backend_available(report: EnvReport, backend: Optional[str]) -> list[Finding]:
    if backend not in ("nccl", "gloo", "mpi"):
        return []
    software = report.software
    if software.torch is None:
        reason = software.torch_error or "torch is not installed"
    elif not software.distributed_available:
        reason = f"torch {software.torch} was built without torch.distributed"
    elif not software.backends.get(backend):
        hint = {
            "nccl": "install a CUDA build of torch (the +cpu wheels have no NCCL)",
            "gloo": "gloo ships with every official wheel; this is a custom build",
            "mpi": "only torch built from source against an MPI library has it",
        }[backend]
        reason = f"torch {software.torch} was built without the {backend} backend: {hint}"
    else:
        return []
    return [
        make_finding(
            "ENV009",
            f"--backend {backend} was asked for, but {reason}",
            details={"backend": backend, "torch": software.torch},
        )
    ]


def _exclusive_mode(report: EnvReport, ranks: int) -> list[Finding]:
    visible = report.launch.cuda_visible_devices.visible
    if not visible:
        return []
    by_index = {g.index: g for g in report.gpus}
    findings = []
    for position, index in enumerate(visible):
        gpu = by_index.get(index)
        # Ranks are spread over the visible GPUs round-robin (LOCAL_RANK % n).
        per_gpu = ranks // len(visible) + (1 if position < ranks % len(visible) else 0)
        if gpu is not None and gpu.compute_mode in EXCLUSIVE_MODES and per_gpu > 1:
            findings.append(
                make_finding(
                    "ENV010",
                    f"{gpu.label} is in {gpu.compute_mode} compute mode but would get "
                    f"{per_gpu} ranks: only one process may hold a CUDA context on it, so the "
                    f"others fail with 'CUDA-capable device(s) is/are busy or unavailable'",
                    path=gpu.path,
                    details={"compute_mode": gpu.compute_mode, "ranks_on_gpu": per_gpu},
                )
            )
    return findings


def _socket_ifname(report: EnvReport) -> list[Finding]:
    findings = []
    interfaces = ", ".join(i.name for i in report.launch.interfaces) or "none"
    nccl = report.launch.nccl_socket
    if nccl.spec and not nccl.chosen:
        findings.append(
            make_finding(
                "ENV014",
                f"NCCL_SOCKET_IFNAME={nccl.spec} matches no interface with an address on this "
                f"host (interfaces: {interfaces}); NCCL will fail with 'no socket interface "
                "found'",
                details={"variable": "NCCL_SOCKET_IFNAME", "spec": nccl.spec},
            )
        )
    gloo = report.launch.gloo_socket
    if gloo.spec and gloo.missing:
        findings.append(
            make_finding(
                "ENV014",
                f"GLOO_SOCKET_IFNAME={gloo.spec} names {', '.join(gloo.missing)}, which this host "
                "does not have "
                f"(interfaces: {interfaces}); gloo takes exact names and will fail to start",
                details={"variable": "GLOO_SOCKET_IFNAME", "spec": gloo.spec},
            )
        )
    return findings


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
