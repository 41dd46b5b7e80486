"""The side channel's server: one thread, one selector loop, every connection authenticated.

A plain TCP listener on the rendezvous host (loopback by default), separate from the job's own
process group and store, so that it keeps working when the job's collectives hang.

Who may talk: the server opens every connection with a challenge, and the connection's first line
must be a hello that proves the run's secret on it (an HMAC: the secret, handed to the ranks in
their environment and never on a command line, is never sent; compared in constant time); the
server proves the secret back on the rank's own challenge, so a rank never obeys an impostor. A rank's
hello fixes the job's world size if it is the first, and must name a rank below it that is not
already connected; another node's guard of the same job (same job identity, and the shared
secret when one is configured) may register the secret its own ranks carry. Until then a
connection may send one short line within a few seconds; there are a handful of such pending
connections at most (the oldest gives way), and one connection per rank. Every later message is
checked (schema.py). Anything else closes that connection and is said once as a guard warning on
stderr; the job and its diagnosis go on.
"""

from __future__ import annotations

import hmac
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from ddpdoctor.guard import schema
from ddpdoctor.guard.notices import Notices
from ddpdoctor.guard.wire import CHUNK, MAX_LINE, LineSplitter, ProtocolError, encode, nonce, prove, proves

if TYPE_CHECKING:
    from ddpdoctor.guard.doctor import Doctor

HELLO_LINE = 4096  # an unauthenticated peer's whole budget
HELLO_TIMEOUT_S = 5.0
MAX_PENDING = 16
SEND_TIMEOUT_S = 2.0
TICK_S = 0.2
# The kinds of guard warning that are a connection this server closed.
DROPPED = ("unauthenticated", "bad", "pending", "follower")


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    peer: str
    opened: float
    splitter: LineSplitter = field(default_factory=lambda: LineSplitter(HELLO_LINE))
    challenge: str = field(default_factory=nonce)
    rank: Optional[int] = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class SideChannel:
    def __init__(self, host: str, port: int, secret: str, job: str = "", followers: int = 0,
                 shared_secret: bool = False, notices: Optional[Notices] = None) -> None:
        self.listener = socket.create_server((host, port), reuse_port=False, backlog=128)
        self.listener.setblocking(False)
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self.secrets = [secret]
        self.job = job
        self.followers_left = followers
        self.shared_secret = shared_secret
        self.notices = notices or Notices()
        self.world_size: Optional[int] = None
        self.doctor: Optional["Doctor"] = None
        self.selector = selectors.DefaultSelector()
        self.pending: dict[socket.socket, _Connection] = {}  # insertion order: the oldest first
        self.ranks: dict[int, _Connection] = {}
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="ddpdoctor-guard-channel", daemon=True)
        self.selector.register(self.listener, selectors.EVENT_READ, None)

    def start(self, doctor: "Doctor") -> None:
        self.doctor = doctor
        self.thread.start()

    # ------------------------------------------------------------------ to the ranks

    def send(self, rank: int, message: dict[str, Any]) -> None:
        with self.lock:
            connection = self.ranks.get(rank)
        if connection is not None:
            self._write(connection, encode(message))

    def broadcast(self, message: dict[str, Any]) -> None:
        with self.lock:
            connections = list(self.ranks.values())
        data = encode(message)
        for connection in connections:
            self._write(connection, data)

    def connected(self) -> int:
        with self.lock:
            return len(self.ranks)

    @staticmethod
    def _write(connection: _Connection, data: bytes) -> None:
        with connection.lock:
            try:
                connection.sock.sendall(data)
            except OSError:
                pass  # the reader sees the connection end and drops it

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self.closing.is_set():
            try:
                events = self.selector.select(TICK_S)
            except (OSError, ValueError):
                return
            for key, _ in events:
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._readable(key.data)
            self._expire()

    def _accept(self) -> None:
        for _ in range(64):  # a burst, then back to the ranks already connected
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                self.notices.warn("accept", f"the side channel could not accept a connection ({error})")
                return
            sock.settimeout(SEND_TIMEOUT_S)
            connection = _Connection(sock, f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer),
                                     time.monotonic())
            while len(self.pending) >= MAX_PENDING:
                self._drop(next(iter(self.pending.values())), "pending",
                           "connections to the side channel that did not say hello in time were closed")
            self.pending[sock] = connection
            self.selector.register(sock, selectors.EVENT_READ, connection)
            self._write(connection, encode({"t": "challenge", "nonce": connection.challenge}))

    def _readable(self, connection: _Connection) -> None:
        try:
            chunk = connection.sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(connection)
            return
        try:
            for message in connection.splitter.feed(chunk):
                if connection.rank is None:
                    self._hello(connection, message)
                    if connection.sock.fileno() < 0:
                        return  # a follower's registration: answered and closed
                else:
                    self._ingest(connection.rank, schema.message(message, self.world_size or 1))
        except (ProtocolError, schema.BadMessage) as error:
            kind = "unauthenticated" if connection.rank is None else "bad"
            who = connection.peer if connection.rank is None else f"rank {connection.rank} ({connection.peer})"
            self._drop(connection, kind, f"dropped a side-channel connection from {who}: {error}")

    def _hello(self, connection: _Connection, message: dict[str, Any]) -> None:
        hello = schema.hello(message)
        if isinstance(hello, schema.FollowerHello):
            self._follower(connection, hello)
            return
        secret = next((known for known in self.secrets if proves(known, "rank", connection.challenge, hello.proof)),
                      None)
        if secret is None:
            raise schema.BadMessage("it did not prove the run's secret")
        with self.lock:
            if self.world_size is None:
                self.world_size = hello.world_size
            elif hello.world_size != self.world_size:
                raise schema.BadMessage(f"world size {hello.world_size} is not the job's {self.world_size}")
            if hello.rank in self.ranks:
                raise schema.BadMessage(f"rank {hello.rank} is already connected")
            self.ranks[hello.rank] = connection
        connection.rank = hello.rank
        connection.splitter.limit = MAX_LINE
        self.pending.pop(connection.sock, None)
        self._write(connection, encode({"t": "welcome", "proof": prove(secret, "guard", hello.nonce)}))
        self._call("join", hello)

    def _follower(self, connection: _Connection, hello: schema.FollowerHello) -> None:
        # Another node's guard: the same job, and the shared secret when one is configured.
        if not (self.job and hmac.compare_digest(hello.job.encode(), self.job.encode())):
            answer, why = "refused", "this side channel belongs to another job"
        elif self.shared_secret and not proves(self.secrets[0], "follower", connection.challenge, hello.proof):
            answer, why = "refused", "wrong secret"
        elif not self.shared_secret and len(hello.secret) < 16:
            answer, why = "refused", "no secret for its ranks"
        elif self.followers_left <= 0:
            answer, why = "refused", "the job has all its nodes"
        else:
            answer, why = "welcome", ""
            self.followers_left -= 1
            if hello.secret and hello.secret not in self.secrets:
                self.secrets.append(hello.secret)
        self._write(connection, encode({"t": answer, "why": why}))
        if answer == "refused":
            self.notices.warn("follower", f"refused another guard at {connection.peer}: {why}")
        self._close(connection)

    def _ingest(self, rank: int, message: dict[str, Any]) -> None:
        self._call("ingest", rank, message)

    def _call(self, method: str, *args: Any) -> None:
        doctor = self.doctor
        if doctor is None or doctor.broken:
            return
        try:
            getattr(doctor, method)(*args)
        except Exception as error:  # noqa: BLE001 - the guard's own bug: the job goes on undiagnosed
            doctor.fail(error)

    def _expire(self) -> None:
        now = time.monotonic()
        for connection in list(self.pending.values()):
            if now - connection.opened > HELLO_TIMEOUT_S:
                self._drop(connection, "pending",
                           "connections to the side channel that did not say hello in time were closed")

    def _drop(self, connection: _Connection, kind: str, text: str) -> None:
        self.notices.warn(kind, text)
        self._close(connection)

    def _close(self, connection: _Connection) -> None:
        self.pending.pop(connection.sock, None)
        try:
            self.selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        rank = connection.rank
        if rank is not None:
            with self.lock:
                if self.ranks.get(rank) is connection:
                    del self.ranks[rank]
            self._call("disconnected", rank)
        try:
            connection.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        self.notices.summary(DROPPED, "side-channel connections were refused or dropped")
        self.closing.set()
        if self.thread.is_alive():
            self.thread.join(timeout=2 * TICK_S + 1)
        for key in list(self.selector.get_map().values()):
            try:
                key.fileobj.close()  # type: ignore[union-attr]
            except OSError:
                pass
        self.selector.close()

