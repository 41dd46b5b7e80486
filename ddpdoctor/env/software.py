"""Python, torch and horovod versions and builds; torch is imported here, lazily, and only here."""

from __future__ import annotations

import importlib
import importlib.util
import platform
from pathlib import Path
from typing import Any, Optional

from ddpdoctor.env.report import HorovodInfo, SoftwareInfo

BACKENDS = ("nccl", "gloo", "mpi")


def collect_software() -> SoftwareInfo:
    info = SoftwareInfo(
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.release()} ({platform.machine()})",
    )
    _fill_torch(info)
    info.horovod = collect_horovod()
    return info


def _fill_torch(info: SoftwareInfo) -> None:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        info.torch_error = "torch is not installed"
        return
    except Exception as error:  # e.g. OSError from a missing libcudart: report, don't crash
        info.torch_error = f"importing torch failed: {type(error).__name__}: {error}"
        return
    info.torch = str(getattr(torch, "__version__", "unknown"))
    version = getattr(torch, "version", None)
    info.torch_cuda = getattr(version, "cuda", None)
    info.torch_cudnn = _cudnn_version(torch)
    info.torch_nccl = _nccl_version(torch)
    try:
        # Does not initialise CUDA in torch >= 1.13 (NVML-based count), and respects
        # CUDA_VISIBLE_DEVICES.
        info.torch_device_count = int(torch.cuda.device_count())
    except Exception:
        info.torch_device_count = None
    try:
        dist = importlib.import_module("torch.distributed")
        info.distributed_available = bool(dist.is_available())
    except Exception:
        info.distributed_available = False
    if not info.distributed_available:
        info.backends = {name: False for name in BACKENDS}
        return
    for name in BACKENDS:
        check = getattr(dist, f"is_{name}_available", None)
        try:
            info.backends[name] = bool(check()) if check else False
        except Exception:
            info.backends[name] = False


def _cudnn_version(torch: Any) -> Optional[str]:
    """The cuDNN library's own version, asked directly: torch.backends.cudnn.version() first checks
    compatibility with the device, which initialises CUDA (seen on an H100 with torch 2.11), and a
    process that has done that cannot fork ranks that use CUDA -- the probe's parent runs this
    before it forks its ranks."""
    cudnn = getattr(torch._C, "_cudnn", None)  # absent from CPU builds
    try:
        version = int(cudnn.getVersionInt()) if cudnn is not None else 0
    except Exception:
        return None
    return str(version) if version else None


def _nccl_version(torch: Any) -> Optional[str]:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # CPU builds have no _nccl_version at all
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    if isinstance(version, int):
        # Old torch returned NCCL_VERSION_CODE: 2708 -> 2.7.8, 21903 -> 2.19.3.
        if version >= 10000:
            return f"{version // 10000}.{(version % 10000) // 100}.{version % 100}"
        return f"{version // 1000}.{(version % 1000) // 100}.{version % 100}"
    return str(version)


# The compiled extension each framework binding ships, as `horovodrun --check-build` tests for.
_HOROVOD_FRAMEWORKS = {
    "TensorFlow": ("tensorflow", "mpi_lib"),
    "PyTorch": ("torch", "mpi_lib_v2"),
    "MXNet": ("mxnet", "mpi_lib"),
}


def collect_horovod() -> HorovodInfo:
    spec = importlib.util.find_spec("horovod")
    if spec is None:
        return HorovodInfo(installed=False)
    info = HorovodInfo(installed=True)
    try:
        horovod = importlib.import_module("horovod")
        info.version = str(getattr(horovod, "__version__", "unknown"))
    except Exception as error:
        info.error = f"importing horovod failed: {type(error).__name__}: {error}"
        return info
    # Look for the built extensions on disk rather than importing horovod.tensorflow / .mxnet,
    # which would import whole frameworks just to print a tick.
    locations = [Path(p) for p in (spec.submodule_search_locations or [])]
    for framework, (subdir, stem) in _HOROVOD_FRAMEWORKS.items():
        info.frameworks[framework] = any(
            any((base / subdir).glob(f"{stem}*.so")) or any((base / subdir).glob(f"{stem}*.pyd"))
            for base in locations
        )
    if not info.frameworks.get("PyTorch"):
        info.error = "horovod was built without PyTorch support"
        return info
    try:
        hvd = importlib.import_module("horovod.torch")
    except Exception as error:
        info.error = f"importing horovod.torch failed: {type(error).__name__}: {error}"
        return info
    info.controllers = {name: _built(hvd, f"{name.lower()}_built") for name in ("MPI", "Gloo")}
    info.tensor_operations = {
        name: _built(hvd, f"{name.lower()}_built")
        for name in ("NCCL", "DDL", "CCL", "MPI", "Gloo")
    }
    return info


def _built(module: Any, function: str) -> Optional[bool]:
    check = getattr(module, function, None)
    if check is None:
        return None
    try:
        return bool(check())
    except Exception:
        return None
