#!/usr/bin/env python
"""What the per-file isolation costs: `lint_paths(-j 1)` over torch/distributed/*.py with the
guards (depth pre-check, big-stack thread with a time budget) against the same run with both
replaced by a plain call (the floor), interleaved, medians of CPU time (the machine is shared:
CPU time is what the guards add; wall time mostly measures the neighbours).

    python benchmarks/isolation_overhead.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time
from typing import Any, Callable

import torch

from ddpdoctor.config import Settings
from ddpdoctor.lint import engine, isolation


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    files = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "distributed", "*.py")))
    settings = Settings(select=("ALL",))
    guarded_deep, guarded_contain = isolation.too_deep, isolation.contain

    def bare(work: Callable[[], Any], timeout_s: float) -> Any:
        return work()

    def run(floor: bool) -> float:
        isolation.too_deep = (lambda text, path: None) if floor else guarded_deep  # type: ignore[assignment]
        isolation.contain = bare if floor else guarded_contain  # type: ignore[assignment]
        started = time.process_time()
        engine.lint_paths(files, settings, jobs=1, use_cache=False)
        return time.process_time() - started

    floor: list[float] = []
    guarded: list[float] = []
    for _ in range(args.repeat):
        floor.append(run(True))
        guarded.append(run(False))
    flagged = sum(isolation._may_be_deep(open(f, encoding="utf-8").read()) for f in files)
    print(f"{len(files)} files, {flagged} flagged for the exact depth check")
    print(f"floor   median {statistics.median(floor):.2f} s CPU")
    print(f"guarded median {statistics.median(guarded):.2f} s CPU")
    print("floor", [round(x, 2) for x in floor]); print("guarded", [round(x, 2) for x in guarded])
    print(f"ratio guarded / floor: {statistics.median(guarded) / statistics.median(floor):.3f}")


if __name__ == "__main__":
    main()
