"""What `ddpdoctor guard` costs a training job at its defaults: the same small DDP loop (gloo on CPU,
2 ranks, benchmarks/guard_train_loop.py) run unguarded (the floor) and under `ddpdoctor guard`,
interleaved in one run so that both see the same machine load. The loop times itself (start-up
excluded); the medians and their ratio are reported.

    python benchmarks/guard_overhead.py [--rounds 7] [--epochs 4] [--nproc 2]

Target: guarded / unguarded <= 1.03.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOOP = REPO / "benchmarks" / "guard_train_loop.py"
# The ranks are forked from one parent that imported torch once (torch's elastic API, like torchrun).
LAUNCH = REPO / "fixtures" / "guard" / "forklaunch.py"


def loop_seconds(guarded: bool, nproc: int, epochs: int) -> tuple[float, float]:
    command = [sys.executable, str(LAUNCH), str(nproc), str(LOOP), str(epochs)]
    if guarded:
        command = [sys.executable, "-m", "ddpdoctor", "guard", "--", *command]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    for line in result.stdout.splitlines():
        if line.startswith("LOOP_S="):
            wall, cpu = (float(part.split("=", 1)[1]) for part in line.split())
            return wall, cpu
    raise SystemExit(f"no timing from {'guarded' if guarded else 'unguarded'} run (exit {result.returncode}):\n"
                     f"{result.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    plain: list[tuple[float, float]] = []
    guarded: list[tuple[float, float]] = []
    for round_index in range(args.rounds):
        # Alternate which goes first, so that a drift in load does not favour one side.
        order = (False, True) if round_index % 2 == 0 else (True, False)
        for is_guarded in order:
            (guarded if is_guarded else plain).append(loop_seconds(is_guarded, args.nproc, args.epochs))
        print(f"round {round_index + 1}: unguarded {plain[-1][0]:.3f} s wall / {plain[-1][1]:.3f} s cpu, "
              f"guarded {guarded[-1][0]:.3f} s wall / {guarded[-1][1]:.3f} s cpu", flush=True)
    steps = args.epochs * 4096 // (32 * args.nproc)
    for index, what in ((0, "wall"), (1, "rank 0 cpu")):
        floor = statistics.median(p[index] for p in plain)
        cost = statistics.median(g[index] for g in guarded)
        print(f"{what:>10}: unguarded median {floor:.3f} s ({floor / steps * 1000:.2f} ms/step over {steps} steps), "
              f"guarded median {cost:.3f} s ({cost / steps * 1000:.2f} ms/step), ratio {cost / floor:.3f} "
              "(target <= 1.03)")


if __name__ == "__main__":
    main()
