"""The guard at the ends of things, for real (gloo ranks on CPU): a rank that skips a batch or stops one
early, replicas compared after the last step of a run shorter than --every, Join used right, and the
line a clean run ends with."""

from __future__ import annotations

import os
import sys

import pytest

from guard_helpers import FIXTURES, forklaunch, planted, run_guard

pytestmark = pytest.mark.slow
SCRIPT = "fixtures/guard/{}"
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def marked(script: str, mark: str) -> int:
    lines = (FIXTURES / script).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# {mark}" in text)


def test_a_rank_that_continues_past_one_batch_is_named_in_the_epoch_it_fell_behind() -> None:
    run = run_guard("--stall-timeout", "3", command=[*forklaunch(2, "tutorial_uneven.py"), "continue"])
    assert run.returncode == 1, run.stderr[-3000:]
    uneven = run.finding("GRD005")
    assert uneven["ranks"] == [1] and uneven["epoch"] == 0
    assert (uneven["path"], uneven["line"]) == (SCRIPT.format("tutorial_uneven.py"),
                                                planted("tutorial_uneven.py", "GRD005"))
    assert "rank 0: 6 batches, 4 DDP forwards, 4 backwards, 4 optimizer steps, 4 collectives" in uneven["message"]
    assert "rank 1: 6 batches, 3 DDP forwards, 3 backwards" in uneven["message"]


@pytest.mark.parametrize("launcher", ["forklaunch", "torchrun"])
def test_a_rank_that_breaks_one_batch_early_is_named_with_its_last_line(launcher: str) -> None:
    # Forked ranks linger after the script (rank 1 sits idle while rank 0 waits: named at the stall);
    # torchrun's end (rank 0 then fails in gloo's "Connection closed by peer": named at the end).
    command = ([*forklaunch(2, "tutorial_uneven.py"), "break"] if launcher == "forklaunch" else
               [TORCHRUN, "--standalone", "--nproc-per-node", "2", SCRIPT.format("tutorial_uneven.py"), "break"])
    run = run_guard("--stall-timeout", "3", command=command)
    assert run.returncode == 1, run.stderr[-3000:]
    uneven = run.finding("GRD005")
    assert uneven["ranks"] == [1]
    assert (uneven["path"], uneven["line"]) == (SCRIPT.format("tutorial_uneven.py"),
                                                marked("tutorial_uneven.py", "last: GRD005"))
    # Rank 0's last backward waits for rank 1 (forked), or fails in gloo and is counted (torchrun).
    backwards = 11 if launcher == "forklaunch" else 12
    assert (f"rank 0: 15 batches, 12 DDP forwards, {backwards} backwards, 11 optimizer steps, 12 collectives"
            in uneven["message"])
    assert "rank 1: 15 batches, 11 DDP forwards, 11 backwards, 11 optimizer steps, 11 collectives" in uneven["message"]
    assert uneven["message"].startswith("rank 1 left the training loop" if launcher == "forklaunch"
                                        else "rank 1 finished after fewer collectives")


def test_uneven_inputs_under_join_are_silent() -> None:
    run = run_guard("--stall-timeout", "3", command=forklaunch(2, "joined_uneven.py"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report["findings"] == []
    assert run.report["summary"]["epochs"] == 2


def assert_drift_at_the_end(run) -> None:  # type: ignore[no-untyped-def]
    assert run.returncode == 1, run.stderr[-3000:]
    drift = run.finding("GRD003")
    assert drift["ranks"] == [1] and drift["step"] == 30
    assert (drift["path"], drift["line"]) == (SCRIPT.format("short_drift.py"), planted("short_drift.py", "GRD003"))
    assert "'0.bias' on rank 1 differs from ranks 0, 2" in drift["message"]
    assert "checked after the last step" in drift["message"]


def test_drift_in_a_run_shorter_than_every_is_caught_when_the_group_is_destroyed() -> None:
    assert_drift_at_the_end(run_guard(command=forklaunch(3, "short_drift.py")))


@pytest.mark.parametrize("mode", ["exit", "function"])
def test_drift_in_a_run_shorter_than_every_is_caught_at_exit(mode: str) -> None:
    # torchrun runs the script as a process of its own, whose exit runs the guard's last check.
    assert_drift_at_the_end(run_guard(command=[TORCHRUN, "--standalone", "--nproc-per-node", "3",
                                               SCRIPT.format("short_drift.py"), mode]))


def test_a_clean_run_ends_with_one_line_of_what_was_watched() -> None:
    command = [TORCHRUN, "--standalone", "--nproc-per-node", "2", SCRIPT.format("clean_ddp.py")]
    run = run_guard(command=command)
    assert run.returncode == 0, run.stderr[-3000:]
    # 2 epochs of 4 steps; per rank: init, 8 DDP gradient all-reduces, 2 x (all_reduce, barrier), gather,
    # scatter, all_to_all_single, all_gather_object; the checks at each epoch's end.
    summary = {"ranks": 2, "epochs": 2, "steps": 8, "collectives": 17, "replica_checks": 2}
    assert run.report == {"command": command, "exit_code": 0, "world_size": 2, "summary": summary, "findings": []}
    lines = [line for line in run.stderr.splitlines() if "ddpdoctor" in line]
    assert lines == ["ddpdoctor guard: 2 ranks, 2 epochs, 8 steps, 17 collectives, 2 replica checks, no finding"]
    assert "GRD" not in run.stderr


def test_a_missing_set_epoch_is_one_finding_in_the_scripts_epochs() -> None:
    # The loop peeks at the loader once per epoch (3 epochs, 6 iterators): the epochs are the script's.
    run = run_guard(command=forklaunch(2, "tutorial_no_set_epoch.py"))
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.codes() == ["GRD004"]
    repeated = run.finding("GRD004")
    assert repeated["ranks"] == [0, 1] and repeated["epoch"] == 1 and repeated["epochs"] == [1, 2]
    assert repeated["line"] == planted("tutorial_no_set_epoch.py", "GRD004")
    assert "still at set_epoch(0) when a new epoch runs over it" in repeated["message"]
    assert run.report["summary"]["epochs"] == 3


def test_fail_on_error_lets_a_job_with_only_a_warning_exit_0() -> None:
    run = run_guard("--fail-on", "error", command=forklaunch(2, "tutorial_no_set_epoch.py"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.codes() == ["GRD004"] and run.report["exit_code"] == 0
    assert run.stderr.rstrip().endswith("1 finding (GRD004); exit 0")
