#!/usr/bin/env python
"""How fast is `ddpdoctor lint`, next to the cost of just parsing the same files with libcst?

A benchmark, not a test: it always exits 0 once the measurements ran (a missed target is reported,
not failed). The corpus is real code present wherever ddpdoctor runs: the installed `torch`
package's own sources.

* stress:  torch/distributed             (nearly every file uses the distributed APIs, so nearly
                                           every file is parsed and every rule runs on it)
* typical: torch/nn + torch/utils        (few files mention them; the text pre-filter skips the rest)

Every measurement is a fresh `python -c` process. The child imports everything first (ddpdoctor,
its rules and catalog, libcst), then times only the work with `time.perf_counter()`; the parent
separately records the wall time of the whole process (start-up and imports included).

* parse floor     `libcst.parse_module` over the same file bytes, one process (bytes read first).
* cold, -j 1      `lint_paths(files, Settings(select=("ALL",)), jobs=1, use_cache=False)`
                  (what `ddpdoctor lint --select ALL -j 1 --no-cache` does, minus reporting).
* cold, -j N      the same with N = all cores (`os.cpu_count()`).
* warm cache      a first, untimed run fills a cache in a temporary directory (`cache_root`, and the
                  child's working directory); the timed runs then hit it for every file.

Each is repeated `--repeat` times (interleaved, so drift hits every mode alike) and medians quoted.

* one file        the most common use (pre-commit, an editor on one changed file): the wall time of a
                  whole `python -m ddpdoctor lint --no-cache FILE` process (output to a pipe) on a small
                  training script, against its floor, a whole `python -c` process that imports libcst
                  and parses the same file. Byte code is compiled first (as an installed wheel has it);
                  `--one-file-repeat` runs of each, interleaved, medians quoted.

    python benchmarks/lint_speed.py                   # both corpora, 3 repeats (~5 min on 2 cores)
    python benchmarks/lint_speed.py --corpus stress --repeat 5
    python benchmarks/lint_speed.py --quick           # a smoke run: every 6th file, 1 repeat
    python benchmarks/lint_speed.py --profile         # also cProfile one cold -j 1 run (stress)
    python benchmarks/lint_speed.py --corpus none     # the one-file row only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

# Targets the product promises (README "Performance").
TARGET_STRESS_VS_FLOOR = 2.0  # cold, one worker: at most this many times the parse floor
TARGET_TYPICAL_VS_FLOOR = 0.5
TARGET_WARM_SPEEDUP = 20.0  # warm cache at least this many times faster than cold
TARGET_ONE_FILE_VS_FLOOR = 1.5  # one small file, whole process: at most this many times its floor
ONE_FILE_FUNCTIONS = 9  # copies of lint_scaling's training function: a script of about 120 lines

CORPORA = {
    "stress": ("distributed",),
    "typical": ("nn", "utils"),
}

QUICK_STRIDE = 6  # --quick keeps every 6th file (still above the engine's parallel threshold)

# --- what the child processes run -------------------------------------------------------------

_CHILD_LINT = r"""
import json, sys, time
from pathlib import Path
spec = json.loads(open(sys.argv[1], encoding="utf-8").read())
import libcst
from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_paths
from ddpdoctor.lint.rules.base import all_rules
settings = Settings(select=("ALL",))
all_rules(); settings.enabled_codes()  # rule modules and catalog loaded before the clock starts
cache_root = Path(spec["cache_root"]) if spec["cache_root"] else None
start = time.perf_counter()
run, _ = lint_paths(spec["files"], settings, jobs=spec["jobs"], use_cache=spec["use_cache"], cache_root=cache_root)
seconds = time.perf_counter() - start
print(json.dumps({
    "seconds": seconds,
    "files": len(run.files),
    "parsed": sum(1 for r in run.files if r.parsed),
    "cached": sum(1 for r in run.files if r.cached),
    "findings": len(run.findings),
    "errors": len(run.errors),
}))
"""

_CHILD_FLOOR = r"""
import json, sys, time
spec = json.loads(open(sys.argv[1], encoding="utf-8").read())
import libcst
datas = []
for path in spec["files"]:
    with open(path, "rb") as handle:
        datas.append(handle.read())
failed = 0
start = time.perf_counter()
for data in datas:
    try:
        libcst.parse_module(data)
    except Exception:
        failed += 1
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "files": len(datas), "parsed": len(datas) - failed, "failed": failed}))
"""

_CHILD_PROFILE = r"""
import cProfile, io, json, pstats, sys, time
spec = json.loads(open(sys.argv[1], encoding="utf-8").read())
import libcst
from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_paths
from ddpdoctor.lint.rules.base import all_rules
settings = Settings(select=("ALL",))
all_rules(); settings.enabled_codes()
profiler = cProfile.Profile()
profiler.enable()
lint_paths(spec["files"], settings, jobs=1, use_cache=False)
profiler.disable()
for key in ("cumulative", "tottime"):
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(spec["top"])
    print(f"===== sorted by {key} =====")
    print(out.getvalue())
if spec.get("dump"):
    profiler.dump_stats(spec["dump"])
"""


_ONE_FILE_FLOOR = "import sys, libcst; libcst.parse_module(open(sys.argv[1], 'rb').read())"


class ChildFailed(RuntimeError):
    pass


@dataclass
class Sample:
    work: float  # seconds, timed inside the child
    wall: float  # seconds, the whole child process
    info: dict[str, Any]


@dataclass
class Measure:
    label: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def work(self) -> float:
        return statistics.median(s.work for s in self.samples)

    @property
    def wall(self) -> float:
        return statistics.median(s.wall for s in self.samples)

    @property
    def info(self) -> dict[str, Any]:
        return self.samples[-1].info


CHILD_TIMEOUT = 600  # seconds; a run past this is reported as a failure, never waited on forever


def run_child(code: str, spec: dict[str, Any], workdir: Path, timeout: float = CHILD_TIMEOUT) -> Sample:
    spec_file = workdir / "spec.json"
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(spec_file)],
            cwd=spec.get("cwd") or workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"child ran past {timeout} s (a pathological file or rule?)") from None
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise ChildFailed(f"child exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    return Sample(work=info["seconds"], wall=wall, info=info)


# --- the corpus -------------------------------------------------------------------------------


def torch_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("lint_speed: torch is not installed; the corpus is torch's own sources")
    return Path(list(spec.submodule_search_locations)[0])


def corpus_files(name: str, quick: bool) -> list[str]:
    """The files ddpdoctor itself would discover under the corpus folders (absolute paths)."""
    from ddpdoctor.config import Settings
    from ddpdoctor.lint.files import discover

    root = torch_root()
    folders = [str(root / sub) for sub in CORPORA[name]]
    files = [os.path.abspath(f) for f in discover(folders, Settings()).files]
    return files[::QUICK_STRIDE] if quick else files


def count_lines(files: list[str]) -> int:
    total = 0
    for path in files:
        with open(path, "rb") as handle:
            data = handle.read()
        total += data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return total


# --- running ----------------------------------------------------------------------------------


@dataclass
class CorpusResult:
    name: str
    folders: str
    files: int
    lines: int
    floor: Measure
    cold1: Measure
    coldn: Measure
    warm: Measure


def bench_corpus(name: str, files: list[str], repeat: int, cores: int, scratch: Path) -> CorpusResult:
    lines = count_lines(files)
    print(f"\n[{name}] {len(files)} files, {lines:,} lines; {repeat} repeat(s)", flush=True)
    floor = Measure("libcst parse floor")
    cold1 = Measure("ddpdoctor cold, -j 1")
    coldn = Measure(f"ddpdoctor cold, -j {cores}")
    warm = Measure(f"ddpdoctor warm cache, -j {cores}")

    cache_dir = Path(tempfile.mkdtemp(prefix=f"ddpdoctor-bench-{name}-", dir=scratch))
    base = {"files": files, "cache_root": None, "use_cache": False, "cwd": str(cache_dir)}
    cold_one = dict(base, jobs=1)
    cold_all = dict(base, jobs=cores)
    warm_spec = dict(base, jobs=cores, use_cache=True, cache_root=str(cache_dir))

    # Fill the cache once (untimed): a cold run that writes it.
    fill = run_child(_CHILD_LINT, warm_spec, scratch)
    print(f"  cache filled ({fill.work:.2f} s, {fill.info['parsed']} parsed)", flush=True)

    for i in range(repeat):
        for measure, code, spec in (
            (floor, _CHILD_FLOOR, base),
            (cold1, _CHILD_LINT, cold_one),
            (coldn, _CHILD_LINT, cold_all),
            (warm, _CHILD_LINT, warm_spec),
        ):
            sample = run_child(code, spec, scratch)
            measure.samples.append(sample)
            print(f"  #{i + 1} {measure.label:<32} work {sample.work:7.3f} s   wall {sample.wall:7.3f} s", flush=True)
        if warm.samples[-1].info["cached"] != len(files):
            print(f"  note: warm run hit the cache for only {warm.samples[-1].info['cached']}/{len(files)} files")

    folders = " + ".join(f"torch/{sub}" for sub in CORPORA[name])
    return CorpusResult(name, folders, len(files), lines, floor, cold1, coldn, warm)


@dataclass
class OneFileResult:
    lines: int
    floor: list[float]
    lint: list[float]

    @property
    def ratio(self) -> float:
        return statistics.median(self.lint) / statistics.median(self.floor)


def _timed_process(argv: list[str], cwd: Path, expect: tuple[int, ...]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, timeout=CHILD_TIMEOUT)
    wall = time.perf_counter() - start
    if proc.returncode not in expect:
        raise ChildFailed(f"{' '.join(argv[1:3])} exited {proc.returncode}:\n{proc.stderr.decode(errors='replace')[-4000:]}")
    return wall


def bench_one_file(repeat: int, scratch: Path) -> OneFileResult:
    """One small training script linted by a whole `ddpdoctor lint` process, next to a whole process
    that only imports libcst and parses it."""
    import compileall

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lint_scaling import generate

    import ddpdoctor

    # A wheel's installer compiles byte code; a checkout run with PYTHONDONTWRITEBYTECODE never
    # would, and would pay for compiling every module in every run.
    compileall.compile_dir(str(Path(ddpdoctor.__file__).parent), quiet=1)
    script = scratch / "one_file" / "train.py"
    script.parent.mkdir()
    script.write_text(generate(ONE_FILE_FUNCTIONS), encoding="utf-8")
    lines = script.read_text(encoding="utf-8").count("\n")
    floor_argv = [sys.executable, "-c", _ONE_FILE_FLOOR, str(script)]
    lint_argv = [sys.executable, "-m", "ddpdoctor", "lint", "--no-cache", str(script)]
    print(f"\n[one file] a {lines}-line training script, whole processes; {repeat} run(s) each", flush=True)
    for argv, expect in ((floor_argv, (0,)), (lint_argv, (1,))):  # warm the file cache, untimed
        _timed_process(argv, script.parent, expect)
    result = OneFileResult(lines, [], [])
    for i in range(repeat):
        result.floor.append(_timed_process(floor_argv, script.parent, (0,)))
        result.lint.append(_timed_process(lint_argv, script.parent, (1,)))
        print(f"  #{i + 1} floor {result.floor[-1]:.3f} s   ddpdoctor lint {result.lint[-1]:.3f} s", flush=True)
    return result


# --- reporting --------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("ddpdoctor", "libcst", "torch"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "?"
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def rule_count() -> int:
    from ddpdoctor.config import Settings

    return len(Settings(select=("ALL",)).enabled_codes())


def _rate(n: float, seconds: float) -> str:
    if seconds <= 0:
        return "∞"
    value = n / seconds
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def render_one_file(result: OneFileResult) -> tuple[str, tuple[str, bool, str]]:
    floor, lint = statistics.median(result.floor), statistics.median(result.lint)
    table = "\n".join([
        f"One file ({result.lines} lines), whole processes, medians of {len(result.floor)} run(s):",
        "",
        "| one file | wall (s) | × floor |",
        "|---|---:|---:|",
        f"| floor: start Python, import libcst, parse the file | {floor:.3f} | 1.00 |",
        f"| `ddpdoctor lint --no-cache FILE` (output to a pipe) | {lint:.3f} | {result.ratio:.2f} |",
    ])
    target = (f"one file: a whole lint within {TARGET_ONE_FILE_VS_FLOOR}× of its floor", result.ratio <= TARGET_ONE_FILE_VS_FLOOR, f"{result.ratio:.2f}×")
    return table, target


def render(results: list[CorpusResult], cores: int, repeat: int, quick: bool) -> tuple[str, list[tuple[str, bool, str]]]:
    v = versions()
    lines = [
        f"Machine: {cpu_model()}, {cores} cores, {platform.system()} {platform.machine()}; "
        f"Python {v['python']}, ddpdoctor {v['ddpdoctor']} ({rule_count()} codes with --select ALL), "
        f"libcst {v['libcst']}, corpus: torch {v['torch']} sources"
        + (" (--quick: every 6th file)" if quick else "")
        + f". Medians of {repeat} run(s), each a fresh process; work timed inside it after imports.",
        "",
        "| corpus | mode | files parsed | work (s) | files/s | lines/s | × parse floor | process wall (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    targets: list[tuple[str, bool, str]] = []
    for r in results:
        corpus = f"{r.name}: {r.folders} ({r.files} files, {r.lines / 1000:,.0f}k lines)"
        for m in (r.floor, r.cold1, r.coldn, r.warm):
            ratio = "1.00" if m is r.floor else f"{m.work / r.floor.work:.2f}"
            parsed = m.info.get("parsed", "")
            if m is r.warm:
                parsed = f"0 ({m.info.get('cached', 0)} cached)"
            lines.append(
                f"| {corpus} | {m.label} | {parsed} | {m.work:.3f} | {_rate(r.files, m.work)} | "
                f"{_rate(r.lines, m.work)} | {ratio} | {m.wall:.2f} |"
            )
            corpus = ""
    lines.append("")
    for r in results:
        speed_n = r.coldn.work / r.warm.work if r.warm.work else float("inf")
        speed_1 = r.cold1.work / r.warm.work if r.warm.work else float("inf")
        wall_n = r.coldn.wall / r.warm.wall if r.warm.wall else float("inf")
        lines.append(
            f"Warm cache vs cold ({r.name}): {speed_n:.0f}× faster than cold -j {cores}, {speed_1:.0f}× than cold -j 1 "
            f"(work); {wall_n:.1f}× in process wall time (start-up and imports included)."
        )
        # Judged against the faster of the two cold runs: the conservative reading.
        best_cold = min(r.cold1.work, r.coldn.work)
        speed = best_cold / r.warm.work if r.warm.work else float("inf")
        targets.append(
            (f"{r.name}: warm cache ≥ {TARGET_WARM_SPEEDUP:.0f}× faster than the faster cold run (work)", speed >= TARGET_WARM_SPEEDUP, f"{speed:.1f}×")
        )
        limit = TARGET_STRESS_VS_FLOOR if r.name == "stress" else TARGET_TYPICAL_VS_FLOOR
        ratio = r.cold1.work / r.floor.work
        targets.insert(
            len(targets) - 1,
            (f"{r.name}: cold -j 1 within {limit}× of the parse floor", ratio <= limit, f"{ratio:.2f}×"),
        )
    return "\n".join(lines), targets


def profile(files: list[str], scratch: Path, top: int, dump: Optional[str]) -> None:
    print(f"\n[profile] cold, -j 1, --select ALL over {len(files)} files (cProfile; slower than unprofiled)", flush=True)
    spec = {"files": files, "top": top, "cwd": str(scratch), "dump": os.path.abspath(dump) if dump else None}
    spec_file = scratch / "profile.json"
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD_PROFILE, str(spec_file)],
            cwd=scratch, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"profile child ran past {CHILD_TIMEOUT} s") from None
    if proc.returncode != 0:
        raise ChildFailed(f"profile child exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    print(proc.stdout)
    if dump:
        print(f"(raw stats written to {spec['dump']}; browse with `python -m pstats {dump}`)")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=None, help="runs per measurement, medians quoted (default 3; 1 with --quick)")
    parser.add_argument("--corpus", choices=("stress", "typical", "both", "none"), default="both", help="none: the one-file row only")
    parser.add_argument("--quick", action="store_true", help=f"every {QUICK_STRIDE}th file only, for a smoke run")
    parser.add_argument("--jobs", type=int, default=None, help="workers for the all-cores runs (default: os.cpu_count())")
    parser.add_argument("--one-file-repeat", type=int, default=None, help="runs of the one-file row (default 11; 3 with --quick; 0 skips it)")
    parser.add_argument("--profile", action="store_true", help="also cProfile one cold -j 1 run over the stress corpus")
    parser.add_argument("--profile-top", type=int, default=40, help="rows per profile listing (default 40)")
    parser.add_argument("--profile-out", metavar="FILE", help="also write the raw cProfile stats to FILE")
    args = parser.parse_args(argv)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    if repeat < 1:
        parser.error("--repeat must be at least 1")
    cores = args.jobs or os.cpu_count() or 1
    names = {"both": ["stress", "typical"], "none": []}.get(args.corpus, [args.corpus])
    one_file_repeat = args.one_file_repeat if args.one_file_repeat is not None else (3 if args.quick else 11)

    scratch = Path(tempfile.mkdtemp(prefix="ddpdoctor-bench-"))
    try:
        results = []
        for name in names:
            results.append(bench_corpus(name, corpus_files(name, args.quick), repeat, cores, scratch))
        table, targets = render(results, cores, repeat, args.quick) if results else ("", [])
        if one_file_repeat > 0:
            one_table, one_target = render_one_file(bench_one_file(one_file_repeat, scratch))
            table = (table + "\n\n" if table else "") + one_table
            targets.append(one_target)
        print("\n" + table + "\n")
        print("Targets:")
        for text, ok, value in targets:
            print(f"  [{'MET' if ok else 'MISSED'}] {text}: {value}")
        if args.profile:
            profile(corpus_files("stress", args.quick), scratch, args.profile_top, args.profile_out)
    except ChildFailed as error:
        print(f"lint_speed: a measurement failed: {error}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
