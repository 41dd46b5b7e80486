"""`ddpdoctor env` end to end on this (GPU-less) machine: CliRunner and a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.env.command import env

REPO = Path(__file__).resolve().parents[2]
# Variables a developer's shell may carry that would change the findings under test.
SCRUB = [
    k
    for k in os.environ
    if k.startswith(("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "TORCHELASTIC_"))
    or k
    in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "FORCE_COLOR")
]


def clean_env(**extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in SCRUB}
    environ.update(extra)
    return environ


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in SCRUB:
        monkeypatch.delenv(key, raising=False)
    return CliRunner()


def _torch_has_nccl() -> bool:
    try:
        import torch.distributed as dist

        return bool(dist.is_nccl_available())
    except ImportError:
        return False


def test_json_report_on_this_host(runner: CliRunner) -> None:
    result = runner.invoke(env, ["--format", "json"])
    payload = json.loads(result.output)
    assert set(payload) == {"software", "gpus", "topology", "launch", "findings"}
    assert payload["software"]["python"].count(".") == 2
    assert payload["software"]["nvml"]["message"].startswith("NVML:")
    if not payload["gpus"]:
        assert payload["topology"] is None
    assert any(i["name"] == "lo" for i in payload["launch"]["interfaces"])
    severities = {f["severity"] for f in payload["findings"]}
    assert result.exit_code == (1 if severities & {"error", "warning"} else 0)


def test_clean_host_exits_zero_and_warnings_exit_one(runner: CliRunner) -> None:
    clean = runner.invoke(env, [])
    assert clean.exit_code == 0, clean.output
    assert "## Software" in clean.output and "All checks passed!" in clean.output
    warned = runner.invoke(env, [], env={"NCCL_IB_DISABLE": "1"})
    assert warned.exit_code == 1
    assert "ENV004" in warned.output


def test_info_findings_alone_exit_zero(runner: CliRunner) -> None:
    result = runner.invoke(env, ["--failing"], env={"OMP_NUM_THREADS": "1"})
    assert "ENV007" in result.output
    assert result.exit_code == 0


@pytest.mark.skipif(_torch_has_nccl(), reason="this torch has NCCL")
def test_missing_nccl_backend_is_an_error(runner: CliRunner) -> None:
    result = runner.invoke(env, ["--backend", "nccl", "--nproc", "2", "--format", "json"])
    assert result.exit_code == 1
    codes = {f["code"] for f in json.loads(result.output)["findings"]}
    assert {"ENV009", "ENV006"} <= codes


@pytest.mark.parametrize(
    "args",
    [["--nproc", "0"], ["--nproc", "two"], ["--nproc", "100000"], ["--nproc", "nan"], ["--nproc", "1e20"],
     ["--nproc", "2.5"], ["--backend", "tcp"], ["--format", "xml"], ["--bogus"]],
)
def test_usage_errors_are_one_line_exit_two(runner: CliRunner, args: list[str]) -> None:
    result = runner.invoke(env, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error: env:")
    assert "Traceback" not in result.output


def test_output_file(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "env.json"
    result = runner.invoke(env, ["--format", "json", "--output-file", str(target)])
    assert result.exit_code == 0 and result.output == ""
    assert json.loads(target.read_text())["findings"] == []
    bad = runner.invoke(env, ["--output-file", str(tmp_path / "missing" / "env.txt")])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
    assert bad.output.startswith("ddpdoctor: error: --output-file: cannot write ")
    directory = runner.invoke(env, ["--output-file", str(tmp_path)])
    assert directory.exit_code == 2 and "is a directory" in directory.output


def test_nproc_bounds_are_inclusive(runner: CliRunner) -> None:
    from ddpdoctor.env.command import MAX_NPROC

    assert runner.invoke(env, ["--nproc", str(MAX_NPROC), "--format", "json"]).exit_code in (0, 1)
    over = runner.invoke(env, ["--nproc", str(MAX_NPROC + 1)])
    assert over.exit_code == 2
    assert over.output == (f"ddpdoctor: error: env: Invalid value for '--nproc': '{MAX_NPROC + 1}' is not an integer "
                           f"from 1 to {MAX_NPROC}\n")


def test_real_command_in_a_subprocess_is_plain_when_piped() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "env", "--nproc", "3", "--failing"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env=clean_env(NCCL_P2P_DISABLE="1"),
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert "\x1b[" not in result.stdout
    assert result.returncode == 1
    for heading in ("## Software", "## GPUs", "## Launch environment", "## Findings"):
        assert heading in result.stdout
    assert "\nENV004 NCCL_P2P_DISABLE=1" in result.stdout  # no file, so no location
    assert "ENV012" in result.stdout and "ENV007" in result.stdout
