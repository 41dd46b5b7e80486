"""Every ENV finding: a case that makes it fire and a trap where it must stay quiet."""

from __future__ import annotations

import socket
import pynvml
import pytest

import fake_nvml
from ddpdoctor.catalog import rule_info
from ddpdoctor.env import diagnose
from ddpdoctor.env.report import EnvReport
from ddpdoctor.findings import Finding, Severity


def codes(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in findings]


def only(findings: list[Finding], code: str) -> list[Finding]:
    return [f for f in findings if f.code == code]


def healthy_dgx() -> fake_nvml.FakeNvml:
    fake = fake_nvml.dgx1_v100()
    fake.gpus[3].ecc_volatile = 0
    fake.gpus[3].retired_pending = 0
    fake.gpus[5].clock_events = 0x1
    fake.gpus[5].pcie = (1, 3, 16, 16)
    return fake


# --- ENV001 ------------------------------------------------------------------------------------


def test_env001_fires_on_the_gpu_with_ecc_errors(collect) -> None:
    findings = only(diagnose(collect()), "ENV001")
    assert codes(findings) == [("ENV001", "<GPU 3>")]
    assert findings[0].severity is Severity.ERROR
    assert "2 uncorrected ECC error(s)" in findings[0].message
    assert "page retirement pending" in findings[0].message


def test_env001_fires_on_failed_row_remap(collect) -> None:
    fake = fake_nvml.a100_with_mig()
    fake.gpus[0].remapped_rows = (0, 1, 0, 1)
    assert codes(only(diagnose(collect(nvml=fake)), "ENV001")) == [("ENV001", "<GPU 0>")]


def test_env001_trap_lifetime_count_alone_is_history(collect) -> None:
    fake = healthy_dgx()
    fake.gpus[3].ecc_aggregate = 7  # old errors, pages already retired, nothing pending
    report = collect(nvml=fake)
    assert report.gpus[3].ecc_uncorrected_aggregate == 7
    assert only(diagnose(report), "ENV001") == []


def test_env001_trap_ecc_not_supported(collect) -> None:
    assert only(diagnose(collect(nvml=fake_nvml.pcie_workstation())), "ENV001") == []


# --- ENV002 ------------------------------------------------------------------------------------


def test_env002_fires_on_the_throttled_gpu(collect) -> None:
    findings = only(diagnose(collect()), "ENV002")
    assert codes(findings) == [("ENV002", "<GPU 5>")]
    assert "thermal" in findings[0].message and "89 C" in findings[0].message


def test_env002_fires_on_power_cap(collect) -> None:
    fake = healthy_dgx()
    fake.gpus[2].clock_events = 0x4  # SwPowerCap
    assert codes(only(diagnose(collect(nvml=fake)), "ENV002")) == [("ENV002", "<GPU 2>")]


def test_env002_trap_idle_and_app_clocks_are_not_throttling(collect) -> None:
    fake = healthy_dgx()
    for gpu in fake.gpus:
        gpu.clock_events = 0x1 | 0x2 | 0x10  # GpuIdle, ApplicationsClocksSetting, SyncBoost
    assert only(diagnose(collect(nvml=fake)), "ENV002") == []


# --- ENV003 ------------------------------------------------------------------------------------


def test_env003_fires_on_narrow_link(collect) -> None:
    fake = healthy_dgx()
    fake.gpus[2].pcie = (1, 3, 8, 16)
    findings = only(diagnose(collect(nvml=fake)), "ENV003")
    assert codes(findings) == [("ENV003", "<GPU 2>")]
    assert "width x8 of x16" in findings[0].message


def test_env003_fires_on_low_generation_under_load(collect) -> None:
    fake = healthy_dgx()
    fake.gpus[4].clock_events = 0x0  # busy
    fake.gpus[4].pcie = (2, 3, 16, 16)
    findings = only(diagnose(collect(nvml=fake)), "ENV003")
    assert codes(findings) == [("ENV003", "<GPU 4>")]
    assert "Gen2 of Gen3" in findings[0].message


def test_env003_trap_idle_gpus_drop_generation_on_purpose(collect) -> None:
    report = collect(nvml=healthy_dgx())
    assert {g.pcie_gen for g in report.gpus} == {1}
    assert only(diagnose(report), "ENV003") == []


# --- ENV004 ------------------------------------------------------------------------------------


def test_env004_fires_per_disabled_transport_and_says_the_cost(collect) -> None:
    environ = {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
    findings = only(diagnose(collect(environ=environ)), "ENV004")
    assert sorted(f.details["variable"] for f in findings) == sorted(environ)
    assert all(f.severity is Severity.WARNING for f in findings)
    by_variable = {f.details["variable"]: f.message for f in findings}
    assert "NVLink" in by_variable["NCCL_P2P_DISABLE"]
    assert "TCP sockets" in by_variable["NCCL_IB_DISABLE"]
    assert "shared memory" in by_variable["NCCL_SHM_DISABLE"]


def test_env004_trap_explicit_zero(collect) -> None:
    environ = {"NCCL_P2P_DISABLE": "0", "NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "INFO"}
    assert only(diagnose(collect(environ=environ)), "ENV004") == []


# --- ENV005 / ENV013 ---------------------------------------------------------------------------


def test_env005_fires_on_a_gpu_named_twice(collect) -> None:
    report = collect(environ={"CUDA_VISIBLE_DEVICES": "0,1,1,2"})
    assert report.launch.visible_gpu_count == 0
    findings = only(diagnose(report), "ENV005")
    assert len(findings) == 1 and findings[0].severity is Severity.ERROR
    assert "names 1 twice" in findings[0].message


def test_env005_fires_on_an_index_past_the_last_gpu(collect) -> None:
    report = collect(environ={"CUDA_VISIBLE_DEVICES": "0,1,8,2,3"})
    # CUDA stops at 8: only GPUs 0 and 1 are visible.
    assert report.launch.cuda_visible_devices.visible == [0, 1]
    findings = only(diagnose(report), "ENV005")
    assert len(findings) == 1 and "'8'" in findings[0].message and "2, 3" in findings[0].message


def test_env005_fires_on_an_unknown_uuid(collect) -> None:
    report = collect(environ={"CUDA_VISIBLE_DEVICES": "GPU-deadbeef"})
    assert len(only(diagnose(report), "ENV005")) == 1


def test_env005_trap_uuid_prefix_and_hide_all(collect) -> None:
    report = collect(environ={"CUDA_VISIBLE_DEVICES": "GPU-3c7a,GPU-1c7a"})
    assert report.launch.cuda_visible_devices.visible == [3, 1]
    findings = diagnose(report)
    assert only(findings, "ENV005") == []
    assert len(only(findings, "ENV013")) == 1
    hide_all = diagnose(collect(environ={"CUDA_VISIBLE_DEVICES": "-1"}))
    assert only(hide_all, "ENV005") == [] and len(only(hide_all, "ENV013")) == 1


def test_env013_fires_as_info_when_gpus_are_hidden(collect) -> None:
    findings = only(diagnose(collect(environ={"CUDA_VISIBLE_DEVICES": "0,1"})), "ENV013")
    assert len(findings) == 1 and findings[0].severity is Severity.INFO
    assert "2 of the 8 GPUs" in findings[0].message


def test_env013_trap_all_gpus_listed_or_unset(collect) -> None:
    assert only(diagnose(collect(environ={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})), "ENV013") == []
    assert only(diagnose(collect()), "ENV013") == []


# --- ENV006 ------------------------------------------------------------------------------------


def test_env006_fires_when_nproc_exceeds_visible_gpus(collect) -> None:
    report = collect(environ={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "OMP_NUM_THREADS": "4"})
    findings = only(diagnose(report, nproc=8), "ENV006")
    assert len(findings) == 1 and findings[0].severity is Severity.ERROR
    assert "needs 8 GPUs" in findings[0].message and "4 are visible" in findings[0].message


def test_env006_trap_enough_gpus_or_cpu_backend(collect) -> None:
    report = collect(environ={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert only(diagnose(report, nproc=4), "ENV006") == []
    assert only(diagnose(report, nproc=8, backend="gloo"), "ENV006") == []
    assert only(diagnose(report), "ENV006") == []  # no --nproc, nothing to compare


def test_env006_without_nvml_fires_for_nccl_only(collect, dgx) -> None:
    dgx.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    report = collect(nvml=dgx)
    report.software.torch_device_count = 0
    fired = only(diagnose(report, nproc=2, backend="nccl"), "ENV006")
    assert len(fired) == 1 and "no NVIDIA driver" in fired[0].message
    # A CPU-only host with the default backend is a CPU (gloo) job, not a missing GPU.
    assert only(diagnose(report, nproc=2), "ENV006") == []


# --- ENV007 ------------------------------------------------------------------------------------


def test_env007_fires_when_failing_without_nccl_debug(collect) -> None:
    findings = only(diagnose(collect(), failing=True), "ENV007")
    assert len(findings) == 1 and findings[0].severity is Severity.INFO
    assert "NCCL_DEBUG=INFO" in findings[0].message


def test_env007_traps(collect) -> None:
    assert only(diagnose(collect()), "ENV007") == []
    assert only(diagnose(collect(environ={"NCCL_DEBUG": "WARN"}), failing=True), "ENV007") == []
    assert only(diagnose(collect(), failing=True, backend="gloo"), "ENV007") == []


# --- ENV008 ------------------------------------------------------------------------------------


def test_env008_fires_on_unresolvable_master_addr(collect) -> None:
    # .invalid never resolves (RFC 6761).
    report = collect(environ={"MASTER_ADDR": "node-01.ddpdoctor.invalid", "MASTER_PORT": "29500"})
    findings = only(diagnose(report), "ENV008")
    assert len(findings) == 1 and findings[0].severity is Severity.ERROR
    assert "does not resolve" in findings[0].message


def test_env008_fires_on_a_busy_port_on_the_master(collect) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        report = collect(environ={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert report.launch.master.is_local is True
    findings = only(diagnose(report), "ENV008")
    assert len(findings) == 1 and f"127.0.0.1:{port}" in findings[0].message


def test_env008_fires_on_a_port_that_is_not_a_number(collect) -> None:
    report = collect(environ={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500x"})
    assert len(only(diagnose(report), "ENV008")) == 1


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_env008_trap_free_port(collect) -> None:
    report = collect(environ={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_loopback_port())})
    assert report.launch.master.port_free is True
    assert only(diagnose(report), "ENV008") == []


def test_env008_trap_busy_port_inside_a_launched_job(collect) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        # Rank 0's TCPStore is the listener: expected, not a fault.
        environ = {"MASTER_ADDR": "localhost", "MASTER_PORT": str(port), "RANK": "1"}
        report = collect(environ=environ)
    assert report.launch.master.port_free is None
    assert only(diagnose(report), "ENV008") == []


# --- ENV009 ------------------------------------------------------------------------------------


def _with_backends(report: EnvReport, **backends: bool) -> EnvReport:
    report.software.torch = report.software.torch or "2.4.0"
    report.software.distributed_available = True
    report.software.backends = {"nccl": False, "gloo": False, "mpi": False, **backends}
    return report


def test_env009_fires_when_the_backend_is_missing(collect) -> None:
    report = _with_backends(collect(), gloo=True)
    findings = only(diagnose(report, backend="nccl"), "ENV009")
    assert len(findings) == 1 and findings[0].severity is Severity.ERROR
    assert "without the nccl backend" in findings[0].message
    assert len(only(diagnose(report, backend="mpi"), "ENV009")) == 1


def test_env009_fires_when_torch_is_missing(collect) -> None:
    report = collect()
    report.software.torch = None
    report.software.torch_error = "torch is not installed"
    findings = only(diagnose(report, backend="gloo"), "ENV009")
    assert len(findings) == 1 and "torch is not installed" in findings[0].message


def test_env009_traps(collect) -> None:
    report = _with_backends(collect(), nccl=True, gloo=True)
    assert only(diagnose(report, backend="nccl"), "ENV009") == []
    assert only(diagnose(report, backend="auto"), "ENV009") == []
    assert only(diagnose(report), "ENV009") == []


# --- ENV010 ------------------------------------------------------------------------------------


def test_env010_fires_when_exclusive_gpus_get_two_ranks(collect) -> None:
    fake = healthy_dgx()
    fake.gpus[0].compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    report = collect(nvml=fake, environ={"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "1"})
    findings = diagnose(report, nproc=2)
    assert codes(only(findings, "ENV010")) == [("ENV010", "<GPU 0>")]
    assert "2 ranks" in only(findings, "ENV010")[0].message


def test_env010_round_robin_over_visible_gpus(collect) -> None:
    fake = healthy_dgx()
    for gpu in fake.gpus:
        gpu.compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    report = collect(nvml=fake, environ={"OMP_NUM_THREADS": "1"})
    # 10 ranks on 8 GPUs: local ranks 8 and 9 land on GPUs 0 and 1.
    assert codes(only(diagnose(report, nproc=10), "ENV010")) == [
        ("ENV010", "<GPU 0>"),
        ("ENV010", "<GPU 1>"),
    ]


def test_env010_traps(collect) -> None:
    fake = healthy_dgx()
    for gpu in fake.gpus:
        gpu.compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    report = collect(nvml=fake, environ={"OMP_NUM_THREADS": "1"})
    assert only(diagnose(report, nproc=8), "ENV010") == []  # one rank per GPU is fine
    shared = collect(environ={"OMP_NUM_THREADS": "1"})  # default compute mode: sharing allowed
    assert only(diagnose(shared, nproc=16), "ENV010") == []


# --- ENV011 ------------------------------------------------------------------------------------


def test_env011_fires_on_mig_enabled(collect) -> None:
    fake = fake_nvml.a100_with_mig()
    fake.gpus[0].mig = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
    findings = only(diagnose(collect(nvml=fake)), "ENV011")
    assert codes(findings) == [("ENV011", "<GPU 0>")]
    assert findings[0].severity is Severity.WARNING


def test_env011_traps(collect) -> None:
    fake = fake_nvml.a100_with_mig()
    assert only(diagnose(collect(nvml=fake)), "ENV011") == []  # MIG supported but off
    fake.gpus[0].mig = (1, 1)
    assert only(diagnose(collect(nvml=fake), backend="gloo"), "ENV011") == []
    assert only(diagnose(collect()), "ENV011") == []  # Volta: MIG not supported at all


# --- ENV012 ------------------------------------------------------------------------------------


def test_env012_fires_with_several_ranks_and_no_omp_setting(collect) -> None:
    findings = only(diagnose(collect(), nproc=4), "ENV012")
    assert len(findings) == 1 and findings[0].severity is Severity.INFO
    from_env = only(diagnose(collect(environ={"LOCAL_WORLD_SIZE": "4"})), "ENV012")
    assert len(from_env) == 1


def test_env012_traps(collect) -> None:
    assert only(diagnose(collect(environ={"OMP_NUM_THREADS": "6"}), nproc=4), "ENV012") == []
    assert only(diagnose(collect(), nproc=1), "ENV012") == []
    assert only(diagnose(collect()), "ENV012") == []


# --- ENV014 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["eth9", "=eth", "^lo,eth,docker", "ib"])
def test_env014_fires_when_nccl_ifname_matches_nothing(collect, spec: str) -> None:
    findings = only(diagnose(collect(environ={"NCCL_SOCKET_IFNAME": spec})), "ENV014")
    assert len(findings) == 1 and findings[0].severity is Severity.ERROR
    assert "lo, docker0, eth0" in findings[0].message


@pytest.mark.parametrize("spec", ["eth", "=eth0", "^docker", "^=lo", "eth0:29400"])
def test_env014_trap_nccl_ifname_matches(collect, spec: str) -> None:
    assert only(diagnose(collect(environ={"NCCL_SOCKET_IFNAME": spec})), "ENV014") == []


def test_env014_gloo_takes_exact_names(collect) -> None:
    fired = only(diagnose(collect(environ={"GLOO_SOCKET_IFNAME": "eth"})), "ENV014")
    assert len(fired) == 1 and "GLOO_SOCKET_IFNAME" in fired[0].message
    assert only(diagnose(collect(environ={"GLOO_SOCKET_IFNAME": "eth0,lo"})), "ENV014") == []


# --- across rules ------------------------------------------------------------------------------


def test_every_finding_takes_name_and_severity_from_its_page(collect) -> None:
    fake = fake_nvml.dgx1_v100()
    fake.gpus[1].pcie = (3, 3, 8, 16)
    fake.gpus[0].compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    environ = {
        "NCCL_P2P_DISABLE": "1",
        "CUDA_VISIBLE_DEVICES": "0,0",
        "MASTER_ADDR": "x.invalid",
        "NCCL_SOCKET_IFNAME": "nope",
    }
    findings = diagnose(collect(nvml=fake, environ=environ), nproc=3, backend="mpi", failing=True)
    seen = {f.code for f in findings}
    assert {"ENV001", "ENV002", "ENV003", "ENV004", "ENV005", "ENV008", "ENV009", "ENV012", "ENV014"} <= seen
    for finding in findings:
        info = rule_info(finding.code)
        assert info is not None and info.kind == "env"
        assert (finding.name, finding.severity) == (info.name, info.severity)
        assert finding.source == "env" and (finding.line, finding.column) == (1, 1)


def test_healthy_node_has_no_findings(collect) -> None:
    report = collect(nvml=healthy_dgx(), environ={"OMP_NUM_THREADS": "4"})
    assert diagnose(report, nproc=8, backend="auto") == []


def test_diagnose_does_not_mutate_the_report(collect) -> None:
    report = collect()
    before = report.to_dict()
    diagnose(report, nproc=16, backend="nccl", failing=True)
    assert report.to_dict() == before
