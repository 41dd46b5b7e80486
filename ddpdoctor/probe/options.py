"""Probe options and their validation. No torch here: bad options must fail fast, in one line."""

from __future__ import annotations

import ipaddress
import math
import os
import socket
import threading
from dataclasses import dataclass
from typing import Optional

from ddpdoctor.probe.faults import FAULT_KINDS, FaultError, FaultSpec, parse_faults
from ddpdoctor.probe.registry import FRAMEWORKS, TORCH, default_names_for, detector, names_for

__all__ = ["FAULT_KINDS", "FaultSpec", "OptionError", "ProbeOptions", "parse_checks", "parse_endpoint", "parse_faults_option"]

# More local ranks than this per CPU core is a typo, not a test (`--nproc 10000` would fork ten thousand
# processes); --force allows it.
MAX_RANKS_PER_CORE = 8

# How long the resolver may take for --master-addr before we say so (it is a local lookup for the
# names people use: localhost, this host's name, an address).
RESOLVE_LIMIT_S = 5.0


class OptionError(ValueError):
    """A bad option; reported as one line and exit status 2."""


def parse_faults_option(texts: "list[str] | tuple[str, ...]") -> tuple[FaultSpec, ...]:
    try:
        return parse_faults(texts)
    except FaultError as exc:
        raise OptionError(str(exc)) from None


def parse_checks(text: Optional[str], framework: str = TORCH, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The checks to run, in the registry's order: --checks (default: all but those run only on
    request) plus `extra` (e.g. --links)."""
    known = names_for(framework)
    wanted = [t.strip() for t in text.split(",") if t.strip()] if text else list(default_names_for(framework))
    wanted += [name for name in extra if name not in wanted]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise OptionError(f"--checks: unknown check(s) {', '.join(unknown)} for --framework {framework}; known: {', '.join(known)}")
    # Keep the canonical order whatever order the user typed.
    return tuple(name for name in known if name in wanted)


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


_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
               "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
# The link map's message: at least one float32, at most what fits any GPU comfortably twice.
MIN_LINK_BYTES, MAX_LINK_BYTES = 4, 4 << 30


def parse_size(option: str, text: str) -> int:
    """"64K", "1M", "4096" -> bytes (binary units, as nccl-tests' -b/-e take them)."""
    stripped = text.strip().upper()
    number = stripped.rstrip("BKMGI")
    unit = stripped[len(number):]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (ValueError, KeyError):
        raise OptionError(f"{option} expects a size such as 4096, 64K or 1M; got {text!r}") from None
    if not MIN_LINK_BYTES <= value <= MAX_LINK_BYTES:
        raise OptionError(f"{option} {text}: must be between {MIN_LINK_BYTES} bytes and {MAX_LINK_BYTES >> 30} GiB")
    return int(value)


def _seconds(name: str, value: float) -> None:
    if math.isnan(value) or math.isinf(value) or value <= 0:
        raise OptionError(f"{name} must be a finite number of seconds > 0; got {value:g}")


def resolve_local_address(addr: str, limit_s: float = RESOLVE_LIMIT_S) -> str:
    """The numeric address `addr` names, checked to be an address of this machine (one the
    rendezvous can bind); OptionError at once otherwise, instead of a launch that waits out its
    join timeout."""
    try:
        numeric = str(ipaddress.ip_address(addr.strip("[]")))
    except ValueError:
        numeric = _resolve(addr, limit_s)
    family = socket.AF_INET6 if ":" in numeric else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((numeric, 0))
    except OSError as exc:
        raise OptionError(
            f"--master-addr {addr}: {numeric} is not an address of this machine ({exc.strerror or exc}); "
            "for a single node use 127.0.0.1, for several nodes use --rdzv-endpoint"
        ) from None
    return numeric


def _resolve(addr: str, limit_s: float) -> str:
    found: list[str] = []
    failure: list[str] = []

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
            found.extend(str(info[4][0]) for info in infos)
        except (OSError, UnicodeError) as exc:
            failure.append(str(getattr(exc, "strerror", None) or exc))

    # A daemon thread, so that a resolver stuck on an unreachable DNS server cannot hold us.
    worker = threading.Thread(target=lookup, name="ddpdoctor-resolve", daemon=True)
    worker.start()
    worker.join(limit_s)
    if failure or (not found and not worker.is_alive()):
        raise OptionError(f"--master-addr {addr!r} does not resolve ({failure[0] if failure else 'no address'})")
    if not found:
        raise OptionError(f"--master-addr {addr!r}: no answer from the resolver within {limit_s:g}s")
    return found[0]


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass
class ProbeOptions:
    nproc: Optional[int] = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: Optional[str] = None
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    framework: str = TORCH
    backend: str = "auto"
    device: str = "auto"
    timeout: float = 5.0
    join_timeout: float = 60.0
    faults: tuple[FaultSpec, ...] = ()
    checks: tuple[str, ...] = default_names_for(TORCH)
    output_format: str = "text"
    run_id: Optional[str] = None
    force: bool = False
    link_bytes: int = 0

    def validate(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise OptionError(f"--framework must be one of {', '.join(FRAMEWORKS)}")
        if self.nproc is not None and self.nproc < 1:
            raise OptionError("--nproc must be >= 1")
        if self.nproc is not None and not self.force and self.nproc > MAX_RANKS_PER_CORE * cpu_count():
            raise OptionError(
                f"--nproc {self.nproc} is more than {MAX_RANKS_PER_CORE} ranks per CPU core on this machine "
                f"({cpu_count()} cores, at most {MAX_RANKS_PER_CORE * cpu_count()}); pass --force to start them anyway"
            )
        if self.nnodes < 1:
            raise OptionError("--nnodes must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise OptionError(f"--node-rank must be in [0, {self.nnodes - 1}]")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise OptionError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        if self.framework != TORCH and (self.nnodes > 1 or self.rdzv_endpoint):
            raise OptionError("--framework horovod runs on one node here; for several nodes run "
                              "`horovodrun -np N -H ... python -m ddpdoctor.probe --framework horovod`")
        if self.rdzv_endpoint:
            parse_endpoint(self.rdzv_endpoint)
        if not 0 <= self.master_port <= 65535:
            raise OptionError("--master-port out of range")
        _seconds("--timeout", self.timeout)
        _seconds("--join-timeout", self.join_timeout)
        if self.backend not in ("auto", "nccl", "gloo"):
            raise OptionError("--backend must be auto, nccl or gloo")
        if self.device not in ("auto", "cuda", "cpu"):
            raise OptionError("--device must be auto, cuda or cpu")
        known = names_for(self.framework)
        unknown = [c for c in self.checks if c not in known]
        if unknown:
            raise OptionError(f"--checks: unknown check(s) {', '.join(unknown)} for --framework {self.framework}; known: {', '.join(known)}")
        for fault in self.faults:
            try:
                catcher = detector(self.framework, fault.kind).name
            except KeyError:
                raise OptionError(f"--inject-fault {fault}: no --framework {self.framework} check catches {fault.kind}") from None
            if catcher not in self.checks:
                how = "--links" if catcher == "links" else f"--checks with {catcher}"
                raise OptionError(f"--inject-fault {fault}: {fault.kind} is caught by the {catcher} check, "
                                  f"which this run does not include ({how})")
        if self.nproc is not None:
            world = self.nproc * self.nnodes
            for fault in self.faults:
                for rank in fault.ranks:
                    if rank >= world:
                        raise OptionError(
                            f"--inject-fault {fault}: rank {rank} does not exist (world size {world})"
                        )

    def oversubscription(self) -> float:
        """Local ranks per CPU core, when there are more ranks than cores (else 1.0)."""
        if self.nproc is None:
            return 1.0
        return max(1.0, self.nproc / cpu_count())
