"""How long `ddpdoctor probe --nproc 4 --backend gloo` takes to reach its verdict, against the floor:
a bare script started through the same elastic launcher with the same LaunchConfig settings that only
initialises the process group and does one all-reduce. Both are timed as whole subprocesses
(interpreter start and `import torch` included, as a user would see them); the median of several
repetitions is reported.

    python benchmarks/probe_speed.py [--reps 5] [--nproc 4]

Target: the full probe within 2x of the floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FLOOR_SCRIPT = r"""
import os, sys, tempfile
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

def work():
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    dist.destroy_process_group()

if __name__ == "__main__":
    nproc = int(sys.argv[1])
    os.environ["OMP_NUM_THREADS"] = "1"
    # The same settings ddpdoctor.probe.launch uses.
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id="floor", rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0", rdzv_configs={"join_timeout": 60, "read_timeout": 60, "is_host": True,
        "last_call_timeout": 1, "close_timeout": 5}, max_restarts=0, start_method="fork", monitor_interval=0.05,
        local_addr="127.0.0.1",
        logs_specs=DefaultLogsSpecs(log_dir=tempfile.mkdtemp(prefix="probe-floor-"), redirects=Std.ALL),
    )
    elastic_launch(config, work)()
"""


def _time(cmd: list[str]) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=4)
    args = parser.parse_args()
    floor_cmd = [sys.executable, "-c", FLOOR_SCRIPT, str(args.nproc)]
    # The real CLI (`ddpdoctor probe`), without the console-script shim in front of it.
    probe_cmd = [sys.executable, "-m", "ddpdoctor", "probe", "--nproc", str(args.nproc), "--backend", "gloo",
                 "--format", "json"]
    import_cmd = [sys.executable, "-c", "import torch"]
    # Interleave the runs so that machine noise hits both sides alike; one warm-up each (page cache).
    _time(floor_cmd)
    _time(probe_cmd)
    floor, probe, bare = [], [], []
    for _ in range(args.reps):
        floor.append(_time(floor_cmd))
        probe.append(_time(probe_cmd))
        bare.append(_time(import_cmd))
    rows = [
        ("python -c 'import torch'", statistics.median(bare), min(bare)),
        (f"floor: launcher + init + 1 all-reduce ({args.nproc} ranks)", statistics.median(floor), min(floor)),
        (f"ddpdoctor probe --nproc {args.nproc} --backend gloo", statistics.median(probe), min(probe)),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  median (s)  min (s)")
    for name, med, low in rows:
        print(f"{name:<{width}}  {med:10.2f}  {low:7.2f}")
    ratio = statistics.median(probe) / statistics.median(floor)
    print(f"{'ratio probe / floor (medians)':<{width}}  {ratio:10.2f}x   (target <= 2x; {args.reps} reps, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
