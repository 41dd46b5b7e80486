"""The side channel's framing: one JSON object per line over a TCP socket, in both directions.

Ranks send state updates (`hello`, then batched `state` messages); the guard sends requests
(`stack`, `stop`). Plain sockets, so that the guard process never needs torch, and a hung process
group cannot take the channel down with it.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Iterator


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), default=str).encode("utf-8") + b"\n"


class LineReader:
    """Splits a byte stream into JSON messages; tolerates partial reads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def read(self) -> Iterator[dict[str, Any]]:
        """Messages from one `recv`; raises ConnectionError when the peer has closed."""
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("closed")
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                yield message
