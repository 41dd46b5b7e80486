"""Deliberate misbehaviour for the detectors' self-test (`--inject-fault KIND:RANK`).

A probe that cannot fail proves nothing: each kind below is planted in exactly one check of each
framework (the registry says which) and must be detected by that check and attributed to the right
rank. The hooks are no-ops unless the rank was named, so the production path runs the same code.

- allreduce-corrupt: the rank's all-reduce results are silently wrong (a flaky GPU, bad NVLink).
- param-desync:      the rank's parameters drift from the others after the initial broadcast
                     (e.g. a checkpoint loaded on one rank after wrapping).
- hang:              the rank never arrives at the liveness check.
- crash:             the rank raises during the liveness check and the process dies.
- slow-link:A,B:     every message between ranks A and B (either way) is late (a degraded cable,
                     NVLink down to PCIe); torch only, caught by the link map.
- slow-rank:R:       every message to or from rank R is late (a slow NIC, a throttled GPU).

No torch at import time: the options are parsed before torch is imported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import torch

FAULT_KINDS = ("allreduce-corrupt", "param-desync", "hang", "crash", "slow-link", "slow-rank")
# Planted in the link map, which only torch ranks run.
LINK_FAULTS = ("slow-link", "slow-rank")
# What a slowed message waits, per message: far above a loopback or NVLink message's time, so a
# slowed link stands out by a large factor even on a busy machine.
LINK_DELAY_S = 0.005


class FaultError(ValueError):
    """A malformed --inject-fault value."""


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int
    peer: Optional[int] = None  # the other end of a slow-link

    def __str__(self) -> str:
        return f"{self.kind}:{self.rank}" + (f",{self.peer}" if self.peer is not None else "")

    @property
    def ranks(self) -> tuple[int, ...]:
        return (self.rank,) if self.peer is None else (self.rank, self.peer)


def _rank(text: str, whole: str) -> int:
    try:
        rank = int(text)
    except ValueError:
        raise FaultError(f"--inject-fault {whole!r}: RANK must be an integer") from None
    if rank < 0:
        raise FaultError(f"--inject-fault {whole!r}: RANK must be >= 0")
    return rank


def parse_fault(text: str) -> FaultSpec:
    kind, sep, rank_text = text.partition(":")
    if not sep or kind not in FAULT_KINDS:
        raise FaultError(
            f"--inject-fault expects KIND:RANK (slow-link:A,B) with KIND one of {', '.join(FAULT_KINDS)}; got {text!r}"
        )
    if kind == "slow-link":
        first, comma, second = rank_text.partition(",")
        if not comma:
            raise FaultError(f"--inject-fault {text!r}: slow-link takes two ranks, slow-link:A,B")
        a, b = _rank(first, text), _rank(second, text)
        if a == b:
            raise FaultError(f"--inject-fault {text!r}: a link joins two different ranks")
        return FaultSpec(kind, min(a, b), max(a, b))
    return FaultSpec(kind, _rank(rank_text, text))


def parse_faults(texts: "list[str] | tuple[str, ...]") -> tuple[FaultSpec, ...]:
    return tuple(parse_fault(t) for t in texts)


class InjectedCrash(RuntimeError):
    """Raised by `--inject-fault crash:RANK`; deliberately not caught, so the rank really dies."""


class Faults:
    """The hooks one rank runs; each does nothing unless this rank was named."""

    def __init__(self, specs: "tuple[FaultSpec, ...]", rank: int) -> None:
        self.kinds = {spec.kind for spec in specs if rank in spec.ranks}
        self.rank = rank
        # Both ends of a link must know it is slow: either may be the one sending.
        self.slow_links = {frozenset(spec.ranks) for spec in specs if spec.kind == "slow-link"}
        self.slow_ranks = {spec.rank for spec in specs if spec.kind == "slow-rank"}

    def link_delay(self, peer: int) -> float:
        """Seconds each message between this rank and `peer` is held back (0 unless named)."""
        if frozenset((self.rank, peer)) in self.slow_links or self.slow_ranks & {self.rank, peer}:
            return LINK_DELAY_S
        return 0.0

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
