"""Run `ddpdoctor guard` for real in a subprocess, and check that nothing of the job outlived it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import process_scan

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "guard"
GUARD = [sys.executable, "-m", "ddpdoctor", "guard"]
MARK_VAR = "DDPDOCTOR_TEST_MARK"


def planted(script: str, code: str) -> int:
    """The line of `script` marked `# planted: CODE`."""
    lines = (FIXTURES / script).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# planted: {code}" in text)


def forklaunch(nproc: int, script: str, *extra: str) -> list[str]:
    return [sys.executable, str(FIXTURES / "forklaunch.py"), str(nproc), *extra, f"fixtures/guard/{script}"]


def guard_env(mark: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env[MARK_VAR] = mark  # every process of the run inherits it: leftovers can be found afterwards
    env.pop("DDPDOCTOR_GUARD", None)
    return env


def marked_processes(mark: str) -> list[int]:
    return process_scan.marked_processes(MARK_VAR, mark)


@dataclass
class GuardResult:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any]
    seconds: float

    def codes(self) -> list[str]:
        return sorted(f["code"] for f in self.report["findings"])

    def finding(self, code: str) -> dict[str, Any]:
        matches = [f for f in self.report["findings"] if f["code"] == code]
        assert len(matches) == 1, (code, self.report["findings"], self.stderr[-3000:])
        return matches[0]


def start_guard(args: Sequence[str], command: Sequence[str], mark: str, report: str,
                extra_env: Optional[dict[str, str]] = None) -> "subprocess.Popen[str]":
    return subprocess.Popen([*GUARD, "--report", report, *args, "--", *command], cwd=REPO,
                            env={**guard_env(mark), **(extra_env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: "subprocess.Popen[str]", report: str, started: float, timeout: float = 150) -> GuardResult:
    stdout, stderr = process.communicate(timeout=timeout)
    data = json.loads(Path(report).read_text()) if os.path.exists(report) and os.path.getsize(report) else {}
    return GuardResult(process.returncode, stdout, stderr, data, time.monotonic() - started)


def run_guard(*args: str, command: Sequence[str], mark: Optional[str] = None, timeout: float = 150) -> GuardResult:
    mark = mark or uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        started = time.monotonic()
        result = finish(start_guard(args, command, mark, report), report, started, timeout)
    assert_no_leftovers(mark)
    return result


def assert_no_leftovers(mark: str) -> None:
    deadline = time.monotonic() + 3
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_processes(mark) == [], "the guarded run left processes behind"


def waited_seconds(message: str) -> float:
    """The seconds a GRD002 message says the waiting ranks had waited when it was diagnosed."""
    head = message.split(" waited ", 1)[1]
    return float(head.split(" s ", 1)[0])
