"""The side channel's framing: one JSON object per line over a TCP socket, in both directions.

Ranks send state updates (`hello`, then batched `state` messages); the guard sends requests
(`stack`, `stop`). Plain sockets, so that the guard process never needs torch, and a hung process
group cannot take the channel down with it.

A line is bounded (`MAX_LINE`): a peer that sends more without a newline is cut off, and the
buffer is never copied whole on each read (a 300 MiB line would otherwise cost a core and its size
again in memory for every chunk).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
from typing import Any, Iterator

# The longest line either side accepts. A rank's batch of half a second of collectives, or the
# hashes of a large model's parameters, stay far below; the rank splits what would not.
MAX_LINE = 4 << 20
CHUNK = 1 << 16


def nonce() -> str:
    return secrets.token_hex(16)


def prove(secret: str, purpose: str, challenge: str) -> str:
    """HMAC-SHA256 of `purpose:challenge` under the run's secret: shows the secret without sending it.
    Ranks prove "rank" on the guard's challenge; the guard proves "guard" on the rank's."""
    return hmac.new(secret.encode(), f"{purpose}:{challenge}".encode(), hashlib.sha256).hexdigest()


def proves(secret: str, purpose: str, challenge: str, proof: str) -> bool:
    return hmac.compare_digest(prove(secret, purpose, challenge).encode(), proof.encode())


class ProtocolError(ValueError):
    """The peer broke the framing (a line too long, not JSON, not an object)."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), default=str).encode("utf-8") + b"\n"


class LineSplitter:
    """Bytes in, JSON objects out; raises ProtocolError on a line over `limit` or one that is not a
    JSON object."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.scanned = 0  # bytes of `buffer` already known to hold no newline

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self.buffer += chunk
        messages: list[dict[str, Any]] = []
        start = 0
        while True:
            end = self.buffer.find(b"\n", max(start, self.scanned))
            if end < 0:
                break
            line = bytes(self.buffer[start:end])
            start = end + 1
            if line.strip():
                messages.append(_decode(line, self.limit))
        if start:
            del self.buffer[:start]  # bytearray drops its head in place
        self.scanned = len(self.buffer)
        if self.scanned > self.limit:
            raise ProtocolError(f"a line longer than {self.limit} bytes")
        return messages


def _decode(line: bytes, limit: int) -> dict[str, Any]:
    if len(line) > limit:
        raise ProtocolError(f"a line longer than {limit} bytes")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        raise ProtocolError("a line that is not JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError("a JSON line that is not an object")
    return message


class LineReader:
    """A LineSplitter over a blocking socket (the rank's end)."""

    def __init__(self, sock: socket.socket, limit: int = MAX_LINE) -> None:
        self.sock = sock
        self.splitter = LineSplitter(limit)

        self.ready: list[dict[str, Any]] = []

    def read(self) -> Iterator[dict[str, Any]]:
        """Messages from one `recv` (or left over from `next`); raises ConnectionError when the peer
        has closed."""
        if not self.ready:
            chunk = self.sock.recv(CHUNK)
            if not chunk:
                raise ConnectionError("closed")
            self.ready = self.splitter.feed(chunk)
        taken, self.ready = self.ready, []
        yield from taken

    def next(self) -> dict[str, Any]:
        """The next message, waiting for it (within the socket's timeout)."""
        while not self.ready:
            chunk = self.sock.recv(CHUNK)
            if not chunk:
                raise ConnectionError("closed")
            self.ready = self.splitter.feed(chunk)
        return self.ready.pop(0)
