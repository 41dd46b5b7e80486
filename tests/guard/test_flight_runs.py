"""`ddpdoctor guard --analyze` on the dumps of real 2-rank gloo jobs (tests/guard/fr_job.py): a rank that all-reduces
a tensor of another shape, a rank that uses other parameters under DDP, a rank that skips a barrier, a clean run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from guard_helpers import GUARD, REPO, assert_no_leftovers, guard_env

JOB = "tests/guard/fr_job.py"
SCENARIOS = ("shape", "ddp_unused", "skip_barrier", "clean")


def line_of(mark: str) -> int:
    lines = (REPO / JOB).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# expect: {mark}"))


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Each scenario's dumps, judged: the four jobs run side by side (each waits mostly on gloo)."""
    root = tmp_path_factory.mktemp("fr")
    mark = uuid.uuid4().hex
    jobs = {}
    for scenario in SCENARIOS:
        env = guard_env(mark) | {"TORCH_FR_BUFFER_SIZE": "200",
                                 "TORCH_FR_DUMP_TEMP_FILE": str(root / scenario / "fr_")}
        (root / scenario).mkdir()
        jobs[scenario] = subprocess.Popen([sys.executable, "fixtures/guard/forklaunch.py", "2", JOB, scenario],
                                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = {}
    for scenario, job in jobs.items():
        output, _ = job.communicate(timeout=240)
        assert sorted(os.listdir(root / scenario)) == ["fr_0", "fr_1"], output[-2000:]
        analysis = subprocess.run([*GUARD, "--analyze", str(root / scenario), "--format", "json"], cwd=REPO,
                                  env=guard_env(mark), capture_output=True, text=True, timeout=60)
        results[scenario] = {"exit": analysis.returncode, **json.loads(analysis.stdout), "stderr": analysis.stderr}
    assert_no_leftovers(mark)
    yield results


def finding(report: dict[str, Any], code: str) -> dict[str, Any]:
    assert report["exit"] == 1 and [f["code"] for f in report["findings"]] == [code], report
    found: dict[str, Any] = report["findings"][0]
    return found


def test_a_rank_that_all_reduces_another_shape(reports: dict[str, dict[str, Any]]) -> None:
    found = finding(reports["shape"], "GRD001")
    line = line_of("shape")
    assert (found["path"], found["line"], found["ranks"]) == (JOB, line, [0, 1])
    assert found["message"].startswith(
        f"at collective #2 of the world group, from the Flight Recorder, rank 0 called all_reduce(float32[3]) at "
        f"{JOB}:{line} while rank 1 called all_reduce(float32[4]) at {JOB}:{line}")
    assert found["evidence"]["ranks"]["1"]["frames"][0] == f"{JOB}:{line} in shape"


def test_a_rank_that_uses_other_parameters_under_ddp(reports: dict[str, dict[str, Any]]) -> None:
    # Rank 1 leaves `b` unused in step 1: its gradient bucket is never ready, so DDP's reducer never launches the
    # bucket all-reduce rank 0 waits in; rank 1's next forward fails inside DDP.
    found = finding(reports["ddp_unused"], "GRD002")
    backward, forward = line_of("ddp_unused"), line_of("ddp_unused_forward")
    assert (found["path"], found["line"], found["ranks"]) == (JOB, backward, [1])
    assert found["message"].startswith(
        f"rank 0 entered all_reduce(float32[30]) at {JOB}:{backward} during backward() (a gradient hook: DDP's bucket "
        "all-reduce) (collective #7 of the world group, from the Flight Recorder) and rank 1 never did")
    assert f"rank 1's last was #6 broadcast(int32[1]) at {JOB}:{forward} inside DDP (_pre_forward)" in found["message"]


def test_a_rank_that_skips_a_barrier(reports: dict[str, dict[str, Any]]) -> None:
    found = finding(reports["skip_barrier"], "GRD002")
    line = line_of("skip_barrier")
    assert (found["path"], found["line"], found["ranks"]) == (JOB, line, [1])
    assert found["message"].startswith(f"rank 0 entered barrier() at {JOB}:{line} (collective #2 of the world group, "
                                       "from the Flight Recorder) and rank 1 never did, so rank 0 waits there")


def test_a_clean_run_has_no_finding(reports: dict[str, dict[str, Any]]) -> None:
    clean = reports["clean"]
    assert (clean["exit"], clean["findings"], clean["ranks"]) == (0, [], [0, 1])
    # DDP's own collectives are in the record: its constructor's all_gather and broadcasts, two bucket all-reduces,
    # the bucket rebuild's two broadcasts, then the script's all_reduce and barrier.
    assert clean["collectives"] == 9
    assert clean["stderr"].endswith("ranks 0, 1, 9 collectives in 1 process group: no finding\n")
