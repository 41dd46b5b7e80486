#!/usr/bin/env python
"""Does the cost of linting one file grow with its size, or with its square?

A benchmark, not a test: it exits 0 once the measurements ran (a missed target is reported, not
failed), 1 when a measurement itself failed. The corpus is generated: one file made of N copies of
a small training function (a DistributedSampler, a DataLoader loop over epochs, a `torch.save` per
epoch), all called from one `main()` that initialises the process group, as a long training
script would be. Every copy carries two real findings (DDP001: no set_epoch; DDP008: the save runs
on every rank), so a file the analysis gave up on (DDP999, the per-file time budget) shows.

Every measurement is a fresh `python -c` process that imports everything first, then times only
`lint_paths([file], Settings(select=("ALL",)), jobs=1, use_cache=False)`: wall time
(`time.perf_counter()`, what the target is judged on) and the process's CPU time
(`time.process_time()`, which a machine shared with other work disturbs far less). Sizes are
interleaved within a repeat, so drift hits every size alike, and medians quoted.

    python benchmarks/lint_scaling.py            # N = 100, 200, 400, 800; medians of 3
    python benchmarks/lint_scaling.py --quick    # N = 25, 50, 100, 200; one run each
    python benchmarks/lint_scaling.py --sizes 100,300 --repeat 5

Target: the time at the largest N over the time at the smallest (8× the functions, so linear is
8) is at most 10, and the largest file is analysed (its real findings, no DDP999).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

TARGET_RATIO = 10.0  # time(largest N) / time(smallest N), for sizes 8× apart; linear is 8
SIZES = (100, 200, 400, 800)
QUICK_SIZES = (25, 50, 100, 200)
CHILD_TIMEOUT = 600  # seconds; past the engine's own 60 s budget, so a given-up file still reports

HEADER = '''"""A generated training script: {n} copies of one training function."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

'''

FUNCTION = '''
def train_{i}(model, dataset, optimizer, epochs):
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        for batch, target in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch), target)
            loss.backward()
            optimizer.step()
        torch.save(model.state_dict(), "checkpoint_{i}.pt")
'''

MAIN = '''

def main(model, dataset, optimizer):
    dist.init_process_group("nccl")
{calls}


if __name__ == "__main__":
    main(None, None, None)
'''

# Each copy of FUNCTION has these findings; nothing else in the file has any.
EXPECTED_PER_COPY = {"DDP001": 1, "DDP008": 1}


def generate(n: int) -> str:
    calls = "\n".join(f"    train_{i}(model, dataset, optimizer, 10)" for i in range(n))
    return HEADER.format(n=n) + "".join(FUNCTION.format(i=i) for i in range(n)) + MAIN.format(calls=calls)


_CHILD = r"""
import collections, json, sys, time
from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_paths
from ddpdoctor.lint.rules.base import all_rules
import libcst
settings = Settings(select=("ALL",))
all_rules(); settings.enabled_codes()  # rule modules and catalog loaded before the clock starts
start, cpu = time.perf_counter(), time.process_time()
run, _ = lint_paths([sys.argv[1]], settings, jobs=1, use_cache=False)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({
    "seconds": seconds,
    "cpu": cpu,
    "codes": collections.Counter(f.code for f in run.findings),
    "errors": run.errors,
}))
"""


class ChildFailed(RuntimeError):
    pass


def measure(path: Path) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path)],
            cwd=path.parent, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"{path.name}: the child ran past {CHILD_TIMEOUT} s") from None
    if proc.returncode != 0:
        raise ChildFailed(f"{path.name}: the child exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def verdict(n: int, codes: dict[str, int]) -> tuple[bool, str]:
    """Whether the file was analysed with all its real findings (and no DDP999)."""
    expected = {code: count * n for code, count in EXPECTED_PER_COPY.items()}
    if codes.get("DDP999"):
        return False, "given up (DDP999)"
    if dict(codes) != expected:
        return False, f"unexpected findings {dict(codes)} (expected {expected})"
    return True, ", ".join(f"{count} {code}" for code, count in sorted(codes.items()))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, one run each")
    parser.add_argument("--sizes", help="comma-separated numbers of functions (default %s)" % ",".join(map(str, SIZES)))
    parser.add_argument("--repeat", type=int, default=None, help="runs per size, medians quoted (default 3; 1 with --quick)")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else (QUICK_SIZES if args.quick else SIZES)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    if repeat < 1 or not sizes or min(sizes) < 1:
        parser.error("--repeat and every size must be at least 1")

    scratch = Path(tempfile.mkdtemp(prefix="ddpdoctor-scaling-"))
    try:
        files: dict[int, Path] = {}
        for n in sizes:
            files[n] = scratch / f"train_{n}.py"
            files[n].write_text(generate(n), encoding="utf-8")
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        cpu: dict[int, list[float]] = {n: [] for n in sizes}
        outcome: dict[int, tuple[bool, str]] = {}
        for i in range(repeat):
            for n in sizes:
                result = measure(files[n])
                samples[n].append(result["seconds"])
                cpu[n].append(result["cpu"])
                outcome[n] = verdict(n, result["codes"]) if not result["errors"] else (False, "; ".join(result["errors"]))
                print(f"  #{i + 1} N={n:<5} {result['seconds']:8.3f} s  (CPU {result['cpu']:.3f} s)  {outcome[n][1]}", flush=True)
    except ChildFailed as error:
        print(f"lint_scaling: a measurement failed: {error}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    smallest, largest = min(sizes), max(sizes)
    print(f"\nOne file of N training functions, `--select ALL`, one worker; medians of {repeat} run(s), "
          f"each a fresh process, work timed after imports.\n")
    print(f"| N functions | lines | wall (s) | × N={smallest} | CPU (s) | × N={smallest} | per function, CPU (ms) | findings |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    base, cpu_base = statistics.median(samples[smallest]), statistics.median(cpu[smallest])
    for n in sizes:
        seconds, cpu_seconds = statistics.median(samples[n]), statistics.median(cpu[n])
        lines = generate(n).count("\n")
        print(f"| {n} | {lines:,} | {seconds:.3f} | {seconds / base:.2f} | {cpu_seconds:.3f} | {cpu_seconds / cpu_base:.2f} | "
              f"{1000 * cpu_seconds / n:.2f} | {outcome[n][1]} |")
    ratio = statistics.median(samples[largest]) / base
    cpu_ratio = statistics.median(cpu[largest]) / cpu_base
    linear = largest / smallest
    print("\nTargets:")
    ok = ratio <= TARGET_RATIO * linear / 8
    print(f"  [{'MET' if ok else 'MISSED'}] time(N={largest}) / time(N={smallest}) ≤ "
          f"{TARGET_RATIO * linear / 8:g} (linear is {linear:g}): {ratio:.2f} (CPU time: {cpu_ratio:.2f})")
    analysed, what = outcome[largest]
    print(f"  [{'MET' if analysed else 'MISSED'}] N={largest} analysed with its real findings: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
