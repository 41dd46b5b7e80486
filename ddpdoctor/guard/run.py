"""Run the user's launch command under the guard, and make sure nothing of it outlives the run.

The command starts in a session of its own, with the bootstrap directory heading PYTHONPATH and the
side channel's address in DDPDOCTOR_GUARD; every process it starts inherits both. Ctrl-C and
SIGTERM are passed on to the whole session. When the doctor asks for a stop (a stalled rank), each
rank is told to exit through the side channel (that reaches other nodes too) and the local session
gets SIGTERM, then SIGKILL. After the command ends, anything still in its session is killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any, Callable, Optional, Sequence

from ddpdoctor.findings import Finding
from ddpdoctor.guard.doctor import Doctor
from ddpdoctor.guard.launch_args import DEFAULT_HOST, AddressError, multinode_store, parse_address
from ddpdoctor.guard.options import ACTIVE_ENV, ENV, GuardOptions
from ddpdoctor.guard.server import SideChannel
from ddpdoctor.procfs import session_members

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
TICK_S = 0.25
KILL_GRACE_S = 5.0


class UsageError(Exception):
    """Bad input: one line for the user, exit 2."""


@dataclass
class GuardRun:
    command: list[str]
    exit_code: int
    world_size: int
    findings: list[Finding] = field(default_factory=list)
    stopped: bool = False
    # "host": this guard diagnosed the job; "follower": another node's guard did.
    role: str = "host"
    store: str = ""


def resolve(command: Sequence[str]) -> list[str]:
    if not command:
        raise UsageError("no command to guard: put it after '--', e.g. ddpdoctor guard -- torchrun "
                         "--nproc-per-node 2 train.py")
    program = command[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise UsageError(f"command not found or not executable: {program}")
    elif shutil.which(program) is None:
        raise UsageError(f"command not found: {program}")
    return list(command)


def guard_env(options: GuardOptions, base: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOTSTRAP_DIR, env.get("PYTHONPATH", "")) if p)
    env[ENV] = options.to_env()
    env.pop(ACTIVE_ENV, None)
    return env


def _open_channel(options: GuardOptions, command: Sequence[str], store: Optional[str]) -> tuple[Optional[SideChannel], str, int]:
    try:
        explicit = parse_address(store) if store else None
    except AddressError as error:
        raise UsageError(f"--store: {error}") from None
    derived = explicit or multinode_store(command)
    host, port = derived or (options.host or DEFAULT_HOST, options.port)
    try:
        return SideChannel(host, port), host, port
    except OSError as error:
        if derived is None:
            raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
        # Another node's guard already listens there (or the address is not this machine's).
        return None, host, port


def run(command: Sequence[str], options: GuardOptions, on_finding: Callable[[Finding], None],
        store: Optional[str] = None, stdout_to_stderr: bool = False) -> GuardRun:
    command = resolve(command)
    channel, host, port = _open_channel(options, command, store)
    doctor: Optional[Doctor] = None
    if channel is not None:
        port = channel.address[1]
        doctor = Doctor(replace(options, host=host, port=port), channel.send, on_finding)
        channel.start(doctor)
    options = replace(options, host=host, port=port)
    try:
        process = subprocess.Popen(command, env=guard_env(options), start_new_session=True,
                                   stdout=sys.stderr.fileno() if stdout_to_stderr else None)
    except OSError as error:
        if channel is not None:
            channel.close()
        raise UsageError(f"cannot run {command[0]}: {error.strerror or error}") from None
    outcome = GuardRun(command=command, exit_code=0, world_size=0, role="host" if doctor else "follower",
                       store=f"{host}:{port}")
    saved = _forward_signals(process.pid)
    try:
        code = _supervise(process, doctor, channel, outcome)
    finally:
        _restore_signals(saved)
        _kill_session(process.pid)
    if doctor is not None and channel is not None:
        _drain(channel)
        doctor.tick(final=True)
        channel.close()
        outcome.findings = list(doctor.findings)
        outcome.world_size = doctor.world_size
    if outcome.stopped:
        outcome.exit_code = 1
    elif code != 0:
        outcome.exit_code = 128 - code if code < 0 else code
    else:
        outcome.exit_code = 1 if outcome.findings else 0
    return outcome


def _supervise(process: "subprocess.Popen[bytes]", doctor: Optional[Doctor], channel: Optional[SideChannel],
               outcome: GuardRun) -> int:
    stop_sent: Optional[float] = None
    while True:
        try:
            return process.wait(timeout=TICK_S)
        except subprocess.TimeoutExpired:
            pass
        if doctor is None or channel is None:
            continue
        doctor.tick()
        if doctor.stop_requested and stop_sent is None:
            # The ranks exit first, so that the launcher sees failed workers and ends the way it
            # always does; then the session is signalled, SIGTERM and at last SIGKILL.
            outcome.stopped = True
            stop_sent = time.monotonic()
            channel.broadcast({"t": "stop", "why": doctor.stop_requested})
        elif stop_sent is not None:
            waited = time.monotonic() - stop_sent
            _signal_session(process.pid, signal.SIGKILL if waited > 2 * KILL_GRACE_S else
                            signal.SIGTERM if waited > KILL_GRACE_S else 0)


def _drain(channel: SideChannel, seconds: float = 2.0) -> None:
    """Let the ranks' last messages (sent as they exit) arrive before the final diagnosis."""
    deadline = time.monotonic() + seconds
    while channel.connected() and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_session(pgid: int, signum: int) -> None:
    if not signum:
        return
    try:
        os.killpg(pgid, signum)
    except OSError:
        pass
    for pid in session_members(pgid):  # those that moved to another process group of the session
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def _kill_session(sid: int) -> None:
    left = session_members(sid)
    if not left:
        return
    _signal_session(sid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _forward_signals(pgid: int) -> dict[int, Any]:
    saved: dict[int, Any] = {}

    def forward(signum: int, frame: Optional[FrameType]) -> None:
        _signal_session(pgid, signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            saved[signum] = signal.signal(signum, forward)
        except (ValueError, OSError):  # not the main thread
            pass
    return saved


def _restore_signals(saved: dict[int, Any]) -> None:
    for signum, handler in saved.items():
        signal.signal(signum, handler)
