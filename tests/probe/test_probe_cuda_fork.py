"""The probe's parent forks its ranks, so it must not poison CUDA for them first.

torch's LaunchConfig asks torch.cuda.is_available(); unless GPUs are counted through NVML that
registers CUDA's fork poisoning, and on a GPU machine every forked rank then died at its first CUDA
call (found by scripts/gpu-check on an H100). A real gloo launch here records what is_available
sees: the NVML-based check must be on at that moment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from probe_helpers import REPO

SCRIPT = """
import json, os, torch
seen = []
real = torch.cuda.is_available
def is_available():
    seen.append(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))
    return real()
torch.cuda.is_available = is_available
from ddpdoctor.probe.options import ProbeOptions
from ddpdoctor.probe.runner import run_probe
report = run_probe(ProbeOptions(nproc=2, backend="gloo", device="cpu", checks=("world",)))
print(json.dumps({"seen": seen, "exit_code": report["exit_code"]}))
"""


def test_launch_counts_gpus_through_nvml_so_forked_ranks_can_use_cuda() -> None:
    env = dict(os.environ)
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 0
    assert result["seen"] and set(result["seen"]) == {"1"}, result
