"""scripts/gpu-check in its CPU mode: real runs of the script (real gloo ranks), with libcst blocked as
on the GPU machine, where it is not installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-check"
GPU_STEPS = ("probe-nccl", "probe-nccl-parity", "probe-nccl-bandwidth", "probe-nccl-corrupt",
             "amp-ddp", "guard-amp-clean", "guard-grd007", "guard-grd007-clean", "guard-amp-desync")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the mode without a GPU")


@pytest.fixture(scope="module")
def no_libcst(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment where `import libcst` fails in every process the script starts."""
    blocker = tmp_path_factory.mktemp("blocked") / "libcst"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('libcst is blocked for this test')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(blocker.parent)  # the script adds the checkout itself
    env.pop("DDPDOCTOR_GUARD", None)
    assert subprocess.run([sys.executable, "-c", "import libcst"], env=env, capture_output=True).returncode == 1
    return env


def gpu_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=150)


def row(report: str, step: str) -> list[str]:
    """The summary table's cells for one step."""
    line = next(line for line in report.splitlines() if line.startswith(f"| {step} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_cpu_mode_runs_the_cpu_steps_and_names_each_skipped_gpu_step(tmp_path: Path, no_libcst: dict[str, str]) -> None:
    report_path, log_path = tmp_path / "out" / "REPORT.md", tmp_path / "out" / "gpu-check.log"
    run = gpu_check(no_libcst, "--report", str(report_path), "--log", str(log_path), "--budget", "120")
    assert run.returncode == 0, run.stderr
    report = report_path.read_text()
    for step in ("cuda-info", "env", "env-json", "probe-gloo"):
        assert row(report, step)[1] == "passed", (step, report)
    assert "all 8 checks passed on 2 ranks" in row(report, "probe-gloo")[3]
    assert "PYTHONPATH=$PWD python3 -m ddpdoctor probe --nproc 2 --backend gloo --device cpu" in report
    lack = next(line for line in report.splitlines() if "skipped for lack of a GPU" in line)
    assert "torch was built without CUDA" in lack
    for step in GPU_STEPS:
        assert step in lack
        assert row(report, step)[1] == "skipped"
        assert re.search(rf"\] {step}: SKIPPED for lack of a GPU", run.stderr), step
    assert f"skipped for lack of a GPU: {', '.join(GPU_STEPS)}" in run.stderr
    assert re.search(r"\[4/13\] probe-gloo: running \(timeout \d+ s, \d+ s of the budget left\)", run.stderr)
    log = log_path.read_text()
    assert "===== probe-gloo: passed" in log and '"verdict": "all 8 checks passed on 2 ranks"' in log


def test_a_planted_failure_is_reported_failed_not_skipped(tmp_path: Path, no_libcst: dict[str, str]) -> None:
    report_path = tmp_path / "REPORT.md"
    run = gpu_check(no_libcst, "--report", str(report_path), "--only", "probe-gloo",
                    "--inject-fault", "allreduce-corrupt:1", "--budget", "120")
    assert run.returncode == 1, run.stderr
    report = report_path.read_text()
    cells = row(report, "probe-gloo")
    assert cells[1] == "failed" and "allreduce fail" in cells[3], cells
    assert "| probe-nccl |" not in report  # not chosen: neither run nor reported as skipped
    assert "result: 1 passed, 1 failed, 0 skipped" in report
    assert "--inject-fault allreduce-corrupt:1" in report
    assert "1 failed or not run (probe-gloo)" in run.stderr


def test_a_spent_budget_fails_the_steps_it_left_out(tmp_path: Path) -> None:
    report_path = tmp_path / "REPORT.md"
    run = gpu_check(dict(os.environ), "--report", str(report_path), "--only", "env", "--budget", "5.5")
    assert run.returncode == 1
    cells = row(report_path.read_text(), "env")
    assert cells[1] == "skipped" and cells[3].startswith("budget spent"), cells


def test_unknown_step_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run = gpu_check(dict(os.environ), "--report", str(tmp_path / "R.md"), "--only", "probe-gloo,nosuch")
    assert run.returncode == 2
    assert "--only: unknown step(s) nosuch" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "R.md").exists()
