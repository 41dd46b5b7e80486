"""The NVML reporting path, run for real over the recorded fake (tests/env/fake_nvml.py)."""

from __future__ import annotations

import json

import pynvml
import pytest

import fake_nvml
from ddpdoctor.env import collect_env, diagnose, summary_lines
from ddpdoctor.env.render import to_json, to_text


def test_dgx_gpu_facts(collect) -> None:
    report = collect()
    assert [g.index for g in report.gpus] == list(range(8))
    gpu0 = report.gpus[0]
    assert gpu0.name == "Tesla V100-SXM2-32GB"
    assert gpu0.uuid.startswith("GPU-0c7a1f3e")
    assert gpu0.pci_bus_id == "00000000:06:00.0"
    assert gpu0.memory_total == 32 * 2**30
    assert gpu0.power_draw_w == 43.0 and gpu0.power_limit_w == 300.0
    assert gpu0.compute_mode == "Default"
    assert gpu0.nvlinks_up == 6
    assert (gpu0.pcie_gen, gpu0.pcie_gen_max, gpu0.pcie_width, gpu0.pcie_width_max) == (1, 3, 16, 16)
    assert gpu0.clock_event_reasons == ["GpuIdle"]
    gpu3 = report.gpus[3]
    assert (gpu3.ecc_uncorrected_volatile, gpu3.ecc_uncorrected_aggregate) == (2, 3)
    assert gpu3.retired_pages == 1 and gpu3.retired_pages_pending is True
    assert report.gpus[5].clock_event_reasons == ["SwThermalSlowdown", "HwThermalSlowdown"]


def test_unsupported_fields_degrade_to_na_with_reason(collect) -> None:
    report = collect()
    gpu = report.gpus[0]
    # Volta has neither MIG nor row remapping: NVML raises NotSupported for both.
    assert gpu.mig_enabled is None and gpu.unavailable["mig_mode"] == "Not Supported"
    assert gpu.remapped_rows_pending is None
    assert gpu.unavailable["remapped_rows"] == "Not Supported"
    health = to_text(report, [], color=False)
    assert "n/a" in health and "Traceback" not in health


def test_dgx_topology_matches_nvidia_smi(collect) -> None:
    topology = collect().topology
    assert topology is not None
    assert topology.matrix == fake_nvml.DGX1_TOPO_MATRIX
    # PCIe P2P does not cross the QPI link; NVLink pairs and same-socket pairs do P2P.
    assert topology.p2p_read[0][5] == "CNS"
    assert topology.p2p_read[0][4] == "OK"
    assert topology.p2p_read[0][1] == "OK"


def test_pcie_workstation_without_nvlink_or_ecc(collect) -> None:
    report = collect(nvml=fake_nvml.pcie_workstation())
    assert report.topology is not None
    assert report.topology.matrix[0] == ["X", "PHB", "SYS", "SYS"]
    assert report.topology.p2p_read[0][1] == "GNS"
    for gpu in report.gpus:
        assert gpu.nvlinks_up is None and gpu.unavailable["nvlinks_up"] == "Not Supported"
        assert gpu.ecc_uncorrected_volatile is None and gpu.retired_pages is None
    # Nothing wrong on this box: idle GPUs at Gen1 are power management, not a bad link.
    assert diagnose(report) == []


def test_nvswitch_links_count_like_nvidia_smi(collect) -> None:
    fake = fake_nvml.a100_with_mig()
    second = fake_nvml.dataclasses.replace(
        fake.gpus[0], uuid="GPU-a100a100-second", bus_id="00000000:07:00.0"
    )
    fake.gpus.append(second)
    fake.ancestors[frozenset((0, 1))] = pynvml.NVML_TOPOLOGY_SYSTEM

    # Links land on NVSwitches, not on the peer GPU; NVML's NVLink P2P status says they connect.
    def p2p(device1, device2, index):
        return pynvml.NVML_P2P_STATUS_OK

    fake.nvmlDeviceGetP2PStatus = p2p  # type: ignore[method-assign]
    report = collect(nvml=fake)
    assert report.topology is not None
    assert report.topology.matrix == [["X", "NV12"], ["NV12", "X"]]


def test_lost_gpu_keeps_its_row(collect, dgx) -> None:
    dgx.gpus[6].lost = True
    report = collect(nvml=dgx)
    assert len(report.gpus) == 8
    assert report.gpus[6].unavailable["handle"] == "GPU is lost"
    assert report.topology is not None and report.topology.matrix[6][0] == "n/a"
    text = to_text(report, diagnose(report), color=False)
    row = next(line for line in text.splitlines() if line.startswith("| 6 "))
    assert row.replace("|", " ").split()[:3] == ["6", "n/a", "n/a"]


def test_old_bindings_fall_back_to_throttle_reasons(collect, dgx) -> None:
    dgx.nvmlDeviceGetCurrentClocksEventReasons = None  # absent before nvidia-ml-py 12.535
    report = collect(nvml=dgx)
    assert report.gpus[5].clock_event_reasons == ["SwThermalSlowdown", "HwThermalSlowdown"]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML: no NVIDIA driver on this host"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVML: the NVIDIA kernel driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NVML: no permission"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "NVML: driver/library version mismatch"),
    ],
)
def test_nvml_init_failures_are_one_line(collect, dgx, code: int, expected: str) -> None:
    dgx.init_error = code
    report = collect(nvml=dgx)
    assert report.gpus == [] and report.topology is None
    assert report.software.nvml.available is False
    assert report.software.nvml.message.startswith(expected)
    assert any(line.endswith(f"({report.software.nvml.message})") for line in summary_lines(report))


def test_nvml_is_shut_down_after_collection(collect, dgx) -> None:
    collect(nvml=dgx)
    assert dgx.calls == ["nvmlInit", "nvmlShutdown"]
    assert dgx.initialized is False


def test_injected_through_sys_modules(monkeypatch, dgx) -> None:
    # The probe (and users' tooling) may inject NVML by module name instead of by parameter.
    monkeypatch.setitem(__import__("sys").modules, "pynvml", dgx)
    report = collect_env(environ={})
    assert len(report.gpus) == 8
    assert report.software.nvml.driver_version == "535.129.03"
    assert report.software.nvml.cuda_driver_version == "12.2"


def test_json_has_exactly_the_documented_keys(collect) -> None:
    report = collect()
    payload = json.loads(to_json(report, diagnose(report)))
    assert set(payload) == {"software", "gpus", "topology", "launch", "findings"}
    assert len(payload["gpus"]) == 8
    assert payload["topology"]["matrix"][0][3] == "NV2"
    assert {f["code"] for f in payload["findings"]} == {"ENV001", "ENV002"}
    assert all(f["source"] == "env" for f in payload["findings"])


def test_summary_lines(collect) -> None:
    lines = summary_lines(collect())
    assert 3 <= len(lines) <= 6
    assert "GPUs: 8 x Tesla V100-SXM2-32GB" in lines
    assert "NVIDIA driver 535.129.03 (supports CUDA 12.2)" in lines
    assert any(line.startswith("torch ") or line.startswith("torch:") for line in lines)


def test_text_render_shows_matrix_rows(collect) -> None:
    text = to_text(collect(), [], color=False)
    row = next(line for line in text.splitlines() if line.strip("| ").startswith("GPU5 "))
    assert row.replace("|", " ").split() == ["GPU5", *fake_nvml.DGX1_TOPO_MATRIX[5]]
    assert "\x1b[" not in text


def test_color_render_uses_panels_and_ansi(collect) -> None:
    report = collect()
    text = to_text(report, diagnose(report), color=True, width=160)
    assert "\x1b[" in text and "╭" in text and "## Software" not in text
    assert "ENV001" in text
