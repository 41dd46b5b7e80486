"""Exact blame with real gloo ranks: a check with a reference value names only the ranks that
differ from it -- with 2 ranks as with 3 and 4 -- each failure is printed once, and a crash's
traceback is shown whole."""

from __future__ import annotations

import pytest

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks import param_sync
from ddpdoctor.probe.judges import differ_from_reference
from probe_helpers import bad_ranks, run_probe

TIMEOUT = "3"


def _sync(rank: int, h_init: str, h_step: str, d_init: float = 0.0, d_step: float = 0.0) -> R.RankEntry:
    return R.entry(rank, R.PASS, "", hash_init=h_init, hash_step=h_step, tolerance_step=1e-6,
                   max_diff_vs_reference_init=d_init, max_diff_vs_reference_step=d_step)


def test_two_ranks_blame_only_the_one_that_started_wrong() -> None:
    # Rank 1 started with other weights; through the averaged gradients rank 0's step is off too.
    rec = param_sync.judge([_sync(0, "a", "b", 0.0, 1e-4), _sync(1, "z", "y", 1e-3, 1e-3)])
    assert R.ranks_with(rec, R.FAIL) == [1]
    assert rec["summary"].startswith("rank 1: parameters/buffers differ from rank 0's after DDP construction")
    assert "averaged gradients" in rec["summary"]


def test_a_rank_past_the_step_bound_is_blamed_and_one_just_inside_is_not() -> None:
    rec = param_sync.judge([_sync(0, "a", "b", 0.0, 1e-6), _sync(1, "a", "c", 0.0, 1.01e-6)])
    assert R.ranks_with(rec, R.FAIL) == [1]
    assert "> bound 1e-06" in rec["ranks"][1]["message"]


def test_reference_beats_the_majority() -> None:
    # Two of three agree on a value the reference says is wrong: they are the ones blamed.
    entries = [_sync(0, "a", "b"), _sync(1, "z", "y", 1e-3), _sync(2, "z", "y", 1e-3)]
    assert differ_from_reference(entries, "hash_init", "max_diff_vs_reference_init", "tolerance_init") == {1, 2}


def test_without_a_reference_difference_the_majority_decides() -> None:
    entries = [_sync(0, "a", "b"), _sync(1, "a", "b"), _sync(2, "q", "b")]
    assert differ_from_reference(entries, "hash_init", "max_diff_vs_reference_init", "tolerance_init") == {2}
    split = [_sync(0, "a", "b"), _sync(1, "q", "b")]
    assert differ_from_reference(split, "hash_init", "max_diff_vs_reference_init", "tolerance_init") == {0, 1}


def test_nan_is_far_from_the_reference() -> None:
    entries = [_sync(0, "a", "b"), _sync(1, "a", "b", d_step=float("nan"))]
    assert differ_from_reference(entries, "hash_step", "max_diff_vs_reference_step", "tolerance_step") == {1}


def test_a_long_traceback_keeps_its_start_and_its_end() -> None:
    text = "Traceback (most recent call last):\n" + "".join(f'  File "x.py", line {i}, in f\n' for i in range(5000)) + "RecursionError: deep\n"
    clipped = R.clip_traceback(text)
    assert len(clipped) <= R.TRACEBACK_LIMIT
    assert clipped.startswith("Traceback (most recent call last):\n")
    assert clipped.endswith("RecursionError: deep\n")
    assert "lines omitted" in clipped
    short = "Traceback (most recent call last):\nValueError: x\n"
    assert R.clip_traceback(short) == short


@pytest.mark.slow
@pytest.mark.parametrize("world, culprit", [(2, 1), (3, 1), (4, 2)])
def test_param_desync_blames_exactly_the_desynced_rank(world: int, culprit: int) -> None:
    run = run_probe("--nproc", str(world), "--timeout", TIMEOUT, "--checks", "world,param-sync",
                    "--inject-fault", f"param-desync:{culprit}")
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    row = next(line for line in lines if line.startswith("param-sync "))
    cells = row.split()[1:1 + world]
    assert cells == ["FAIL" if r == culprit else "ok" for r in range(world)], row
    assert f"verdict: 1 check(s) failed (param-sync) on rank {culprit}" in run.stdout
    # The failure is said once: in the table, not again below it.
    assert sum("differ from rank 0's after DDP construction" in line for line in lines) == 1, run.stdout


@pytest.mark.slow
def test_param_desync_json_blames_one_rank_of_two() -> None:
    run = run_probe("--nproc", "2", "--timeout", TIMEOUT, "--checks", "world,param-sync", "--format", "json",
                    "--inject-fault", "param-desync:0")
    assert run.returncode == 1, run.stderr
    assert bad_ranks(run.check("param-sync")) == [0]


@pytest.mark.slow
def test_a_crash_is_printed_once_with_its_whole_traceback() -> None:
    run = run_probe("--nproc", "2", "--timeout", TIMEOUT, "--checks", "world,liveness", "--inject-fault", "crash:1")
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    start = lines.index("    Traceback (most recent call last):")
    end = next(i for i, line in enumerate(lines) if "InjectedCrash: injected crash on rank 1" in line and i > start)
    assert any("in maybe_crash" in line for line in lines[start:end])
    assert any("in elastic_entry" in line for line in lines[start:end])  # from its first frame on
    # Table row and the traceback's last line; neither the failure section nor the launcher repeats it.
    assert sum("injected crash on rank 1" in line for line in lines) == 2, run.stdout
    assert "launcher: processes that ended badly" not in run.stdout
