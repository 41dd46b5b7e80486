"""reaper.Job and reaper.stop on real processes, in a child Python that becomes a subreaper (so that
this test process does not): a launcher that dies and leaves a rank in a session of its own, and a
rank that ignores SIGTERM."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import process_scan

SCENARIO = r"""
import json, os, signal, subprocess, sys, time
from ddpdoctor.guard import reaper

assert reaper.become_subreaper()
# launcher (sh) -> rank (python, own session, ignores SIGTERM); the launcher exits at once.
rank_code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
launcher = subprocess.Popen(["sh", "-c", f"setsid {sys.executable} -c '{rank_code}' & sleep 0.5"])
job = reaper.Job(os.getpid())
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    job.refresh()
    if len(job.alive()) == 2:
        break
    time.sleep(0.02)
rank = [pid for pid in job.alive() if pid != launcher.pid][0]
launcher.wait()
time.sleep(0.2)
job.refresh()
orphan_parent = job.table[rank].ppid  # re-parented to us, not to init
started = time.monotonic()
reaper.stop(job, launcher.pid, reap=lambda: reaper.reap_orphans(job, set()))
print(json.dumps({"rank": rank, "me": os.getpid(), "orphan_parent": orphan_parent,
                  "seconds": time.monotonic() - started, "left": job.alive()}))
"""


def test_an_orphan_in_its_own_session_stays_below_the_guard_and_is_killed_after_the_grace() -> None:
    result = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["orphan_parent"] == seen["me"]
    assert seen["left"] == [] and not process_scan.alive(seen["rank"])
    # It ignored SIGTERM: SIGKILL came AFTER_LAUNCHER_S (2 s) after its launcher was gone, not 35 s later.
    assert 1.5 < seen["seconds"] < 6


def test_a_pid_is_known_with_its_start_time() -> None:
    from ddpdoctor.guard import reaper

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        job = reaper.Job(sleeper.pid)  # it has no children: only what `known` says
        job.known[sleeper.pid] = 1  # the same pid with another start time: a stranger that reused it
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not process_scan.alive(sleeper.pid):
            time.sleep(0.02)
        job.refresh()
        assert job.alive() == [] and job.signal(9) == 0
        assert sleeper.poll() is None  # not signalled
    finally:
        sleeper.kill()
        sleeper.wait()
