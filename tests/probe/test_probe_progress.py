"""The parent's progress judgment: a run none of whose ranks is making progress any more is named
and killed within its phase's bound (derived from the same terms as the overall deadline), on
synthetic progress files; the watchdog doing it to a real process; the report's wording for it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.probe import results as R
from ddpdoctor.probe.budgets import (CHECK_SLACK_S, RUN_SLACK_S, STARTUP, check_budget, overall_deadline,
                                     phase_budgets)
from ddpdoctor.probe.config import RankConfig
from ddpdoctor.probe.exchange import missing_advice
from ddpdoctor.probe.linkmap import time_budget
from ddpdoctor.probe.merge import merge
from ddpdoctor.probe.procs import ProgressTracker, Watchdog, read_rank_files
from ddpdoctor.probe.registry import advice_for
from ddpdoctor.probe.results import LaunchOutcome
from ddpdoctor.probe.stall import startup_budget

CONFIG = RankConfig(timeout=5.0, join_timeout=60.0, checks=("world", "liveness", "links", "allreduce"))
WORLD = 4
BUDGETS = phase_budgets(CONFIG, WORLD)
CHECK_S = 3 * 5.0 + CHECK_SLACK_S  # run + the exchange's two waits + slack: 17 s
EPS = 0.01
T0 = 1000.0


def write_rank(out: Path, rank: int, pid: int, running: Any, progress: int, finished: bool = False) -> None:
    data = {"rank": rank, "pid": pid, "running": running, "progress": progress, "finished": finished}
    (out / f"rank-{rank}.json").write_text(json.dumps(data))


def everyone_alive(pid: int) -> bool:
    return True


def tracker_at(out: Path, now: float) -> ProgressTracker:
    tracker = ProgressTracker(BUDGETS)
    tracker.observe(read_rank_files(str(out)), now)
    return tracker


def stalled(tracker: ProgressTracker, out: Path, now: float) -> dict[int, float]:
    return tracker.stalled(read_rank_files(str(out)), now, everyone_alive)


def test_budgets_are_the_overall_deadlines_terms() -> None:
    assert BUDGETS["liveness"] == BUDGETS["world"] == BUDGETS["allreduce"] == CHECK_S
    assert BUDGETS["links"] == CHECK_S + time_budget(WORLD)
    assert BUDGETS[STARTUP] == startup_budget(5.0, 60.0) + CHECK_SLACK_S
    # The deadline is join plus every check's budget: the run as a whole can only be slower.
    total = sum(check_budget(CONFIG, name, WORLD) for name in CONFIG.checks)
    assert overall_deadline(CONFIG, WORLD) == pytest.approx(60.0 + total + RUN_SLACK_S)


@pytest.mark.parametrize("phase, bound", [("liveness", CHECK_S), ("links", CHECK_S + time_budget(WORLD)),
                                          (STARTUP, 67.0), ("a-check-of-a-newer-rank", 67.0)])
def test_a_lone_silent_rank_is_stalled_just_past_its_phases_bound_only(tmp_path: Path, phase: str,
                                                                       bound: float) -> None:
    assert BUDGETS.get(phase, max(BUDGETS.values())) == bound
    write_rank(tmp_path, 0, 4242, phase, progress=3)
    tracker = tracker_at(tmp_path, T0)
    assert stalled(tracker, tmp_path, T0 + bound - EPS) == {}
    assert stalled(tracker, tmp_path, T0 + bound + EPS) == {4242: bound}


def test_progress_restarts_the_clock(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, 4242, "liveness", progress=3)
    tracker = tracker_at(tmp_path, T0)
    write_rank(tmp_path, 0, 4242, "liveness", progress=4)  # its result, 10 s in
    tracker.observe(read_rank_files(str(tmp_path)), T0 + 10)
    assert stalled(tracker, tmp_path, T0 + CHECK_S + EPS) == {}
    assert stalled(tracker, tmp_path, T0 + 10 + CHECK_S - EPS) == {}
    assert stalled(tracker, tmp_path, T0 + 10 + CHECK_S + EPS) == {4242: CHECK_S}


def test_a_new_phase_is_progress_and_brings_its_own_bound(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, 4242, "allreduce", progress=7)
    tracker = tracker_at(tmp_path, T0)
    write_rank(tmp_path, 0, 4242, "links", progress=7)  # even with the same count
    tracker.observe(read_rank_files(str(tmp_path)), T0 + 5)
    links = CHECK_S + time_budget(WORLD)
    assert stalled(tracker, tmp_path, T0 + 5 + links - EPS) == {}
    assert stalled(tracker, tmp_path, T0 + 5 + links + EPS) == {4242: links}


def test_one_rank_still_progressing_keeps_the_silent_ones_alive(tmp_path: Path) -> None:
    """It will report the silent one through the exchange, and then the grace rule kills it."""
    write_rank(tmp_path, 0, 4242, "liveness", progress=3)
    write_rank(tmp_path, 1, 4343, "liveness", progress=3)
    tracker = tracker_at(tmp_path, T0)
    write_rank(tmp_path, 1, 4343, "liveness", progress=4)
    tracker.observe(read_rank_files(str(tmp_path)), T0 + 10)
    assert stalled(tracker, tmp_path, T0 + CHECK_S + 1) == {}
    # ... until it too goes silent past its bound: then every rank is named.
    assert stalled(tracker, tmp_path, T0 + 10 + CHECK_S + EPS) == {4242: CHECK_S, 4343: CHECK_S}


def test_every_rank_stuck_at_once_is_named_each_by_its_own_phase(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, 4242, "liveness", progress=3)
    write_rank(tmp_path, 1, 4343, STARTUP, progress=2)  # the slower phase decides
    tracker = tracker_at(tmp_path, T0)
    assert stalled(tracker, tmp_path, T0 + 67.0 - EPS) == {}
    assert stalled(tracker, tmp_path, T0 + 67.0 + EPS) == {4242: CHECK_S, 4343: 67.0}


def test_finished_and_dead_ranks_are_not_judged(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, 4242, None, progress=9, finished=True)
    write_rank(tmp_path, 1, 4343, "liveness", progress=3)
    write_rank(tmp_path, 2, 4444, "liveness", progress=3)
    tracker = tracker_at(tmp_path, T0)
    files = read_rank_files(str(tmp_path))
    assert tracker.stalled(files, T0 + 1e6, lambda pid: pid != 4444) == {4343: CHECK_S}
    assert tracker.stalled(files, T0 + 1e6, lambda pid: False) == {}


def test_a_file_without_a_pid_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text(json.dumps({"rank": 0, "pid": "x", "running": "liveness"}))
    tracker = tracker_at(tmp_path, T0)
    assert stalled(tracker, tmp_path, T0 + 1e6) == {}


def test_the_watchdog_kills_a_real_silent_rank_but_not_a_progressing_one(tmp_path: Path) -> None:
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    silent_dir, busy_dir = tmp_path / "silent", tmp_path / "busy"
    silent_dir.mkdir()
    busy_dir.mkdir()
    write_rank(silent_dir, 0, silent.pid, "liveness", progress=1)
    write_rank(busy_dir, 0, busy.pid, "liveness", progress=1)
    budgets = {STARTUP: 0.5, "liveness": 0.5}
    outcomes = LaunchOutcome(out_dir=str(silent_dir)), LaunchOutcome(out_dir=str(busy_dir))
    dogs = [Watchdog(str(d), 60.0, o, budgets=budgets) for d, o in zip((silent_dir, busy_dir), outcomes)]
    stop_writing = threading.Event()

    def keep_progressing() -> None:
        step = 1
        while not stop_writing.wait(0.1):
            step += 1
            write_rank(busy_dir, 0, busy.pid, "liveness", progress=step)

    writer = threading.Thread(target=keep_progressing)
    try:
        writer.start()
        started = time.monotonic()
        for dog in dogs:
            dog.start()
        assert silent.wait(timeout=20) == -9
        took = time.monotonic() - started
        assert 0.5 <= took < 15
        assert outcomes[0].stalled_pids == {silent.pid: 0.5} and outcomes[0].killed_hung_pids == {silent.pid}
        time.sleep(1.5)  # three times its bound, with progress every 0.1 s
        assert busy.poll() is None and not outcomes[1].killed_hung_pids
    finally:
        stop_writing.set()
        writer.join()
        for dog in dogs:
            dog.stop.set()
            dog.join()
        for proc in (silent, busy):
            proc.kill()
            proc.wait()


def rank_file(running: str, pid: int = 777) -> dict[str, Any]:
    if running == STARTUP:
        return {"rank": 0, "pid": pid, "running": running, "finished": False, "records": {}, "own": {}}
    world = R.record("world", [R.entry(0, R.PASS, "1 rank")])
    return {"rank": 0, "pid": pid, "running": running, "finished": False, "records": {"world": world},
            "own": {"world": world["ranks"][0]}}


def merged(running: str, bound: float) -> list[R.CheckRecord]:
    outcome = LaunchOutcome(out_dir="/nonexistent", rank_files={0: rank_file(running)}, killed_hung_pids={777},
                            stalled_pids={777: bound})
    outcome.failures = {0: {"local_rank": 0, "pid": 777, "exitcode": -9, "signal": "SIGKILL", "message": "",
                            "traceback": ""}}
    return merge(outcome, ("world", "liveness", "allreduce"), 1, lambda name: advice_for("torch", name))


def test_a_rank_killed_for_no_progress_is_reported_as_the_exchange_would_name_it() -> None:
    world, liveness, allreduce = merged("liveness", 17.0)
    assert world["status"] == R.PASS
    entry = liveness["ranks"][0]
    assert liveness["status"] == R.FAIL and entry["status"] == R.FAIL
    assert entry["message"] == ("rank 0 did not report liveness within 17s: hung, dead, or its node was lost; "
                                "killed by the probe after no rank made progress for 17s")
    assert entry["detail"]["missing"] is True and entry["detail"]["killed_by_probe"] is True
    assert liveness["summary"] == entry["message"]
    assert liveness["advice"] == missing_advice([0])
    assert allreduce["status"] == R.SKIP and allreduce["summary"] == "not run: rank 0 stopped responding during liveness"
    assert R.exit_code([world, liveness, allreduce]) == R.EXIT_FAILED


def test_a_rank_stuck_in_start_up_is_blamed_on_the_first_check_as_start_up() -> None:
    world, liveness, _ = merged(STARTUP, 67.0)
    assert world["status"] == R.FAIL
    assert world["ranks"][0]["message"].startswith("rank 0 did not report its start-up within 67s")
    assert world["advice"] == missing_advice([0])
    assert liveness["summary"] == "not run: rank 0 stopped responding during world"


def test_ranks_killed_together_are_all_named_even_if_the_launcher_terminated_one_first() -> None:
    """torch elastic may see the first killed rank die and SIGTERM the other before our SIGKILL lands."""
    files = {r: {**rank_file("liveness", pid=700 + r), "rank": r} for r in (0, 1)}
    outcome = LaunchOutcome(out_dir="/nonexistent", rank_files=files, killed_hung_pids={700, 701},
                            stalled_pids={700: 8.0, 701: 8.0})
    outcome.failures = {r: {"local_rank": r, "pid": 700 + r, "exitcode": code, "signal": sig, "message": "",
                            "traceback": ""} for r, code, sig in ((0, -9, "SIGKILL"), (1, -15, "SIGTERM"))}
    _, liveness, allreduce = merge(outcome, ("world", "liveness", "allreduce"), 2, lambda name: "")
    assert [e["status"] for e in liveness["ranks"]] == [R.FAIL, R.FAIL]
    assert liveness["advice"] == missing_advice([0, 1])
    assert allreduce["summary"] == "not run: ranks 0, 1 stopped responding during liveness"
