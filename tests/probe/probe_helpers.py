"""Shared helpers for the probe tests: run the real command in a subprocess and check that it left
no process behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from process_scan import marked_processes

REPO = Path(__file__).resolve().parents[2]
PROBE = [sys.executable, "-c", "from ddpdoctor.probe.command import probe; probe()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe_env(mark: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # Every process of this run inherits the mark, so leftovers can be found afterwards.
    env["DDPDOCTOR_TEST_MARK"] = mark
    return env


def processes_with_mark(mark: str) -> list[int]:
    return marked_processes("DDPDOCTOR_TEST_MARK", mark)


def assert_no_leftovers(mark: str) -> None:
    deadline = time.monotonic() + 3
    while processes_with_mark(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with_mark(mark) == [], "the probe left processes behind"


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, seconds: float) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.seconds = seconds

    def json(self) -> dict[str, Any]:
        return json.loads(self.stdout)

    def check(self, name: str) -> dict[str, Any]:
        return next(c for c in self.json()["checks"] if c["name"] == name)


def run_probe(*args: str, timeout: float = 120, mark: Optional[str] = None) -> Run:
    mark = mark or uuid.uuid4().hex
    start = time.monotonic()
    proc = subprocess.run([*PROBE, *args], capture_output=True, text=True, timeout=timeout, env=probe_env(mark), cwd=REPO)
    seconds = time.monotonic() - start
    assert_no_leftovers(mark)
    return Run(proc, seconds)


def bad_ranks(check: dict[str, Any]) -> list[int]:
    return sorted(e["rank"] for e in check["ranks"] if e["status"] in ("fail", "error"))


def interrupt_probe(args: list[str], whole_group: bool) -> tuple[int, str, float]:
    """Start a probe, wait until its ranks run, send SIGINT (to the probe alone, or to its whole
    process group as a terminal's Ctrl-C does); return (exit status, stderr, seconds to exit)."""
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([*PROBE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=probe_env(mark), cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(processes_with_mark(mark)) < 3 and proc.poll() is None:
            time.sleep(0.05)
        if len(processes_with_mark(mark)) < 3:
            # Say why: a probe that already ended (a failed start) is not worth 90 s of waiting.
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            _, early_err = proc.communicate(timeout=30)
            raise AssertionError(f"the ranks never started (probe exit {proc.returncode}): {early_err[-3000:]}")
        time.sleep(1.0)
        sent = time.monotonic()
        if whole_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert_no_leftovers(mark)
    return proc.returncode, err, took
