"""The probe for real: gloo ranks on CPU, launched through torch's elastic launcher.

Each run is checked for leftover processes (see probe_helpers.run_probe).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from process_scan import children

from probe_helpers import (PROBE, REPO, assert_no_leftovers, bad_ranks, free_port, interrupt_probe, probe_env,
                           processes_with_mark, run_probe)

pytestmark = pytest.mark.slow
TIMEOUT = "2"


def test_four_ranks_pass_every_check_json() -> None:
    run = run_probe("--nproc", "4", "--backend", "gloo", "--timeout", TIMEOUT, "--format", "json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = run.json()
    assert [c["name"] for c in report["checks"]] == [
        "world", "liveness", "allreduce", "param-sync", "ddp-parity", "syncbn", "sampler", "bandwidth"]
    for check in report["checks"]:
        assert check["status"] == "pass", check
        assert [e["rank"] for e in check["ranks"]] == [0, 1, 2, 3]
        assert all(isinstance(e["rank"], int) and e["status"] == "pass" for e in check["ranks"])
    assert report["environment"]["world_size"] == 4
    assert report["environment"]["backend"] == "gloo"
    assert isinstance(report["environment_findings"], list)
    # ddpdoctor.env's header when it is installed; otherwise the report says why it is missing.
    assert report["environment"].get("summary_lines") or report["environment"].get("env_unavailable")
    # The measured details are there, not just a status.
    assert report["checks"][2]["ranks"][0]["detail"]["cases"] >= 25
    assert "busbw_GBps" in report["checks"][-1]["detail"]["sweep"][0]
    assert "cross-rank statistic exchange" in report["checks"][5]["summary"]  # CPU SyncBN says what it checked
    assert "DDP001" in report["checks"][6]["summary"]


def test_text_output_has_table_and_verdict() -> None:
    run = run_probe("--nproc", "2", "--timeout", TIMEOUT, "--checks", "world,liveness,allreduce,sampler")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verdict: all 4 checks passed on 2 ranks" in run.stdout
    assert "r0" in run.stdout and "r1" in run.stdout
    assert "gloo on cpu" in run.stdout


@pytest.mark.parametrize(
    "fault, check, rank",
    [
        ("allreduce-corrupt:1", "allreduce", 1),
        ("param-desync:0", "param-sync", 0),
        ("hang:2", "liveness", 2),
        ("crash:1", "liveness", 1),
    ],
)
def test_injected_fault_is_caught_by_the_right_check_and_rank(fault: str, check: str, rank: int) -> None:
    run = run_probe("--nproc", "3", "--timeout", TIMEOUT, "--format", "json", "--inject-fault", fault)
    assert run.returncode == 1, run.stdout + run.stderr
    report = run.json()
    failed = [c["name"] for c in report["checks"] if c["status"] in ("fail", "error")]
    assert failed == [check], report["verdict"]
    assert bad_ranks(run.check(check)) == [rank]
    assert f"rank {rank}" in report["verdict"]
    if fault.startswith("hang"):
        entry = run.check(check)["ranks"][rank]
        assert entry["detail"]["missing"] is True
        assert "did not report liveness" in entry["message"]
        # Caught by the heartbeat and killed once the others finished -- not by the overall deadline.
        assert "killed by the probe after the other ranks finished" in entry["message"]
        assert run.seconds < 120
    if fault.startswith("crash"):
        entry = run.check(check)["ranks"][rank]
        assert "InjectedCrash" in entry["message"]
        assert "injected crash on rank 1" in entry["detail"]["traceback"]
        assert report["failures"] and report["failures"][0]["rank"] == rank


def test_one_rank_that_hangs_is_named_by_the_parent_when_nobody_is_left_to_report() -> None:
    """With one rank (a one-GPU machine) no peer's exchange can name it: the parent sees its progress
    file stand still past the check's bound (3 x timeout + 2 s = 8 s) and kills it, long before the
    overall deadline (60 s join + 8 checks x 8 s + 10 s = 134 s)."""
    run = run_probe("--nproc", "1", "--timeout", TIMEOUT, "--format", "json", "--inject-fault", "hang:0")
    assert run.returncode == 1, run.stdout + run.stderr
    report = run.json()
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] == ["liveness"], report["verdict"]
    liveness = run.check("liveness")
    entry = liveness["ranks"][0]
    assert entry["detail"]["missing"] is True
    assert entry["message"] == ("rank 0 did not report liveness within 8s: hung, dead, or its node was lost; "
                                "killed by the probe after no rank made progress for 8s")
    assert liveness["advice"].startswith("rank 0 stopped responding.")
    assert run.check("world")["status"] == "pass"
    later = run.check("allreduce")
    assert later["status"] == "skip" and later["summary"] == "not run: rank 0 stopped responding during liveness"
    assert "rank 0" in report["verdict"]
    assert run.seconds < 60  # typically ~15 s: 8 s of silence after start-up and the first check


def test_every_rank_hanging_at_once_is_named_without_waiting_for_the_deadline() -> None:
    """All ranks stuck in the same place (a broken link under a collective): nobody reports anybody."""
    run = run_probe("--nproc", "2", "--timeout", TIMEOUT, "--format", "json", "--inject-fault", "hang:0",
                    "--inject-fault", "hang:1", "--checks", "world,liveness,allreduce")
    assert run.returncode == 1, run.stdout + run.stderr
    liveness = run.check("liveness")
    assert bad_ranks(liveness) == [0, 1]
    for entry in liveness["ranks"]:
        assert entry["message"].endswith("killed by the probe after no rank made progress for 8s"), entry
    assert liveness["advice"].startswith("ranks 0, 1 stopped responding.")
    assert run.check("allreduce")["summary"] == "not run: ranks 0, 1 stopped responding during liveness"
    assert run.seconds < 60  # the overall deadline: 60 s join + 3 checks x 8 s + 10 s = 94 s


def test_one_rank_that_crashes_is_reported_as_a_crash() -> None:
    run = run_probe("--nproc", "1", "--timeout", TIMEOUT, "--format", "json", "--inject-fault", "crash:0",
                    "--checks", "world,liveness,allreduce")
    assert run.returncode == 1, run.stdout + run.stderr
    report = run.json()
    entry = run.check("liveness")["ranks"][0]
    assert run.check("liveness")["status"] == "fail"
    assert "InjectedCrash" in entry["message"] and "killed_by_probe" not in entry["detail"]
    assert "injected crash on rank 0" in entry["detail"]["traceback"]
    assert report["failures"] and report["failures"][0]["rank"] == 0


def test_one_healthy_rank_passes_every_check() -> None:
    run = run_probe("--nproc", "1", "--timeout", TIMEOUT, "--format", "json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = run.json()
    assert [c["status"] for c in report["checks"] if c["status"] not in ("pass", "skip")] == [], report["verdict"]
    assert run.check("liveness")["status"] == "pass"


def test_crash_shows_the_traceback_in_text_output() -> None:
    run = run_probe("--nproc", "2", "--timeout", TIMEOUT, "--inject-fault", "crash:0", "--checks", "world,liveness,allreduce")
    assert run.returncode == 1
    assert "InjectedCrash: injected crash on rank 0" in run.stdout
    assert "next:" in run.stdout


def test_external_launcher_runs_the_worker_module() -> None:
    mark = uuid.uuid4().hex
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "ddpdoctor.probe", "--format", "json",
         "--timeout", TIMEOUT, "--checks", "world,liveness,allreduce"],
        capture_output=True, text=True, timeout=120, env=probe_env(mark), cwd=REPO,
    )
    assert_no_leftovers(mark)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "start-up still running" not in proc.stderr  # a normal start-up is no stall
    start = proc.stdout.index("{")
    report = json.loads(proc.stdout[start:])
    assert [c["status"] for c in report["checks"]] == ["pass", "pass", "pass"]
    assert report["world_size"] == 2


def _start_node(node_rank: int, port: int, mark: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*PROBE, "--nnodes", "2", "--node-rank", str(node_rank), "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--nproc", "2", "--timeout", TIMEOUT, "--join-timeout", "30", "--format", "json", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=probe_env(mark), cwd=REPO,
    )


def test_two_node_agents_on_loopback_pass() -> None:
    port, mark = free_port(), uuid.uuid4().hex
    nodes = [_start_node(0, port, mark), _start_node(1, port, mark)]
    outs = [p.communicate(timeout=120) for p in nodes]
    assert_no_leftovers(mark)
    for p, (out, err) in zip(nodes, outs):
        assert p.returncode == 0, err[-3000:]
        report = json.loads(out)
        assert report["world_size"] == 4
        assert all(c["status"] == "pass" for c in report["checks"])
        assert [e["rank"] for e in report["checks"][0]["ranks"]] == [0, 1, 2, 3]
        assert {e["detail"]["node_rank"] for e in report["checks"][0]["ranks"]} == {0, 1}


def test_killed_node_is_reported_by_the_other_within_its_timeout() -> None:
    port, mark = free_port(), uuid.uuid4().hex
    node0 = _start_node(0, port, mark)
    # Rank 2 (on node 1) stalls at liveness, so node 1 is certainly still mid-run when killed.
    node1 = _start_node(1, port, mark, "--inject-fault", "hang:2")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(children(node1.pid)) < 2:
        time.sleep(0.05)
    assert len(children(node1.pid)) >= 2, "node 1 never started its ranks"
    time.sleep(0.5)
    killed_at = time.monotonic()
    node1.send_signal(signal.SIGKILL)
    node1.communicate(timeout=30)
    out, err = node0.communicate(timeout=60)
    took = time.monotonic() - killed_at
    assert_no_leftovers(mark)  # node 1's ranks died with their agent
    assert node0.returncode == 1, err[-3000:]
    report = json.loads(out)
    failing = [c for c in report["checks"] if c["status"] == "fail"]
    assert failing, report["verdict"]
    assert bad_ranks(failing[0]) == [2, 3]
    assert took < 20


def test_processes_with_mark_finds_live_processes() -> None:
    # The leftover detector must be able to fail: a marked sleeper is found, then gone once killed.
    mark = uuid.uuid4().hex
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=probe_env(mark))
    try:
        time.sleep(0.2)
        assert processes_with_mark(mark) == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert processes_with_mark(mark) == []


@pytest.mark.parametrize("whole_group", [False, True], ids=["probe-only", "process-group"])
def test_ctrl_c_ends_the_probe_at_once_as_interrupted(whole_group: bool) -> None:
    # A hung rank keeps the run going until the signal arrives.
    code, err, took = interrupt_probe(["--nproc", "2", "--timeout", "30", "--inject-fault", "hang:1"], whole_group)
    assert code == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "ddpdoctor probe: interrupted"
    assert "Traceback" not in err and "FAIL" not in err
    assert took < 5


def test_sixteen_healthy_ranks_on_few_cores_pass_low_precision_all_reduce() -> None:
    # Issue 15: a fixed bfloat16 tolerance failed every healthy rank at 9 or 16 ranks.
    run = run_probe("--nproc", "16", "--checks", "world,liveness,allreduce", "--format", "json", timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    allreduce = run.check("allreduce")
    assert allreduce["status"] == "pass" and len(allreduce["ranks"]) == 16
    assert "bfloat16" not in allreduce["ranks"][0]["detail"]["skipped"]
    from ddpdoctor.probe.options import cpu_count

    if cpu_count() < 16:
        assert "16 ranks on" in run.stderr and "timeouts scaled" in run.stderr


def test_plain_report_when_piped_is_unwrapped_lines() -> None:
    run = run_probe("--nproc", "2", "--timeout", TIMEOUT, "--checks", "world,liveness,sampler")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert not any(ch in run.stdout for ch in "┃│┏━╭") and "\x1b[" not in run.stdout  # no boxes, no colour
    table = lines[lines.index(next(line for line in lines if line.startswith("check "))):]
    assert table[0].split() == ["check", "r0", "r1", "verdict"]
    sampler = next(line for line in table if line.startswith("sampler "))
    # One check, one line, however long its summary (the old box table wrapped it at 80 columns).
    assert len(sampler) > 120 and sampler.endswith("(lint rule DDP001 missing-set-epoch)")
