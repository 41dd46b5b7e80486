"""A hostile local client against the guard's side channel, during a real 2-rank gloo job.

It sends garbage, hellos without a proof of the run's secret or with a wrong one, forged ranks and world sizes, a line of a
few MiB, a thousand short connections and a crowd of idle ones. The job must finish with its own
output and status, its one planted finding (GRD003: rank 1 updates a buffer alone) and nothing else, the guard's memory
and threads must stay bounded, the guard's warnings must be few, and no process may be left."""

from __future__ import annotations

import json
import re
import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.guard.wire import LineReader, prove
from guard_helpers import assert_no_leftovers, finish, marked_processes, planted, start_guard

pytestmark = pytest.mark.slow
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
HELLO_TIMEOUT_S = 5.0  # the server's; every refused connection must be closed within it


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)


def rank_environment(mark: str, timeout: float = 90) -> dict[str, str]:
    """The environment of a rank of the run, once one runs (what a same-user process could read)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in marked_processes(mark):
            env = _environ(pid)
            if "LOCAL_RANK" in env and "DDPDOCTOR_GUARD" in env:
                return env
        time.sleep(0.2)
    raise AssertionError("no rank started")


def status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def sockets_of(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def closed_by_server(sock: socket.socket, timeout: float = HELLO_TIMEOUT_S + 2) -> tuple[bool, bytes]:
    """Whether the guard closed this connection in time, and what it said before."""
    sock.settimeout(timeout)
    said = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return True, said
            said += chunk
    except (ConnectionResetError, BrokenPipeError):
        return True, said
    except socket.timeout:
        return False, said


def attempt(address: tuple[str, int], *lines: Any, secret: str = "") -> tuple[bool, bytes]:
    """Send `lines` (a hello with its proof of `secret` on the guard's challenge, when one is given);
    whether the guard closed the connection in time, and what it said."""
    with socket.create_connection(address, timeout=5) as sock:
        challenge = LineReader(sock).next()["nonce"]
        try:
            for line in lines:
                if isinstance(line, dict) and line.get("t") == "hello" and secret:
                    line = {**line, "nonce": "n", "proof": prove(secret, "rank", challenge)}
                sock.sendall(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")
        except (ConnectionResetError, BrokenPipeError):
            return True, b""
        return closed_by_server(sock)


def test_a_hostile_client_cannot_forge_hide_or_stop_anything() -> None:
    mark = uuid.uuid4().hex
    command = ["env", "STEPS=150", TORCHRUN, "--standalone", "--nproc-per-node", "2", "fixtures/guard/long_run.py"]
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        started = time.monotonic()
        guard = start_guard(["--every", "4", "--stall-timeout", "5"], command, mark, report)
        options = json.loads(rank_environment(mark)["DDPDOCTOR_GUARD"])
        address, secret = (options["host"], options["port"]), options["secret"]
        time.sleep(2)  # both ranks connected
        rss_before = status(guard.pid, "VmRSS")
        forged_local = {"t": "state", "progress": 1, "inflight": None, "local": [
            {"code": "GRD003", "message": "\x1b[2J\x1b[31mforged", "path": "/etc/passwd", "line": 1}]}
        refused = [
            attempt(address, b"\x00\xff garbage that is not JSON\n"),
            attempt(address, b"[1, 2, 3]\n"),
            attempt(address, forged_local),  # a state message without a hello
            attempt(address, {"t": "hello", "rank": 0, "world_size": 2}),  # no proof
            attempt(address, {"t": "hello", "rank": 0, "world_size": 2, "secret": secret}),  # the secret, not a proof
            attempt(address, {"t": "hello", "rank": 4, "world_size": 2}, secret="guess"),
            attempt(address, {"t": "hello", "rank": 1, "world_size": 2}, secret=secret[:-1] + "x"),
            attempt(address, {"t": "hello", "rank": "0", "world_size": 10 ** 15}, secret=secret),
            # Even with the secret (as the job's own user could read it): a world size that is not the
            # job's, a rank that is connected already.
            attempt(address, {"t": "hello", "rank": 5, "world_size": 7}, secret=secret),
            attempt(address, {"t": "hello", "rank": 0, "world_size": 2}, forged_local, secret=secret),
            attempt(address, b"x" * (6 << 20)),  # 6 MiB without a newline
        ]
        assert all(closed for closed, _ in refused), refused
        # Another guard's registration for another job is answered, refused, and closed.
        closed, said = attempt(address, {"t": "follower", "secret": "guess-guess-guess", "job": "other"})
        assert closed and json.loads(said) == {"t": "refused", "why": "this side channel belongs to another job"}
        # A thousand connections, closed at once; then a crowd of idle ones the guard must not keep.
        for _ in range(1000):
            socket.create_connection(address, timeout=5).close()
        idle = [socket.create_connection(address, timeout=5) for _ in range(200)]
        time.sleep(1)
        held = sockets_of(guard.pid)
        threads = status(guard.pid, "Threads")
        assert all(closed_by_server(sock)[0] for sock in idle)
        for sock in idle:
            sock.close()
        rss_after = status(guard.pid, "VmRSS")
        result = finish(guard, report, started)
    assert_no_leftovers(mark)
    # One connection per rank plus a few: the listener, two ranks, the pending ones it keeps.
    assert held <= 2 + 1 + 16 + 2, held
    assert threads <= 4, threads
    assert rss_after - rss_before < 32 * 1024, (rss_before, rss_after)  # KiB
    # The job: its own output and status, its planted finding and nothing else.
    assert result.returncode == 1, result.stderr[-3000:]
    # Both ranks' lines, each whole; the two ranks write the same pipe at once, so one's text and the
    # other's newline may interleave ("rank 0 trainedrank 1 trained\n\n"): compare the lines' words.
    assert sorted(re.findall(r"rank \d trained", result.stdout)) == ["rank 0 trained", "rank 1 trained"]
    assert result.stdout.replace("rank 0 trained", "").replace("rank 1 trained", "").strip() == ""
    (diverged,) = result.report["findings"]
    # Two ranks: a tie, so both are named (the planted update is on rank 1).
    assert diverged["code"] == "GRD003" and diverged["ranks"] == [0, 1]
    assert "'seen' on ranks 0, 1 differs from each other" in diverged["message"]
    assert (diverged["path"], diverged["line"]) == ("fixtures/guard/long_run.py", planted("long_run.py", "GRD003"))
    assert result.report["world_size"] == 2
    # The guard said what it dropped, once per kind, escaped; no finding, no internal error.
    warnings = [line for line in result.stderr.splitlines() if line.startswith("ddpdoctor guard: warning:")]
    assert 1 <= len(warnings) <= 4, warnings
    assert "\x1b" not in result.stderr and "forged" not in result.stderr and "/etc/passwd" not in result.stderr
    assert "internal error" not in result.stderr and "GRD" not in "".join(warnings)
