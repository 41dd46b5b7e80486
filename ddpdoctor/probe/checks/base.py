"""What a check gets to work with on its rank, and helpers shared by the checks (torch here)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

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
    # Capabilities probed at start-up on this backend (feature -> the reason it is unsupported).
    unsupported: dict[str, str] = field(default_factory=dict)
    # The link map's message size (0: its default for the device).
    link_bytes: int = 0

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"


def tensor_hash(tensors: "list[torch.Tensor]") -> str:
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def pattern(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """1..7 repeating: small integers, exact in every dtype, so sums of them are known exactly."""
    return (torch.arange(size, device=device, dtype=torch.int64) % 7 + 1).to(dtype)


def max_rel_err(got: torch.Tensor, exact: torch.Tensor) -> float:
    """Largest |got - exact| / max(|exact|, 1), computed in float64 against an exact float64 value."""
    diff = (got.double() - exact.double()).abs() / exact.double().abs().clamp_min(1.0)
    return float(diff.max().item()) if diff.numel() else 0.0


def first_bad_index(got: torch.Tensor, exact: torch.Tensor, tolerance: float) -> int:
    rel = (got.double() - exact.double()).abs() / exact.double().abs().clamp_min(1.0)
    return int((rel > tolerance).nonzero()[0].item())


def abs_grad_sum(model: nn.Module, loss_of: Callable[[int], torch.Tensor], samples: int) -> float:
    """max over parameter elements of sum_i |d loss_i / dp|, one backward per sample: the size the
    rounding of a batch gradient is relative to (see ddpdoctor.probe.tolerance.step_tolerance)."""
    params = [p for p in model.parameters() if p.requires_grad]
    totals = [torch.zeros_like(p) for p in params]
    for i in range(samples):
        grads = torch.autograd.grad(loss_of(i), params)
        for total, grad in zip(totals, grads):
            total.add_(grad.abs())
    return max(float(t.max().item()) for t in totals) if totals else 0.0


def param_abs_max(model: nn.Module) -> float:
    return max(float(p.detach().abs().max().item()) for p in model.parameters())


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
            unsupported[dtype_name] = f"{backend} in torch {torch.__version__} refused {dtype_name} all-reduce: {short(exc)}"
    t = torch.ones(1, dtype=torch.float32, device=device)
    try:
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        if abs(t.item() - 1.0) > 1e-6:
            unsupported["avg"] = f"ReduceOp.AVG returned {t.item()} instead of 1.0"
    except Exception as exc:  # noqa: BLE001
        unsupported["avg"] = f"{backend} in torch {torch.__version__} refused ReduceOp.AVG: {short(exc)}"
    return unsupported


def short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]
