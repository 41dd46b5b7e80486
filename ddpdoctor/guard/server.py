"""The side channel's server in the `guard` process: one thread accepts, one thread per rank reads.

A plain TCP listener on the rendezvous host (loopback by default), separate from the job's own
process group and store, so that it keeps working when the job's collectives hang.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Optional

from ddpdoctor.guard.doctor import Doctor
from ddpdoctor.guard.wire import LineReader, encode


class SideChannel:
    def __init__(self, host: str, port: int) -> None:
        self.listener = socket.create_server((host, port), reuse_port=False)
        self.listener.settimeout(0.2)
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self.doctor: Optional[Doctor] = None
        self.connections: dict[int, socket.socket] = {}
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="ddpdoctor-guard-accept", daemon=True)

    def start(self, doctor: Doctor) -> None:
        self.doctor = doctor
        self.thread.start()

    def send(self, rank: int, message: dict[str, Any]) -> None:
        with self.lock:
            sock = self.connections.get(rank)
        if sock is None:
            return
        try:
            sock.sendall(encode(message))
        except OSError:
            pass

    def broadcast(self, message: dict[str, Any]) -> None:
        with self.lock:
            ranks = list(self.connections)
        for rank in ranks:
            self.send(rank, message)

    def connected(self) -> int:
        with self.lock:
            return len(self.connections)

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._read, args=(sock,), name="ddpdoctor-guard-rank", daemon=True).start()

    def _read(self, sock: socket.socket) -> None:
        assert self.doctor is not None
        reader = LineReader(sock)
        rank: Optional[int] = None
        try:
            while True:
                for message in reader.read():
                    if rank is None:
                        if message.get("t") != "hello":
                            return
                        rank = int(message["rank"])
                        with self.lock:
                            self.connections[rank] = sock
                    self.doctor.ingest(rank, message)
        except (OSError, ConnectionError, ValueError, KeyError):
            pass
        finally:
            if rank is not None:
                with self.lock:
                    if self.connections.get(rank) is sock:
                        del self.connections[rank]
                self.doctor.disconnected(rank)
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        self.closing.set()
        try:
            self.listener.close()
        except OSError:
            pass
        with self.lock:
            socks = list(self.connections.values())
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
