"""Run the user's launch command under the guard, and make sure nothing of it outlives the run.

The command starts in a session of its own, with the bootstrap directory heading PYTHONPATH and the
side channel's address and the run's secret in DDPDOCTOR_GUARD; every process it starts inherits
both. The guard is a child subreaper, so that every process of the job stays below it (reaper.py),
and a supervisor process stops the job if the guard itself is killed. Ctrl-C and SIGTERM are passed
on to every process of the job; when the doctor asks for a stop (a stalled rank), each rank is told
to exit through the side channel (that reaches other nodes too), then every local process gets
SIGTERM, and SIGKILL after the launcher's own grace. After the command ends, anything left of it is
stopped the same way.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import IO, Any, Callable, Optional, Sequence

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.guard import reaper
from ddpdoctor.guard.doctor import Doctor
from ddpdoctor.guard.launch_args import DEFAULT_HOST, AddressError, job_identity, multinode_store, parse_address
from ddpdoctor.guard.notices import Notices
from ddpdoctor.guard.options import ACTIVE_ENV, ENV, SECRET_ENV, GuardOptions
from ddpdoctor.guard.server import SideChannel
from ddpdoctor.guard.timeline import Timeline
from ddpdoctor.guard.wire import LineReader, ProtocolError, encode, prove

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
TICK_S = 0.25
# After the ranks were told to stop through the side channel, how long before they are signalled.
STOP_ASKED_S = 5.0
# How long a node's guard waits for node 0's guard to answer at the shared address.
FOLLOW_WAIT_S = 30.0


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
    # What the guard watched (Doctor.summary); empty where another node's guard diagnosed.
    summary: dict[str, int] = field(default_factory=dict)
    # Step times and collectives for --html; None where another node's guard diagnosed.
    timeline: Optional[Timeline] = None


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
    env.pop(SECRET_ENV, None)  # the ranks read it from DDPDOCTOR_GUARD
    return env


def _open_channel(options: GuardOptions, command: Sequence[str], store: Optional[str],
                  notices: Notices) -> tuple[Optional[SideChannel], str, int, str]:
    """The side channel this guard hosts, or None when another node's guard of the same job does;
    returns the channel, its address and the secret the ranks must carry."""
    try:
        explicit = parse_address(store) if store else None
    except AddressError as error:
        raise UsageError(f"--store: {error}") from None
    try:
        derived = explicit or multinode_store(command)
        job, nodes = job_identity(command)
    except AddressError as error:
        raise UsageError(f"the launch command's rendezvous: {error}") from None
    host, port = derived or (options.host or DEFAULT_HOST, options.port)
    shared = os.environ.get(SECRET_ENV, "")
    secret = shared or secrets.token_hex(16)
    try:
        channel = SideChannel(host, port, secret, job=job, followers=nodes - 1, shared_secret=bool(shared),
                              notices=notices)
        return channel, host, port, secret
    except OSError as error:
        if derived is None:
            raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
        reason = error.strerror or str(error)
    # Another guard listens there: node 0's guard of this job (then this one follows it), or
    # another job's (then this guard must not join it).
    _follow(host, port, secret, job, bool(shared), reason)
    return None, host, port, secret


def _follow(host: str, port: int, secret: str, job: str, shared: bool, reason: str) -> None:
    deadline = time.monotonic() + (FOLLOW_WAIT_S if job else 2.0)
    while True:
        try:
            answer = _ask_host(host, port, secret, job, shared)
            break
        except (OSError, ProtocolError) as error:
            if time.monotonic() > deadline:
                raise UsageError(f"cannot listen on {host}:{port} ({reason}), and no guard of this job answers "
                                 f"there ({getattr(error, 'strerror', None) or error})") from None
            time.sleep(0.5)
    if answer.get("t") != "welcome":
        why = answer.get("why") if isinstance(answer.get("why"), str) else "refused"
        raise UsageError(f"--store {host}:{port} is held by another guard: {why}"[:300])


def _ask_host(host: str, port: int, secret: str, job: str, shared: bool) -> dict[str, Any]:
    """Register with node 0's guard: the job's identity, and the shared secret's proof (or, without
    one, the secret this node's ranks will prove)."""
    with socket.create_connection((host, port), timeout=5) as sock:
        reader = LineReader(sock, limit=4096)
        challenge = reader.next()
        hello = {"t": "follower", "job": job, "proof": prove(secret, "follower", str(challenge.get("nonce")))}
        if not shared:
            hello["secret"] = secret
        sock.sendall(encode(hello))
        return reader.next()


# --fail-on: the severities that turn a successful job's exit status into 1.
FAIL_ON = {"error": {Severity.ERROR}, "warning": {Severity.ERROR, Severity.WARNING},
           "info": {Severity.ERROR, Severity.WARNING, Severity.INFO}, "never": set()}


def run(command: Sequence[str], options: GuardOptions, on_finding: Callable[[Finding], None],
        store: Optional[str] = None, stdout_to_stderr: bool = False, notices: Optional[Notices] = None,
        fail_on: str = "warning") -> GuardRun:
    command = resolve(command)
    notices = notices or Notices()
    channel, host, port, secret = _open_channel(options, command, store, notices)
    doctor: Optional[Doctor] = None
    if channel is not None:
        port = channel.address[1]
        doctor = Doctor(replace(options, host=host, port=port), channel.send, on_finding, notices=notices)
        channel.start(doctor)
    options = replace(options, host=host, port=port, secret=secret)
    reaper.become_subreaper()
    supervisor = _start_supervisor()
    job = reaper.Job(os.getpid(), exclude={supervisor.pid} if supervisor else set())
    try:
        process = subprocess.Popen(command, env=guard_env(options), start_new_session=True,
                                   stdout=sys.stderr.fileno() if stdout_to_stderr else None)
    except OSError as error:
        if channel is not None:
            channel.close()
        _release_supervisor(supervisor)
        raise UsageError(f"cannot run {command[0]}: {error.strerror or error}") from None
    _tell(supervisor, f"launcher {process.pid}")
    job.refresh()  # the launcher is known before any signal arrives
    outcome = GuardRun(command=command, exit_code=0, world_size=0, role="host" if doctor else "follower",
                       store=f"{host}:{port}")
    received: list[int] = []
    saved = _forward_signals(job, received)
    try:
        code = _supervise(process, doctor, channel, outcome, job, received)
    finally:
        _restore_signals(saved)
        # Whatever is left of the job (orphans of the launcher, a rank that ignores SIGTERM).
        reaper.stop(job, None, reap=lambda: reaper.reap_orphans(job, {process.pid}))
        if process.returncode is None:
            process.wait()
        _release_supervisor(supervisor)
    if doctor is not None and channel is not None:
        _drain(channel)
        doctor.interrupted = bool(received)
        doctor.tick(final=True)
        channel.close()
        outcome.findings = list(doctor.findings)
        doctor.timeline.ended(doctor.ranks, doctor.clock())
        outcome.timeline = doctor.timeline
        outcome.world_size = doctor.world_size
        if doctor.world_size:  # else no rank joined: nothing was watched, and nothing is said
            outcome.summary = doctor.summary()
    outcome.exit_code = exit_status(code, outcome.stopped and not received, outcome.findings, fail_on)
    return outcome


def exit_status(code: int, stopped: bool, findings: Sequence[Finding], fail_on: str) -> int:
    """1 when the guard stopped the job; else the command's own failure (128+N for signal N); else 1
    when a finding is at least as severe as --fail-on; else 0."""
    if stopped:
        return 1
    if code != 0:
        return 128 - code if code < 0 else code
    return 1 if any(f.severity in FAIL_ON[fail_on] for f in findings) else 0


def _supervise(process: "subprocess.Popen[bytes]", doctor: Optional[Doctor], channel: Optional[SideChannel],
               outcome: GuardRun, job: reaper.Job, received: list[int]) -> int:
    stop_sent: Optional[float] = None
    reap = lambda: reaper.reap_orphans(job, {process.pid})  # noqa: E731
    while True:
        try:
            return process.wait(timeout=TICK_S)
        except subprocess.TimeoutExpired:
            pass
        job.watch()
        reap()
        if received:
            # The user's Ctrl-C or SIGTERM was passed on to every process: give the launcher its
            # grace, then nothing is left.
            reaper.stop(job, process.pid, signum=0, reap=reap)
            return process.wait()
        if doctor is None or channel is None:
            continue
        doctor.tick()
        if doctor.stop_requested and stop_sent is None:
            # The ranks exit first, so that the launcher sees failed workers and ends the way it
            # always does; then every process of the job is signalled, SIGTERM and at last SIGKILL.
            outcome.stopped = True
            stop_sent = time.monotonic()
            channel.broadcast({"t": "stop", "why": doctor.stop_requested})
        elif stop_sent is not None and time.monotonic() - stop_sent > STOP_ASKED_S:
            reaper.stop(job, process.pid, reap=reap)
            return process.wait()


def _drain(channel: SideChannel, seconds: float = 2.0) -> None:
    """Let the ranks' last messages (sent as they exit) arrive before the final diagnosis."""
    deadline = time.monotonic() + seconds
    while channel.connected() and time.monotonic() < deadline:
        time.sleep(0.05)


def _start_supervisor() -> "Optional[subprocess.Popen[bytes]]":
    env = dict(os.environ)
    env.pop(ENV, None)
    try:
        return subprocess.Popen([sys.executable, "-m", "ddpdoctor.guard.supervisor", str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True, env=env)
    except OSError:
        return None


def _tell(supervisor: "Optional[subprocess.Popen[bytes]]", line: str) -> None:
    stdin: Optional[IO[bytes]] = supervisor.stdin if supervisor else None
    if stdin is None:
        return
    try:
        stdin.write(line.encode() + b"\n")
        stdin.flush()
    except OSError:
        pass


def _release_supervisor(supervisor: "Optional[subprocess.Popen[bytes]]") -> None:
    if supervisor is None:
        return
    _tell(supervisor, "done")
    try:
        if supervisor.stdin:
            supervisor.stdin.close()
        supervisor.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        supervisor.kill()


def _forward_signals(job: reaper.Job, received: list[int]) -> dict[int, Any]:
    saved: dict[int, Any] = {}

    def forward(signum: int, frame: Optional[FrameType]) -> None:
        received.append(signum)
        job.signal(signum)  # no refresh here: the main thread may be in the middle of one

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            saved[signum] = signal.signal(signum, forward)
        except (ValueError, OSError):  # not the main thread
            pass
    return saved


def _restore_signals(saved: dict[int, Any]) -> None:
    for signum, handler in saved.items():
        signal.signal(signum, handler)
