"""The Flight Recorder inside `ddpdoctor guard`, for real (2-rank gloo jobs): each rank's record is collected over
the side channel at a live mismatch, at a stall and as the ranks exit, and the first place the ranks' collectives
part is named with its code, rank and line, DDP's own collectives included. With the recorder switched off
(TORCH_FR_BUFFER_SIZE=0, as an older torch or a Horovod job has none) the guard says what it said without it."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from typing import Any, Iterator

import pytest
from guard_helpers import FIXTURES, GuardResult, assert_no_leftovers, finish, forklaunch, planted, start_guard

pytestmark = pytest.mark.slow
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
SHAPE, UNUSED, BARRIER = "fr_wrong_shape.py", "fr_unused_branch.py", "fr_skipped_barrier.py"
OFF = {"TORCH_FR_BUFFER_SIZE": "0"}
JOBS: dict[str, tuple[list[str], dict[str, str]]] = {
    "shape": (forklaunch(2, SHAPE), {}),
    "unused": (forklaunch(2, UNUSED), {}),
    # Under torchrun rank 0, blocked in gloo, is stopped by torchrun as soon as rank 1 has failed: its record is
    # asked for the moment rank 1's last one arrives.
    "unused_torchrun": ([TORCHRUN, "--standalone", "--nproc-per-node", "2", f"fixtures/guard/{UNUSED}"], {}),
    # Forked ranks linger after their script: rank 0 stalls in the barrier and is named then. Under torchrun rank
    # 1 exits, rank 0 fails in gloo, and the records the ranks sent as they exited name it at the end.
    "barrier": (forklaunch(2, BARRIER), {}),
    "barrier_torchrun": ([TORCHRUN, "--standalone", "--nproc-per-node", "2", f"fixtures/guard/{BARRIER}"], {}),
    "shape_off": (forklaunch(2, SHAPE), OFF),
    "unused_off": (forklaunch(2, UNUSED), OFF),
}


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, GuardResult]]:
    """The jobs side by side, a few at a time (each waits mostly on gloo or on the stall timeout)."""
    results: dict[str, GuardResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        names = list(JOBS)
        for batch in (names[:4], names[4:]):
            mark = uuid.uuid4().hex
            started = {}
            for name in batch:
                command, env = JOBS[name]
                report = os.path.join(tmp, f"{name}.json")
                started[name] = (start_guard(["--stall-timeout", "10"], command, mark, report, env), report,
                                 time.monotonic())
            for name, (process, report, at) in started.items():
                results[name] = finish(process, report, at, timeout=240)
            assert_no_leftovers(mark)
    yield results


def only(run: GuardResult, code: str) -> dict[str, Any]:
    assert run.returncode == 1, run.stderr[-3000:]
    return run.finding(code)


def line(script: str, mark: str) -> int:
    lines = (FIXTURES / script).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# planted: {mark}"))


def test_a_rank_that_all_reduces_another_shape_is_told_from_the_recorder_with_both_stacks(
        runs: dict[str, GuardResult]) -> None:
    found = only(runs["shape"], "GRD001")
    script, at, caller = f"fixtures/guard/{SHAPE}", planted(SHAPE, "GRD001"), line(SHAPE, "caller")
    assert (found["path"], found["line"], found["ranks"]) == (script, at, [0, 1])
    # Collective #8 of the world group: DDP's constructor and its four bucket all-reduces and rebuilds come first.
    assert found["message"].startswith(
        f"at collective #8 of the world group, from the Flight Recorder, rank 0 called all_reduce(float32[3]) at "
        f"{script}:{at} while rank 1 called all_reduce(float32[4]) at {script}:{at}")
    assert (f"Stacks: rank 0: {script}:{at} in report ← {script}:{caller} in <module>" in found["message"]
            and f"rank 1: {script}:{at} in report ← {script}:{caller} in <module>" in found["message"])
    evidence = found["evidence"]
    assert (evidence["source"], evidence["seq"]) == ("flight_recorder", 8)
    assert [evidence["ranks"][r]["input_sizes"] for r in ("0", "1")] == [[[3]], [[4]]]


@pytest.mark.parametrize("name", ["unused", "unused_torchrun"])
def test_a_rank_that_leaves_a_parameter_unused_is_named_in_ddps_own_all_reduce(runs: dict[str, GuardResult],
                                                                               name: str) -> None:
    found = only(runs[name], "GRD002")
    script, backward, forward = f"fixtures/guard/{UNUSED}", planted(UNUSED, "GRD002"), planted(UNUSED, "forward")
    assert (found["path"], found["line"], found["ranks"]) == (script, backward, [1])
    assert found["message"].startswith(
        f"rank 0 entered all_reduce(float32[81]) at {script}:{backward} during backward() (a gradient hook: DDP's "
        "bucket all-reduce) (collective #7 of the world group, from the Flight Recorder) and rank 1 never did")
    assert f"rank 1's last was #6 broadcast(int32[1]) at {script}:{forward} inside DDP (_pre_forward)" in found["message"]
    assert runs[name].codes() == ["GRD002"]


@pytest.mark.parametrize("name", ["barrier", "barrier_torchrun"])
def test_a_rank_that_skips_a_barrier_is_named_at_the_barrier(runs: dict[str, GuardResult], name: str) -> None:
    run = runs[name]
    found = only(run, "GRD002")
    script, at = f"fixtures/guard/{BARRIER}", planted(BARRIER, "GRD002")
    assert (found["path"], found["line"], found["ranks"]) == (script, at, [1])
    told = (f"rank 0 entered barrier() at {script}:{at} (collective #8 of the world group, from the Flight Recorder) "
            f"and rank 1 never did, so rank 0 waits there: rank 1's last was #7 all_reduce(float32[161])")
    if name == "barrier":  # the stall, with what the recorder adds
        assert found["message"].startswith(f"rank 0 waited ") and f". The Flight Recorder: {told}" in found["message"]
        assert found["message"].endswith("; the job was stopped")
    else:
        assert found["message"].startswith(told)
    # The recorder shows one skipped call, not a rank behind in its steps: no GRD005 beside it.
    assert run.codes() == ["GRD002"]


def test_without_the_recorder_the_guard_says_what_it_says_without_it(runs: dict[str, GuardResult]) -> None:
    shape = only(runs["shape_off"], "GRD001")
    assert shape["message"].startswith("at collective #3, rank 0 called all_reduce(float32[3])")
    assert "Flight Recorder" not in shape["message"] and "evidence" not in shape
    # DDP's own collectives are invisible without it: the job fails, and nothing names where.
    unused = runs["unused_off"]
    assert unused.returncode != 0 and unused.report["findings"] == []
