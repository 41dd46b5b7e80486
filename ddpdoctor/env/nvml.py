"""Opening NVML and calling it without ever letting an NVML error escape.

Everything takes the NVML module as a parameter (`pynvml`, or the recorded fake the tests
inject), so the code above it is the same for a real driver and for the fake.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

from ddpdoctor.env.report import NvmlStatus

# NVML C enum values. Spelled out here because they are ABI (stable across drivers) and some
# pynvml releases define them wrongly (NVML_P2P_CAPS_INDEX_READ is the tuple `(0,)`).
TEMPERATURE_GPU = 0
MEMORY_ERROR_TYPE_UNCORRECTED = 1
VOLATILE_ECC = 0
AGGREGATE_ECC = 1
PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT = 0
PAGE_RETIREMENT_CAUSE_DOUBLE_BIT = 1
P2P_CAPS_INDEX_READ = 0
P2P_CAPS_INDEX_NVLINK = 2
NVLINK_MAX_LINKS = 18  # nvidia-smi also stops at 18 (Hopper's count); later links raise anyway.

COMPUTE_MODES = {
    0: "Default",
    1: "Exclusive_Thread",
    2: "Prohibited",
    3: "Exclusive_Process",
}

# Clock event ("throttle") reason bits, nvmlClocksEventReason*.
CLOCK_EVENT_REASONS = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}
GPU_IDLE = 0x1


class NvmlSession:
    """An initialised NVML plus a `call` that turns every NVML failure into (None, reason)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.error_type: type[BaseException] = getattr(module, "NVMLError", Exception)

    def call(self, name: str, *args: Any) -> tuple[Any, Optional[str]]:
        function: Optional[Callable[..., Any]] = getattr(self.module, name, None)
        if function is None:
            # Old nvidia-ml-py releases lack newer entry points (e.g. ClocksEventReasons).
            return None, f"{name} missing from these NVML bindings"
        try:
            return function(*args), None
        except self.error_type as error:
            return None, _error_text(error)
        except (OSError, AttributeError) as error:
            # Bindings newer than the driver: the C symbol is absent from libnvidia-ml.so.
            return None, f"{type(error).__name__}: {error}"


def _error_text(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # pynvml's __str__ itself calls into NVML, which can fail again.
        text = ""
    return text or type(error).__name__


def text(value: Any) -> Optional[str]:
    """Old bindings return bytes for strings, newer ones str."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def load_module() -> tuple[Optional[Any], Optional[str]]:
    try:
        return importlib.import_module("pynvml"), None
    except ImportError:
        return None, "NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    except Exception as error:  # a broken install should not stop the rest of the report
        return None, f"NVML: importing pynvml failed: {error}"


def bindings_version(module: Any) -> Optional[str]:
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        from importlib.metadata import version as dist_version

        return dist_version("nvidia-ml-py")
    except Exception:
        return None


def open_session(module: Any) -> tuple[Optional[NvmlSession], NvmlStatus]:
    """nvmlInit, turning the usual ways it fails on GPU-less hosts into one readable line."""
    status = NvmlStatus(available=False, message="", bindings_version=bindings_version(module))
    error_type = getattr(module, "NVMLError", Exception)
    try:
        module.nvmlInit()
    except error_type as error:
        kind = type(error).__name__
        if kind == "NVMLError_LibraryNotFound":
            status.message = "NVML: no NVIDIA driver on this host (libnvidia-ml.so.1 not found)"
        elif kind == "NVMLError_DriverNotLoaded":
            status.message = "NVML: the NVIDIA kernel driver is not loaded"
        elif kind == "NVMLError_NoPermission":
            status.message = "NVML: no permission to open the NVIDIA driver"
        elif kind == "NVMLError_LibRmVersionMismatch":
            status.message = (
                "NVML: driver/library version mismatch (driver updated without a reboot?)"
            )
        else:
            status.message = f"NVML: initialisation failed: {_error_text(error)}"
        return None, status
    except OSError as error:
        status.message = f"NVML: cannot load the driver library: {error}"
        return None, status
    session = NvmlSession(module)
    driver, _ = session.call("nvmlSystemGetDriverVersion")
    status.driver_version = text(driver)
    nvml_version, _ = session.call("nvmlSystemGetNVMLVersion")
    status.nvml_version = text(nvml_version)
    cuda, _ = session.call("nvmlSystemGetCudaDriverVersion")
    if isinstance(cuda, int) and cuda > 0:
        # Encoded as 1000 * major + 10 * minor (12040 -> 12.4).
        status.cuda_driver_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
    status.available = True
    status.message = "NVML: ok"
    return session, status


def close_session(session: Optional[NvmlSession]) -> None:
    if session is not None:
        session.call("nvmlShutdown")
