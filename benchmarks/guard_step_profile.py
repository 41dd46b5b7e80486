"""The Python work the guard adds to each training step of a rank, counted by cProfile instead of by
the clock of a shared machine: the training loop of `guard_overhead.py` (benchmarks/guard_train_loop.py)
runs under `ddpdoctor guard` on 2 gloo ranks with rank 0's loop profiled, alternating with unguarded
runs profiled the same way. Reported per optimizer step: the time spent in ddpdoctor's own functions
(their own time, cProfile's `tottime`), the calls into them, and what torch's module call costs
with and without the guard (a module with a forward hook takes torch's slower call path).

    python benchmarks/guard_step_profile.py [--epochs 8] [--top 12] [--rounds 3]

The calls per step are exact. The times are the main thread's CPU time (time.thread_time, so that
the machine's load and the reporter thread do not count), medians over the runs; cProfile's own
overhead inflates them all about alike: compare them with each other, before and after a change,
not with guard_overhead.py's wall times.
"""

from __future__ import annotations

import argparse
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "fixtures" / "guard" / "forklaunch.py"
PACKAGE = str(REPO / "ddpdoctor") + os.sep

# The loop guard_overhead.py times; rank 0 profiles it into the file named in GUARD_PROFILE_OUT.
LOOP = REPO / "benchmarks" / "guard_train_loop.py"


def run_loop(guarded: bool, epochs: int, folder: str) -> tuple[pstats.Stats, int]:
    """Rank 0's profile of one run, and its optimizer steps."""
    out = os.path.join(folder, f"{'guarded' if guarded else 'plain'}.prof")
    command = [sys.executable, str(LAUNCH), "2", str(LOOP), str(epochs)]
    if guarded:
        command = [sys.executable, "-m", "ddpdoctor", "guard", "--", *command]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", GUARD_PROFILE_OUT=out)
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    if result.returncode != 0 or not os.path.exists(out):
        raise SystemExit(f"no profile (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return pstats.Stats(out), epochs * 4096 // (32 * 2)  # the loop's data, batch size and 2 ranks


def ours(stats: pstats.Stats) -> list[tuple[float, int, str]]:
    """(own seconds, calls, function) for every function of ddpdoctor's that ran in the loop."""
    rows = []
    for (filename, line, name), (_, calls, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if filename.startswith(PACKAGE):
            rows.append((own, calls, f"{os.path.relpath(filename, REPO)}:{line}({name})"))
    return sorted(rows, reverse=True)


def module_calls(stats: pstats.Stats) -> tuple[float, int]:
    """Own seconds and calls of torch's Module._call_impl (its slow path runs the hooks)."""
    own, calls = 0.0, 0
    for (filename, _, name), (_, ncalls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if name == "_call_impl" and filename.endswith(os.path.join("nn", "modules", "module.py")):
            own, calls = own + tottime, calls + ncalls
    return own, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3, help="profiled runs of each kind, alternating")
    args = parser.parse_args()
    runs: dict[bool, list[tuple[pstats.Stats, int]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.rounds):
            for guarded in ((True, False) if index % 2 == 0 else (False, True)):
                runs[guarded].append(run_loop(guarded, args.epochs, folder))
    stats, steps = runs[True][0]
    rows = ours(stats)
    print(f"{steps} optimizer steps on rank 0, {args.rounds} profiled runs of each kind (medians)")
    own = statistics.median(sum(t for t, _, _ in ours(s)) / n for s, n in runs[True])
    calls = statistics.median(sum(c for _, c, _ in ours(s)) / n for s, n in runs[True])
    print(f"ddpdoctor's own functions: {own * 1e6:.1f} us per step, {calls:.2f} calls per step")
    for seconds, count, where in rows[:args.top]:
        print(f"  {seconds / steps * 1e6:8.2f} us {count / steps:6.2f} calls  {where}  (first run)")
    for label, guarded in (("guarded", True), ("unguarded", False)):
        impl = statistics.median(module_calls(s)[0] / n for s, n in runs[guarded])
        total = statistics.median(s.total_calls / n for s, n in runs[guarded])  # type: ignore[attr-defined]
        print(f"{label}: torch Module._call_impl {impl * 1e6:.1f} us per step; "
              f"{total:.1f} function calls per step in all")


if __name__ == "__main__":
    main()
