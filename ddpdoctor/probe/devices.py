"""Backend and device selection in the parent, which must never initialise CUDA (the workers are
forked from it, and a forked child cannot use a CUDA context its parent created). GPUs are counted
through NVML and CUDA_VISIBLE_DEVICES instead."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ddpdoctor.probe.options import OptionError


@dataclass(frozen=True)
class Selection:
    backend: str
    device: str
    nproc: int
    gpus: int
    reason: str


def visible_gpu_count() -> tuple[int, str]:
    """(count, how it was found). Never touches torch.cuda."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    nvml_count: Optional[int] = None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            nvml_count = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        nvml_count = None
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip()]
        # CUDA stops at the first invalid id, "-1" included.
        count = 0
        for v in ids:
            if v.strip().startswith("-"):
                break
            count += 1
        if nvml_count is not None:
            count = min(count, nvml_count)
        return count, f"CUDA_VISIBLE_DEVICES={visible!r}"
    if nvml_count is None:
        return 0, "NVML unavailable (no NVIDIA driver)"
    return nvml_count, "NVML"


def select(backend: str, device: str, nproc: Optional[int],
           torch_has_cuda: bool = False, nccl_available: bool = False,
           gpu_count: Optional[tuple[int, str]] = None) -> Selection:
    gpus, how = gpu_count if gpu_count is not None else visible_gpu_count()
    if not torch_has_cuda:
        gpus, how = 0, "torch was built without CUDA"
    if device == "cpu" and backend == "nccl":
        raise OptionError("--backend nccl needs --device cuda: NCCL only moves CUDA tensors")
    if device == "cuda" and gpus == 0:
        raise OptionError(f"--device cuda but no GPU is visible ({how})")
    if backend == "nccl" and not nccl_available:
        raise OptionError("--backend nccl but this torch build has no NCCL support")
    wants_cuda = device == "cuda" or backend == "nccl"
    if nproc is None:
        nproc = gpus if (wants_cuda or (device == "auto" and gpus > 0)) else 2
    if wants_cuda and nproc > gpus:
        raise OptionError(
            f"--nproc {nproc} is more than the {gpus} visible GPU(s) ({how}): NCCL needs one GPU per local rank; "
            "lower --nproc or use --backend gloo --device cpu"
        )
    if device == "auto":
        device = "cuda" if 0 < nproc <= gpus else "cpu"
    if backend == "auto":
        backend = "nccl" if device == "cuda" and nccl_available else "gloo"
        reason = (
            f"auto: {gpus} visible GPU(s) ({how}) for {nproc} local rank(s) -> {backend} on {device}"
            + ("" if backend == "nccl" else " (NCCL needs at least one GPU per local rank)")
        )
    else:
        reason = f"requested {backend} on {device} ({gpus} visible GPU(s), {how})"
    return Selection(backend=backend, device=device, nproc=nproc, gpus=gpus, reason=reason)
