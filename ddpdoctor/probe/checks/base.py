"""What a check gets to work with on its rank, and helpers shared by the checks."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from ddpdoctor.probe import results as R
from ddpdoctor.probe.faults import Faults


@dataclass
class Context:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    backend: str
    device: torch.device
    timeout: float
    faults: Faults
    # Capabilities probed at start-up on this backend (dtype -> None if supported, else the reason).
    unsupported: dict[str, str] = field(default_factory=dict)

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"


def tensor_hash(tensors: "list[torch.Tensor]") -> str:
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def blame_failures(rec: dict[str, Any], advice: str = "") -> bool:
    """If any rank failed or errored, name them with the first one's message (and the advice) in
    the record's summary and return True; else leave the record alone and return False."""
    bad = R.ranks_with(rec, R.FAIL, R.ERROR)
    if not bad:
        return False
    first = next(e for e in rec["ranks"] if e["rank"] in bad)
    rec["summary"] = f"{R.format_ranks(bad)}: {first['message']}"
    rec["advice"] = advice
    return True


def default_judge(name: str, advice: str, describe: Callable[[list[dict[str, Any]]], str] | None = None):
    """The usual verdict: fail names the failing ranks; pass says what was verified."""

    def judge(entries: list[dict[str, Any]]) -> dict[str, Any]:
        rec = R.record(name, entries)
        if blame_failures(rec, advice):
            return rec
        if rec["status"] == R.SKIP:
            rec["summary"] = rec["ranks"][0]["message"] if rec["ranks"] else "skipped"
        else:
            rec["summary"] = describe(rec["ranks"]) if describe else (rec["ranks"][0]["message"] if rec["ranks"] else "")
        return rec

    return judge


def probe_support(backend: str, device: torch.device, world_size: int) -> dict[str, str]:
    """Try the optional features once, collectively, and turn "unsupported" into a reason.

    Probing at runtime (rather than comparing version numbers) is what tells the truth for this
    exact build: gloo gained bfloat16 all-reduce and ReduceOp.AVG only in recent releases. Every rank
    runs the same tries in the same order; an unsupported op is rejected locally before any traffic,
    so the ranks stay in step.
    """
    unsupported: dict[str, str] = {}
    for dtype_name in ("float16", "bfloat16"):
        t = torch.ones(1, dtype=getattr(torch, dtype_name), device=device)
        try:
            dist.all_reduce(t)
            if t.item() != world_size:
                unsupported[dtype_name] = f"{backend} all-reduce of {dtype_name} returned {t.item()}"
        except Exception as exc:  # noqa: BLE001 -- any refusal means "not supported here"
            unsupported[dtype_name] = f"{backend} in torch {torch.__version__} refused {dtype_name} all-reduce: {_short(exc)}"
    t = torch.ones(1, dtype=torch.float32, device=device)
    try:
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        if abs(t.item() - 1.0) > 1e-6:
            unsupported["avg"] = f"ReduceOp.AVG returned {t.item()} instead of 1.0"
    except Exception as exc:  # noqa: BLE001
        unsupported["avg"] = f"{backend} in torch {torch.__version__} refused ReduceOp.AVG: {_short(exc)}"
    return unsupported


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]
