"""Where the probe's stores listen, and whether a rendezvous endpoint answers at all.

c10d's TCPStore server listens on every interface whatever host name it is given, so the probe's
rendezvous and the agent's store would be reachable from the whole network while the probe runs.
Here each server gets a socket we bound ourselves (TCPStore's `master_listen_fd`): on loopback by
default, on the address that --master-addr or --rdzv-endpoint names otherwise.

A follower node whose rendezvous endpoint never answers would otherwise wait in the store's own
retries (with growing back-off, and C++ stack frames on stderr for each try) for about twice the
join timeout; `wait_for_endpoint` asks with plain connects, within the join timeout, first.

No torch at import time.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any, Callable, Iterator, Optional

from ddpdoctor.probe.options import OptionError, parse_endpoint, resolve_local_address

LOOPBACK = "127.0.0.1"
_LISTEN_BACKLOG = 2048


def listening_socket(addr: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(_LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {addr}:{port} ({exc.strerror}): another job on this port? "
                                 "Choose another port, or 0 for a free one") from None
    return sock


def bound_store(addr: str, port: int, **kwargs: Any) -> Any:
    """A TCPStore server listening on `addr` only (port 0: a free one)."""
    import torch.distributed as dist

    sock = listening_socket(addr, port)
    try:
        store = dist.TCPStore(addr, int(sock.getsockname()[1]), is_master=True, master_listen_fd=sock.fileno(), **kwargs)
    except BaseException:
        sock.close()
        raise
    # The store listens on this very descriptor from now on: hand it over, never close it here.
    sock.detach()
    return store


def bind_address(master_addr: str, nnodes: int, rdzv_endpoint: Optional[str]) -> Optional[str]:
    """The address the stores this node hosts listen on: --master-addr on one node (loopback by
    default); on several, the host --rdzv-endpoint names when it is an address of this machine.
    None when it is not (a follower node hosts no rendezvous), which keeps torch's own choice."""
    if nnodes == 1 or not rdzv_endpoint:
        return resolve_local_address(master_addr)
    host, _port = parse_endpoint(rdzv_endpoint)
    try:
        return resolve_local_address(host)
    except OptionError:
        return None


@contextlib.contextmanager
def stores_bound_to(addr: Optional[str]) -> Iterator[None]:
    """For the duration of a launch, the servers torch elastic starts in this process (the c10d
    rendezvous's store and the agent's store the ranks bootstrap from) listen on `addr` only."""
    if addr is None:
        yield
        return
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

    original_store = backend.TCPStore
    original_server = dynamic.DynamicRendezvousHandler._create_tcp_store_server

    def rendezvous_store(host: str, port: int, is_master: bool = False, **kwargs: Any) -> Any:
        if not is_master:
            return original_store(host, port, is_master=False, **kwargs)
        return bound_store(addr, port, **kwargs)

    def agent_store_server(self: Any, master_addr: str, master_port: int) -> Any:
        return bound_store(addr, int(master_port), multi_tenant=True)

    setattr(backend, "TCPStore", rendezvous_store)
    setattr(dynamic.DynamicRendezvousHandler, "_create_tcp_store_server", agent_store_server)
    try:
        yield
    finally:
        setattr(backend, "TCPStore", original_store)
        setattr(dynamic.DynamicRendezvousHandler, "_create_tcp_store_server", original_server)


class Unreachable(Exception):
    """The rendezvous endpoint did not answer within the join timeout."""


def wait_for_endpoint(endpoint: str, join_timeout: float, note: Optional[Callable[[str], None]] = None,
                      poll_s: float = 0.25) -> None:
    """Return once something accepts connections at `endpoint`; raise Unreachable after
    `join_timeout` seconds (node 0 may start after us: until then, refused is retried)."""
    host, port = parse_endpoint(endpoint)
    deadline = time.monotonic() + join_timeout
    last = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            with socket.create_connection((host, port), timeout=min(3.0, max(0.1, left))):
                return
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
            if note is not None:
                note(f"rendezvous {endpoint}: {last}; retrying for {max(0.0, deadline - time.monotonic()):.0f}s")
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    raise Unreachable(
        f"rendezvous endpoint {endpoint} did not answer within --join-timeout {join_timeout:g}s ({last}): "
        "start node 0 (--node-rank 0) with the same --rdzv-endpoint, or check the address, port and firewall"
    )


__all__ = ["LOOPBACK", "Unreachable", "bind_address", "bound_store", "stores_bound_to", "wait_for_endpoint"]
