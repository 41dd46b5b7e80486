"""What the guard reads from the user's launch command: only where the side channel should live.

On one node the guard listens on an ephemeral loopback port. When the command is a multi-node
torchrun (`--nnodes 2` or `2:4`), every node's guard derives the same address from the rendezvous
endpoint the job already uses: its host, and the port right after the rendezvous port. The node
whose guard can listen there (node 0, which hosts the rendezvous) diagnoses the whole job; the
others point their ranks at it.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

DEFAULT_HOST = "127.0.0.1"


class AddressError(ValueError):
    pass


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise AddressError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def launcher_options(command: Sequence[str]) -> dict[str, str]:
    """torchrun's `--name value` / `--name=value` options (with `_` spelled `-`), up to the script.

    Empty for anything but torchrun or `python -m torch.distributed.run|launch`.
    """
    program = os.path.basename(command[0]) if command else ""
    if program == "torchrun":
        index = 1
    elif program.startswith("python") and list(command[1:3]) in (["-m", "torch.distributed.run"],
                                                                 ["-m", "torch.distributed.launch"]):
        index = 3
    else:
        return {}
    found: dict[str, str] = {}
    while index < len(command):
        token = command[index]
        if not token.startswith("-"):
            break  # the training script: its own options are not the launcher's
        name, eq, value = token.lstrip("-").partition("=")
        name = name.replace("_", "-")
        if not eq and index + 1 < len(command) and not command[index + 1].startswith("-"):
            value = command[index + 1]
            index += 1
        found[name] = value
        index += 1
    return found


def multinode_store(command: Sequence[str]) -> Optional[tuple[str, int]]:
    """The side channel's address for a multi-node torchrun command, else None."""
    options = launcher_options(command)
    nnodes = options.get("nnodes", "1")
    most = nnodes.rpartition(":")[2]
    if not most.isdigit() or int(most) <= 1:
        return None
    endpoint = options.get("rdzv-endpoint")
    if endpoint:
        if ":" not in endpoint:
            endpoint += ":29400"  # torchrun's default rendezvous port
        host, port = parse_address(endpoint)
        if port > 65534:
            raise AddressError(f"no port after {endpoint!r} for the side channel")
        return host, port + 1
    if "master-addr" in options:
        master_port = options.get("master-port", "29500")
        if not master_port.isdigit() or int(master_port) > 65534:
            raise AddressError(f"expected a port after --master-port, got {master_port!r}")
        return options["master-addr"], int(master_port) + 1
    return None


# Nodes a job may have when nothing says how many: the bound on the other guards one host accepts.
MAX_NODES = 64


def job_identity(command: Sequence[str], environ: Optional[dict[str, str]] = None) -> tuple[str, int]:
    """What names this job to the other nodes' guards, and how many nodes it may have.

    DDPDOCTOR_GUARD_JOB when the user set it (on every node); else a multi-node torchrun's
    rendezvous (endpoint and id, as every node's command repeats them); else ("", 1): a one-node job,
    which no other guard may join.
    """
    from ddpdoctor.guard.options import JOB_ENV

    options = launcher_options(command)
    most = options.get("nnodes", "1").rpartition(":")[2]
    nodes = min(int(most), MAX_NODES) if most.isdigit() and int(most) > 0 else 1
    given = (os.environ if environ is None else environ).get(JOB_ENV, "")
    if given:
        return given, nodes if nodes > 1 else MAX_NODES
    store = multinode_store(command)
    if store is None:
        return "", 1
    run_id = options.get("rdzv-id") or options.get("run-id") or "none"
    return f"torchrun {store[0]}:{store[1]} {run_id}", nodes
