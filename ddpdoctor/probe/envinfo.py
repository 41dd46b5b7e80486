"""The environment header: the probe's own summary, plus `ddpdoctor env` when it is installed.

`ddpdoctor.env` is developed separately; it is imported defensively so that the probe still works
(and says so) when it is missing or broken.
"""

from __future__ import annotations

import platform
import socket
from typing import Any


def probe_environment() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,  # the build's CUDA version: reading it does not initialise CUDA
        "nccl_available": bool(dist.is_nccl_available()),
        "gloo_available": bool(dist.is_gloo_available()),
    }


def env_doctor(nproc: int, backend: str) -> dict[str, Any]:
    """{"summary": dict|None, "lines": [str], "findings": [..], "error": str|None} from ddpdoctor.env."""
    try:
        from ddpdoctor.env import collect_env, diagnose
    except Exception as exc:  # noqa: BLE001 -- missing or broken: the probe goes on without it
        return {"summary": None, "findings": [], "error": f"ddpdoctor.env unavailable ({type(exc).__name__}: {exc})"}
    try:
        report = collect_env()
        findings = diagnose(report, nproc=nproc, backend=backend)
        summary = report.to_dict() if hasattr(report, "to_dict") else {}
        try:
            from ddpdoctor.env.summary import summary_lines

            lines = [str(line) for line in summary_lines(report)]
        except Exception:  # noqa: BLE001 -- the header just gets shorter
            lines = []
        return {
            "summary": summary,
            "lines": lines,
            "findings": [f.to_dict() for f in findings],
            "error": None,
        }
    except Exception as exc:  # noqa: BLE001
        return {"summary": None, "findings": [], "error": f"ddpdoctor.env failed ({type(exc).__name__}: {exc})"}
