"""scripts/install-horovod: what CI relies on, and its failure modes as one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install-horovod"
sys.path.insert(0, str(ROOT / "tests" / "probe"))
from hvd_helpers import require_horovod  # noqa: E402


def test_the_script_is_strict_bash_and_patches_both_cmake_files() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    assert os.access(SCRIPT, os.X_OK)
    assert "set -euo pipefail" in text
    assert '"$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"' in text
    for flag in ("HOROVOD_WITH_PYTORCH=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITHOUT_MPI=1", "HOROVOD_WITHOUT_TENSORFLOW=1",
                 "HOROVOD_WITHOUT_MXNET=1", "HOROVOD_CPU_OPERATIONS=gloo", "--no-build-isolation", "--no-deps"):
        assert flag in text, flag
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_ci_installs_horovod_before_the_tests_and_forbids_skipping_them() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    install = next(i for i, line in enumerate(ci) if "scripts/install-horovod" in line)
    require = ci.index("export DDPDOCTOR_REQUIRE_HOROVOD=1")
    tests = next(i for i, line in enumerate(ci) if line.endswith("-m pytest"))
    assert install < require < tests


def test_a_missing_interpreter_is_one_line_and_exit_2() -> None:
    proc = subprocess.run([str(SCRIPT)], env={**os.environ, "PYTHON": "/nonexistent/python"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == "install-horovod: no Python interpreter at '/nonexistent/python' (set PYTHON=...)\n"


def test_an_interpreter_without_torch_is_told_to_install_it_first(tmp_path: Path) -> None:
    # An isolated interpreter (-I -S: no site-packages) stands in for an environment without torch.
    bare = tmp_path / "python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    proc = subprocess.run([str(SCRIPT)], env={**os.environ, "PYTHON": str(bare)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("install-horovod: torch is not installed in ") and proc.stderr.count("\n") == 1


@pytest.mark.slow
def test_a_second_run_is_a_quick_no_op() -> None:
    require_horovod()
    proc = subprocess.run([str(SCRIPT)], env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "horovod 0.28.1 already installed" in proc.stderr
