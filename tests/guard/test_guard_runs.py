"""The guard for real: gloo ranks on CPU running small training scripts with planted bugs.

Ranks are started by torch's elastic API (fixtures/guard/forklaunch.py: fork from one parent that
imported torch once), by torchrun itself, and by mp.spawn. Every run is checked for leftover
processes. A stall must be diagnosed within --stall-timeout + 10 s of the wait that caused it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from guard_helpers import (REPO, GuardResult, assert_no_leftovers, finish, forklaunch, guard_env, planted,
                           run_guard, start_guard, waited_seconds)

pytestmark = pytest.mark.slow
STALL = "3"
SCRIPT = "fixtures/guard/{}"


def assert_stall_diagnosed_in_time(finding: dict) -> None:
    assert float(STALL) <= waited_seconds(finding["message"]) <= float(STALL) + 10, finding["message"]


def test_extra_collective_on_one_rank_is_named_with_its_line_and_the_job_stopped() -> None:
    run = run_guard("--stall-timeout", STALL, command=forklaunch(3, "extra_collective.py"))
    assert run.returncode == 1, run.stderr[-3000:]
    mismatch = run.finding("GRD001")
    assert mismatch["ranks"] == [1]
    assert (mismatch["path"], mismatch["line"]) == (SCRIPT.format("extra_collective.py"),
                                                    planted("extra_collective.py", "GRD001"))
    assert "rank 1 called all_reduce(float32[1])" in mismatch["message"]
    assert "ranks 0, 2 called barrier()" in mismatch["message"]
    stall = run.finding("GRD002")
    assert stall["ranks"] == [0, 1, 2] and "cannot match" in stall["message"]
    assert_stall_diagnosed_in_time(stall)
    assert run.report["world_size"] == 3


def test_rank_with_one_more_batch_is_named_before_the_hang() -> None:
    run = run_guard("--stall-timeout", STALL, command=forklaunch(2, "extra_batch.py"))
    assert run.returncode == 1
    assert run.codes() == ["GRD002", "GRD005"]  # no GRD001 for the misaligned collectives that follow
    uneven = run.finding("GRD005")
    assert uneven["ranks"] == [0] and uneven["epoch"] == 0
    assert (uneven["path"], uneven["line"]) == (SCRIPT.format("extra_batch.py"), planted("extra_batch.py", "GRD005"))
    assert "rank 0: 3+, rank 1: 2" in uneven["message"] and "Join" in uneven["message"]
    assert_stall_diagnosed_in_time(run.finding("GRD002"))


@pytest.fixture(scope="module")
def quiet_bugs() -> GuardResult:
    return run_guard("--stall-timeout", STALL, "--every", "4", "--straggler-window", "6",
                     command=forklaunch(3, "quiet_bugs.py"))


def test_quiet_bugs_finish_with_findings_and_exit_1(quiet_bugs: GuardResult) -> None:
    assert quiet_bugs.returncode == 1, quiet_bugs.stderr[-3000:]
    assert quiet_bugs.codes() == ["GRD003", "GRD003", "GRD004", "GRD006", "GRD007", "GRD007"]
    # Findings are printed as they happen, one line each.
    assert sum(1 for line in quiet_bugs.stderr.splitlines() if ": GRD00" in line) == 6


def test_buffer_updated_on_one_rank_and_parameter_nudged_on_another(quiet_bugs: GuardResult) -> None:
    diverged = {tuple(f["ranks"]): f for f in quiet_bugs.report["findings"] if f["code"] == "GRD003"}
    assert set(diverged) == {(1,), (2,)}
    assert "'seen' on rank 2 differs from ranks 0, 1" in diverged[(2,)]["message"]
    assert diverged[(2,)]["step"] == 4
    # The nudge happens after epoch 0 (step 8): the check at step 8 sees it.
    assert "'0.weight' on rank 1 differs from ranks 0, 2" in diverged[(1,)]["message"]
    assert diverged[(1,)]["step"] == 8
    line = planted("quiet_bugs.py", "GRD003")
    assert {(f["path"], f["line"]) for f in diverged.values()} == {(SCRIPT.format("quiet_bugs.py"), line)}


def test_sampler_without_set_epoch(quiet_bugs: GuardResult) -> None:
    repeated = quiet_bugs.finding("GRD004")
    assert repeated["ranks"] == [0, 1, 2] and repeated["epoch"] == 1
    assert repeated["line"] == planted("quiet_bugs.py", "GRD004")


def test_rank_that_sleeps_every_step_is_the_straggler(quiet_bugs: GuardResult) -> None:
    straggler = quiet_bugs.finding("GRD006")
    assert straggler["ranks"] == [1]
    assert straggler["line"] == planted("quiet_bugs.py", "GRD006")  # where it spends the time


def test_model_on_the_wrong_gpu_behind_a_fake_cuda(quiet_bugs: GuardResult) -> None:
    wrong = [f for f in quiet_bugs.report["findings"] if f["code"] == "GRD007"]
    assert sorted(f["ranks"][0] for f in wrong) == [1, 2]  # rank 0 on cuda:0 is right
    assert {f["line"] for f in wrong} == {planted("quiet_bugs.py", "GRD007")}
    assert "local rank 2 should use cuda:2, but its model is on cuda:0" in " ".join(f["message"] for f in wrong)


# A spawned rank that dies in its C++ teardown, after its last line of Python (a joinable std::thread of
# torch's destroyed at exit). Seen once in a CI run, with the guard silent; never in 30 local runs of the
# same job with and without the guard, under load.
TEARDOWN_ABORT = "terminate called without an active exception"


def test_clean_mp_spawn_job_is_silent() -> None:
    command = [sys.executable, SCRIPT.format("clean_spawn.py")]
    run = run_guard("--every", "1", command=command)
    if run.returncode != 0 and TEARDOWN_ABORT in run.stderr and run.report["findings"] == []:
        run = run_guard("--every", "1", command=command)  # once more: a second abort fails the test
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report["world_size"] == 2 and run.report["findings"] == []


def test_two_nodes_on_loopback_one_guard_each_and_a_rank_blocked_outside_any_collective() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mark = uuid.uuid4().hex
    store = ["--store", f"127.0.0.1:{port + 1}", "--stall-timeout", STALL]
    node = ["--nnodes", "2", "--endpoint", f"127.0.0.1:{port}"]
    tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"guard-{mark}")
    started = time.monotonic()
    # Not torchrun: the job's identity, which the other node's guard shows node 0's, comes from the user.
    job = {"DDPDOCTOR_GUARD_JOB": f"two-nodes-{mark}"}
    head = start_guard(store, forklaunch(1, "blocked_rank.py", *node, "--node-rank", "0"), mark, tmp + "-0.json",
                       job)
    deadline = time.monotonic() + 60
    while True:  # node 0's guard listens first: the other guard then points its ranks at it
        try:
            socket.create_connection(("127.0.0.1", port + 1), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    other = start_guard(store, forklaunch(1, "blocked_rank.py", *node, "--node-rank", "1"), mark, tmp + "-1.json",
                        job)
    try:
        first, second = finish(head, tmp + "-0.json", started), finish(other, tmp + "-1.json", started)
    finally:
        for path in (tmp + "-0.json", tmp + "-1.json"):
            if os.path.exists(path):
                os.unlink(path)
    assert_no_leftovers(mark)
    assert first.returncode == 1, first.stderr[-3000:]
    assert first.report["world_size"] == 2
    # Rank 1 (on the other node) blocks outside any collective: named, with its stack, from node 0.
    assert first.codes() == ["GRD002"]
    stall = first.finding("GRD002")
    line = planted("blocked_rank.py", "GRD002")
    assert stall["ranks"] == [1]
    assert (stall["path"], stall["line"]) == (SCRIPT.format("blocked_rank.py"), line)
    assert f"rank 1 is at fixtures/guard/blocked_rank.py:{line} in <module>" in stall["message"]
    assert "rank 0 waited" in stall["message"] and "DDP gradient all-reduce" in stall["message"]
    assert_stall_diagnosed_in_time(stall)
    # The other node's guard ran its ranks, which node 0's guard stopped through the side channel.
    assert second.report["findings"] == [] and second.report["diagnosed_by"] == f"127.0.0.1:{port + 1}"
    assert second.returncode != 0 and "stopping rank 1 (GRD002)" in second.stderr


def run_installed_in_code(*script_args: str) -> subprocess.CompletedProcess[str]:
    mark = uuid.uuid4().hex
    started = time.monotonic()
    result = subprocess.run([*forklaunch(3, "installed_in_code.py"), *script_args], cwd=REPO, env=guard_env(mark),
                            capture_output=True, text=True, timeout=150)
    assert_no_leftovers(mark)
    line = planted("installed_in_code.py", "GRD001")
    # Rank 0 printed the findings on its stderr, then every rank was stopped through the side channel.
    assert (f"fixtures/guard/installed_in_code.py:{line}: GRD001 [rank 1] rank 1 called all_reduce(float32[3])"
            in result.stderr), result.stderr[-3000:]
    assert ": GRD002 [ranks 0,1,2]" in result.stderr and "the job was stopped" in result.stderr
    assert result.returncode != 0 and time.monotonic() - started < 120
    return result


def test_guard_installed_in_code_without_the_command() -> None:
    run_installed_in_code()


def test_guard_installed_in_code_when_its_port_is_taken() -> None:
    # Something holds the configured port without listening on it (as one of the job's own connections
    # may hold MASTER_PORT + 1): rank 0 listens elsewhere and the others find it through the job's
    # store, where they used to be refused and run unguarded into the planted hang.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        result = run_installed_in_code(f"127.0.0.1:{port}")
    assert "cannot reach the guard" not in result.stderr


def test_a_rank_that_never_calls_init_process_group_is_named_with_its_stack() -> None:
    # torchrun's ranks say hello when they import torch.distributed, before the rendezvous: rank 0
    # waits in init_process_group, rank 1 never gets there, and the report says where it is.
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    started = time.monotonic()
    run = run_guard("--stall-timeout", STALL, command=[torchrun, "--standalone", "--nproc-per-node", "2",
                                                      SCRIPT.format("never_joins.py")])
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.codes() == ["GRD002"] and run.report["world_size"] == 2
    stall = run.finding("GRD002")
    line = planted("never_joins.py", "GRD002")
    assert stall["ranks"] == [1]
    assert (stall["path"], stall["line"]) == (SCRIPT.format("never_joins.py"), line)
    assert stall["message"].startswith("rank 0 waited ")
    assert " s in init_process_group() at fixtures/guard/tiny.py:" in stall["message"]
    assert f"rank 1 never arrived: rank 1 is at fixtures/guard/never_joins.py:{line} in <module>" in stall["message"]
    assert_stall_diagnosed_in_time(stall)
    assert time.monotonic() - started < 90
