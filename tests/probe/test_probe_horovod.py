"""`ddpdoctor probe --framework horovod` for real: Horovod ranks through horovod.runner.run (gloo
controller, loopback), the same report, exit codes and fault self-test as the torch probe."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid

import pytest
from click.testing import CliRunner

from ddpdoctor.probe.command import probe
from hvd_helpers import require_horovod
from probe_helpers import REPO, assert_no_leftovers, bad_ranks, interrupt_probe, probe_env, run_probe

TIMEOUT = "3"
HVD_CHECKS = ["world", "liveness", "allreduce", "broadcast-parameters", "optimizer-step", "optimizer-state", "lr-scaling"]


def test_missing_horovod_is_one_line_naming_the_install_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "horovod", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    result = CliRunner().invoke(probe, ["--framework", "horovod", "--nproc", "2"])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert "Horovod is not installed" in result.output and "scripts/install-horovod" in result.output


@pytest.mark.slow
def test_two_horovod_ranks_pass_every_check_json() -> None:
    require_horovod()
    run = run_probe("--framework", "horovod", "--nproc", "2", "--timeout", TIMEOUT, "--format", "json", timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = run.json()
    assert report["framework"] == "horovod" and report["world_size"] == 2
    assert [c["name"] for c in report["checks"]] == HVD_CHECKS
    for check in report["checks"]:
        assert check["status"] == "pass", check
        assert [e["rank"] for e in check["ranks"]] == [0, 1]
    allreduce = run.check("allreduce")
    assert allreduce["ranks"][0]["detail"]["cases"] >= 20
    # bfloat16 is refused by Horovod 0.28.1: a skip with the reason, not a failure.
    assert "bfloat16" in allreduce["ranks"][0]["detail"]["skipped"]
    assert "lr 0.1 scales to 0.2" in run.check("lr-scaling")["summary"]
    assert "rounding bound" in run.check("optimizer-step")["summary"]
    assert run.stderr.strip() == ""  # Horovod's own chatter stays out of the user's terminal


def test_rank_numbers_are_padded_as_horovod_pads_them_and_one_rank_too() -> None:
    """Horovod's gloo launcher names each rank's output `rank.NN`, padded by log10(size - 1): a math
    domain error for one rank. Ours pads the same for every size Horovod handles, and 1 as well."""
    from ddpdoctor.probe.hvd_launch import padded_rank

    require_horovod()
    from horovod.runner.gloo_run import _pad_rank

    for size in (2, 3, 9, 10, 11, 99, 100, 101, 1000, 1001):
        for rank in (0, 1, size - 1):
            assert padded_rank(rank, size) == _pad_rank(rank, size)
    assert padded_rank(0, 1) == "0"


@pytest.mark.slow
def test_one_horovod_rank_passes_every_check() -> None:
    require_horovod()
    run = run_probe("--framework", "horovod", "--nproc", "1", "--timeout", TIMEOUT, "--format", "json", timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = run.json()
    assert report["world_size"] == 1 and [c["status"] for c in report["checks"]] == ["pass"] * len(HVD_CHECKS)


@pytest.mark.slow
@pytest.mark.parametrize("fault, check, rank", [
    ("allreduce-corrupt:1", "allreduce", 1),
    ("param-desync:2", "broadcast-parameters", 2),
    ("hang:2", "liveness", 2),
    ("crash:0", "liveness", 0),
])
def test_injected_fault_fails_the_right_check_on_the_right_rank(fault: str, check: str, rank: int) -> None:
    require_horovod()
    run = run_probe("--framework", "horovod", "--nproc", "3", "--timeout", TIMEOUT, "--format", "json",
                    "--inject-fault", fault, timeout=240)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    report = run.json()
    failed = [c["name"] for c in report["checks"] if c["status"] in ("fail", "error")]
    assert failed == [check], report["verdict"]
    assert bad_ranks(run.check(check)) == [rank]
    assert f"rank {rank}" in report["verdict"]
    if fault.startswith("hang"):
        entry = run.check(check)["ranks"][rank]
        assert entry["detail"]["missing"] is True and "killed by the probe" in entry["message"]
    if fault.startswith("crash"):
        assert "InjectedCrash" in run.check(check)["ranks"][rank]["message"]
    # Within its budget: start-up, the check's timeout (scaled for 3 ranks on 2 cores), grace.
    assert report["launch_s"] < 90


@pytest.mark.slow
def test_external_horovodrun_runs_the_worker_module() -> None:
    require_horovod()
    horovodrun = shutil.which("horovodrun", path=str(REPO / ".venv" / "bin")) or shutil.which("horovodrun")
    if horovodrun is None:
        horovodrun_cmd = [sys.executable, "-m", "horovod.runner.launch"]
    else:
        horovodrun_cmd = [horovodrun]
    mark = uuid.uuid4().hex
    proc = subprocess.run(
        [*horovodrun_cmd, "-np", "2", "-H", "localhost:2", "--gloo", "--disable-cache",
         sys.executable, "-m", "ddpdoctor.probe", "--framework", "horovod", "--format", "json",
         "--timeout", TIMEOUT, "--checks", "world,liveness,allreduce,lr-scaling"],
        capture_output=True, text=True, timeout=240, env=probe_env(mark), cwd=REPO,
    )
    assert_no_leftovers(mark)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # horovodrun prefixes each line of a rank's output with "[rank]<stdout>:".
    lines = [line.split("<stdout>:", 1)[1] for line in proc.stdout.splitlines() if line.startswith("[0]<stdout>:")]
    text = "\n".join(lines)
    report = json.loads(text[text.index("{"):])
    assert [c["status"] for c in report["checks"]] == ["pass"] * 4
    assert report["world_size"] == 2 and report["framework"] == "horovod"


@pytest.mark.slow
def test_ctrl_c_ends_a_horovod_probe_at_once_as_interrupted() -> None:
    require_horovod()
    code, err, took = interrupt_probe(["--framework", "horovod", "--nproc", "2", "--timeout", "30",
                                       "--inject-fault", "hang:1"], whole_group=True)
    assert code == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "ddpdoctor probe: interrupted"
    assert took < 5
