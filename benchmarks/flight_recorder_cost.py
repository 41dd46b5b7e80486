"""What torch's Flight Recorder, which `ddpdoctor guard` turns on in every rank, costs per collective: a one-rank gloo
process group (no network, so the collective's own cost is small and the recorder's shows) all-reduces one float
many times, with TORCH_FR_BUFFER_SIZE=0 (the floor) and at the guard's size, in fresh processes alternating in
order. CPU time of the process (all its threads), which a shared machine's load disturbs less than wall time;
medians, and the recorder's cost in microseconds per collective and as a ratio to the floor.

    python benchmarks/flight_recorder_cost.py [--runs 8] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(calls: int) -> float:
    """In a child: CPU microseconds per all_reduce, the median of 7 repeats after a warm-up."""
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(1)
    for _ in range(calls):
        dist.all_reduce(tensor)
    repeats = []
    for _ in range(7):
        started = time.process_time()
        for _ in range(calls):
            dist.all_reduce(tensor)
        repeats.append((time.process_time() - started) / calls * 1e6)
    dist.destroy_process_group()
    return statistics.median(repeats)


def one_run(entries: str, calls: int) -> float:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE=entries,
               OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    result = subprocess.run([sys.executable, __file__, "--child", str(calls)], env=env, capture_output=True,
                            text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"the measuring process failed:\n{result.stderr[-2000:]}")
    return float(result.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(f"{measure(args.child):.3f}")
        return
    from ddpdoctor.guard.flight.live import ENTRIES

    sizes = ("0", str(ENTRIES))
    seconds: dict[str, list[float]] = {size: [] for size in sizes}
    for index in range(args.runs):
        for size in sizes if index % 2 == 0 else sizes[::-1]:
            seconds[size].append(one_run(size, args.calls))
        print(f"run {index + 1}: " + ", ".join(f"TORCH_FR_BUFFER_SIZE={s} {seconds[s][-1]:.1f} us" for s in sizes),
              flush=True)
    floor, on = (statistics.median(seconds[s]) for s in sizes)
    print(f"CPU per all_reduce: recorder off (floor) median {floor:.1f} us, on ({ENTRIES} entries) median {on:.1f} us: "
          f"the recorder adds {on - floor:.1f} us per collective, ratio {on / floor:.3f}")


if __name__ == "__main__":
    main()
