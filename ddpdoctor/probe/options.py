"""Probe options and their validation. No torch here: bad options must fail fast, in one line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

FAULT_KINDS = ("allreduce-corrupt", "param-desync", "hang", "crash")

# The checks in the order they run. Liveness comes early so that a dead or hung rank is named before
# the heavier checks spend their timeouts waiting for it.
CHECK_NAMES = (
    "world",
    "liveness",
    "allreduce",
    "param-sync",
    "ddp-parity",
    "syncbn",
    "sampler",
    "bandwidth",
)


class OptionError(ValueError):
    """A bad option; reported as one line and exit status 2."""


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.rank}"


def parse_fault(text: str) -> FaultSpec:
    kind, sep, rank_text = text.partition(":")
    if not sep or kind not in FAULT_KINDS:
        raise OptionError(
            f"--inject-fault expects KIND:RANK with KIND one of {', '.join(FAULT_KINDS)}; got {text!r}"
        )
    try:
        rank = int(rank_text)
    except ValueError:
        raise OptionError(f"--inject-fault {text!r}: RANK must be an integer") from None
    if rank < 0:
        raise OptionError(f"--inject-fault {text!r}: RANK must be >= 0")
    return FaultSpec(kind, rank)


def parse_faults(texts: "list[str] | tuple[str, ...]") -> tuple[FaultSpec, ...]:
    return tuple(parse_fault(t) for t in texts)


def faults_to_env(faults: "tuple[FaultSpec, ...]") -> str:
    return ",".join(str(f) for f in faults)


def faults_from_env(text: str) -> tuple[FaultSpec, ...]:
    return tuple(parse_fault(t) for t in text.split(",") if t.strip())


def parse_checks(text: Optional[str]) -> tuple[str, ...]:
    if not text:
        return CHECK_NAMES
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [w for w in wanted if w not in CHECK_NAMES]
    if unknown:
        raise OptionError(f"--checks: unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECK_NAMES)}")
    # Keep the canonical order whatever order the user typed.
    return tuple(name for name in CHECK_NAMES if name in wanted)


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise OptionError(f"--rdzv-endpoint expects HOST:PORT; got {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise OptionError(f"--rdzv-endpoint {text!r}: PORT must be an integer") from None
    if not 0 <= port <= 65535:
        raise OptionError(f"--rdzv-endpoint {text!r}: PORT out of range")
    return host, port


@dataclass
class ProbeOptions:
    nproc: Optional[int] = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: Optional[str] = None
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    backend: str = "auto"
    device: str = "auto"
    timeout: float = 5.0
    join_timeout: float = 60.0
    faults: tuple[FaultSpec, ...] = ()
    checks: tuple[str, ...] = CHECK_NAMES
    output_format: str = "text"
    run_id: Optional[str] = None
    extra: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.nproc is not None and self.nproc < 1:
            raise OptionError("--nproc must be >= 1")
        if self.nnodes < 1:
            raise OptionError("--nnodes must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise OptionError(f"--node-rank must be in [0, {self.nnodes - 1}]")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise OptionError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        if self.rdzv_endpoint:
            parse_endpoint(self.rdzv_endpoint)
        if not 0 <= self.master_port <= 65535:
            raise OptionError("--master-port out of range")
        if self.timeout <= 0:
            raise OptionError("--timeout must be > 0 seconds")
        if self.join_timeout <= 0:
            raise OptionError("--join-timeout must be > 0 seconds")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise OptionError("--backend must be auto, nccl or gloo")
        if self.device not in ("auto", "cuda", "cpu"):
            raise OptionError("--device must be auto, cuda or cpu")
        if self.nproc is not None:
            world = self.nproc * self.nnodes
            for fault in self.faults:
                if fault.rank >= world:
                    raise OptionError(
                        f"--inject-fault {fault}: rank {fault.rank} does not exist (world size {world})"
                    )
