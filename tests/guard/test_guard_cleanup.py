"""Nothing of a guarded job outlives the run, however the run ends: real gloo ranks, a real torchrun
(which starts every rank in a session of its own), and /proc scanned afterwards for any process that
inherited the run's mark (tests/process_scan.py, which does not use the code under test)."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import process_scan
from guard_helpers import MARK_VAR, assert_no_leftovers, finish, marked_processes, run_guard, start_guard

pytestmark = pytest.mark.slow
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def ranks_running(mark: str, script: str, wanted: int, timeout: float = 90) -> list[int]:
    """The marked processes running `script` (torchrun's agent and its ranks), once there are `wanted`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [pid for pid in marked_processes(mark) if script in _cmdline(pid)]
        if len(found) >= wanted:
            return found
        time.sleep(0.2)
    raise AssertionError(f"the job did not start {wanted} processes running {script}")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def long_torchrun(steps: int) -> list[str]:
    return ["env", f"STEPS={steps}", TORCHRUN, "--standalone", "--nproc-per-node", "2", "fixtures/guard/long_run.py"]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_guard_leaves_no_process_of_the_job(signum: int) -> None:
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        started = time.monotonic()
        guard = start_guard([], long_torchrun(600), mark, report)
        ranks_running(mark, "long_run.py", 3)  # torchrun and its two ranks
        time.sleep(3)  # in their training loop, connected to the guard
        os.kill(guard.pid, signum)
        result = finish(guard, report, started, timeout=120)
    assert_no_leftovers(mark)
    if signum == signal.SIGKILL:
        assert result.returncode == -signal.SIGKILL
        # The supervisor, not the guard, stopped the job: it says so.
        assert "the guard was killed; stopping the" in result.stderr, result.stderr[-2000:]
    else:
        # The job's own status: torchrun ended by the signal it was passed.
        assert result.returncode not in (0, 2), result.stderr[-2000:]
        assert "internal error" not in result.stderr


def test_a_rank_that_holds_the_gil_and_ignores_sigterm_is_killed_after_the_stop() -> None:
    started = time.monotonic()
    run = run_guard("--stall-timeout", "3", command=[sys.executable, "fixtures/guard/stubborn_rank.py"])
    # run_guard has checked /proc: the rank that ignored the stop message, SIGTERM and SIGINT is gone.
    assert run.returncode == 1, run.stderr[-3000:]
    stall = run.finding("GRD002")
    assert stall["ranks"] == [1] and "rank 1 did not answer" in stall["message"]
    assert "stopping rank 1" not in run.stderr  # its reporter thread never ran again: SIGKILL ended it
    assert time.monotonic() - started < 90


INJECT = """\
import os
if not os.environ.get("DDPDOCTOR_GUARD"):  # the guard process itself, not the job's
    from ddpdoctor.guard import doctor

    calls = []

    def tick(self, final=False):
        calls.append(final)
        if len(calls) == 3:
            raise RuntimeError("injected")

    doctor.Doctor._tick = tick
"""


def test_a_crash_of_the_guards_diagnosis_leaves_the_job_to_finish(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(INJECT)
    mark = uuid.uuid4().hex
    report = str(tmp_path / "report.json")
    started = time.monotonic()
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    guard = start_guard([], long_torchrun(15), mark, report, env)
    result = finish(guard, report, started)
    assert_no_leftovers(mark)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("trained") == 2
    warnings = [line for line in result.stderr.splitlines() if line.startswith("ddpdoctor guard: warning:")]
    assert warnings == ["ddpdoctor guard: warning: internal error in the guard's diagnosis (RuntimeError: injected); "
                        "the job goes on undiagnosed"]
    assert result.report["findings"] == []


def test_the_mark_is_found_by_the_tests_own_scan() -> None:
    # The leftover checks above would pass vacuously if the mark were never inherited: a marked
    # process of this test's own is found.
    import subprocess

    mark = uuid.uuid4().hex
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, MARK_VAR: mark})
    try:
        deadline = time.monotonic() + 10
        while child.pid not in process_scan.marked_processes(MARK_VAR, mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_scan.marked_processes(MARK_VAR, mark) == [child.pid]
    finally:
        child.kill()
        child.wait()
