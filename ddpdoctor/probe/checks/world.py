"""Who is who: every rank reports its identity, device and versions; disagreements fail."""

from __future__ import annotations

import os
import socket
from typing import Any

import torch

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context
from ddpdoctor.probe.judges import fail_ranks, version_disagreements

NAME = "world"

_ENV_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TORCH_DISTRIBUTED_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
)
# Versions that must agree across ranks.
_VERSION_KEYS = ("torch", "cuda", "nccl", "python")


def _nccl_version() -> str | None:
    try:
        if not torch.cuda.is_available():
            return None
        version = torch.cuda.nccl.version()
        return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    except Exception:
        return None


def run(ctx: Context) -> R.RankEntry:
    import platform

    env = {k: os.environ[k] for k in _ENV_VARS if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
    gpu: dict[str, Any] = {}
    if ctx.on_cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        gpu = {
            "index": ctx.device.index,
            "name": props.name,
            # The UUID tells two ranks on one physical GPU apart from two GPUs of the same model.
            "uuid": str(getattr(props, "uuid", "")) or f"{socket.gethostname()}:{ctx.device.index}",
        }
    detail = {
        "local_rank": ctx.local_rank,
        "node_rank": ctx.node_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(ctx.device),
        "gpu": gpu,
        "backend": ctx.backend,
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": _nccl_version(),
            "python": platform.python_version(),
        },
        "env": env,
    }
    return R.entry(ctx.rank, R.PASS, f"{detail['host']} {detail['device']} torch {torch.__version__}", **detail)


def judge(entries: list[R.RankEntry]) -> R.CheckRecord:
    live = [e for e in entries if e["status"] == R.PASS]
    problems = version_disagreements(live, _VERSION_KEYS)
    by_gpu: dict[str, list[int]] = {}
    for e in live:
        gpu = e["detail"].get("gpu") or {}
        if gpu.get("uuid"):
            by_gpu.setdefault(gpu["uuid"], []).append(e["rank"])
    for uuid, ranks in by_gpu.items():
        if len(ranks) > 1:
            for r in ranks:
                problems.setdefault(r, []).append(f"shares GPU {uuid} with {R.format_ranks(x for x in ranks if x != r)}")
    fail_ranks(live, problems)
    rec = R.record(NAME, entries)
    if not R.blame_failures(rec):
        hosts = sorted({e["detail"]["host"] for e in live})
        v = live[0]["detail"]["versions"] if live else {}
        rec["summary"] = (
            f"{len(live)} ranks on {len(hosts)} host(s), {live[0]['detail']['backend'] if live else '?'}, "
            f"torch {v.get('torch') or 'n/a'}, CUDA {v.get('cuda') or 'n/a'}, NCCL {v.get('nccl') or 'n/a'}: "
            "versions agree"
        )
    return rec
