"""Deliberate misbehaviour for the detectors' self-test (`--inject-fault KIND:RANK`).

A probe that cannot fail proves nothing: each kind below is planted in exactly one check of each
framework (the registry says which) and must be detected by that check and attributed to the right
rank. The hooks are no-ops unless the rank was named, so the production path runs the same code.

- allreduce-corrupt: the rank's all-reduce results are silently wrong (a flaky GPU, bad NVLink).
- param-desync:      the rank's parameters drift from the others after the initial broadcast
                     (e.g. a checkpoint loaded on one rank after wrapping).
- hang:              the rank never arrives at the liveness check.
- crash:             the rank raises during the liveness check and the process dies.

No torch at import time: the options are parsed before torch is imported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FAULT_KINDS = ("allreduce-corrupt", "param-desync", "hang", "crash")


class FaultError(ValueError):
    """A malformed --inject-fault value."""


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.rank}"


def parse_fault(text: str) -> FaultSpec:
    kind, sep, rank_text = text.partition(":")
    if not sep or kind not in FAULT_KINDS:
        raise FaultError(
            f"--inject-fault expects KIND:RANK with KIND one of {', '.join(FAULT_KINDS)}; got {text!r}"
        )
    try:
        rank = int(rank_text)
    except ValueError:
        raise FaultError(f"--inject-fault {text!r}: RANK must be an integer") from None
    if rank < 0:
        raise FaultError(f"--inject-fault {text!r}: RANK must be >= 0")
    return FaultSpec(kind, rank)


def parse_faults(texts: "list[str] | tuple[str, ...]") -> tuple[FaultSpec, ...]:
    return tuple(parse_fault(t) for t in texts)


class InjectedCrash(RuntimeError):
    """Raised by `--inject-fault crash:RANK`; deliberately not caught, so the rank really dies."""


class Faults:
    """The hooks one rank runs; each does nothing unless this rank was named."""

    def __init__(self, specs: "tuple[FaultSpec, ...]", rank: int) -> None:
        self.kinds = {spec.kind for spec in specs if spec.rank == rank}
        self.rank = rank

    def active(self, kind: str) -> bool:
        return kind in self.kinds

    def corrupt_allreduce_result(self, tensor: "torch.Tensor") -> None:
        if "allreduce-corrupt" in self.kinds and tensor.numel() > 0:
            # One element off by one: the smallest error an exact check must still catch.
            flat = tensor.view(-1)
            flat[flat.numel() // 2] += 1

    def desync_parameters(self, module: Any) -> None:
        if "param-desync" in self.kinds:
            import torch

            with torch.no_grad():
                next(iter(module.parameters())).add_(1e-3)

    def maybe_hang(self) -> None:
        if "hang" in self.kinds:
            # Sleep "forever"; the parent kills this process once the others have reported.
            while True:
                time.sleep(3600)

    def maybe_crash(self) -> None:
        if "crash" in self.kinds:
            raise InjectedCrash(f"injected crash on rank {self.rank} (--inject-fault crash:{self.rank})")
