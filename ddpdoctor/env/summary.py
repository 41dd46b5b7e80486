"""`summary_lines`: the few lines a probe or bug report puts at its top."""

from __future__ import annotations

from collections import Counter

from ddpdoctor.env.report import EnvReport


def _na(value: object) -> str:
    return "n/a" if value is None else str(value)


def summary_lines(report: EnvReport) -> list[str]:
    software = report.software
    lines = [f"Python {software.python} on {software.platform}"]
    if software.torch is None:
        lines.append(f"torch: {software.torch_error or 'not installed'}")
    else:
        lines.append(
            f"torch {software.torch} (CUDA {_na(software.torch_cuda)}, "
            f"cuDNN {_na(software.torch_cudnn)}, NCCL {_na(software.torch_nccl)})"
        )
        available = [name for name, ok in software.backends.items() if ok]
        lines.append(f"distributed backends: {', '.join(available) or 'none'}")
    if report.gpus:
        names = Counter(gpu.name or "unknown GPU" for gpu in report.gpus)
        described = ", ".join(f"{count} x {name}" for name, count in names.items())
        visible = report.launch.visible_gpu_count
        suffix = f", {visible} visible" if visible is not None and visible != len(report.gpus) else ""
        lines.append(f"GPUs: {described}{suffix}")
    else:
        lines.append(f"GPUs: none found ({software.nvml.message})")
    if software.nvml.driver_version:
        cuda = software.nvml.cuda_driver_version
        lines.append(
            f"NVIDIA driver {software.nvml.driver_version}"
            + (f" (supports CUDA {cuda})" if cuda else "")
        )
    return lines
