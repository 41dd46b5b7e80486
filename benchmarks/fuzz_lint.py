#!/usr/bin/env python
"""The large fuzz run: many generated programs (hypothesmith) and mutated fixtures through the
linter, counting crashes, hangs and DDP999 on programs Python compiles. Not a test: it reports.

Each program is linted in a watched worker process (`ddpdoctor.lint.workers.run_tasks`): a worker
that dies is a crash, one past the time budget is a hang. Offending programs are saved to --out.

    nice -n 19 python benchmarks/fuzz_lint.py --programs 10000 --out /tmp/fuzz-lint
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fuzz_programs import compiles, mutate, with_trigger  # noqa: E402

from ddpdoctor.config import Settings  # noqa: E402
from ddpdoctor.lint.engine import lint_source  # noqa: E402
from ddpdoctor.lint.workers import run_tasks  # noqa: E402

ALL = Settings(select=("ALL",))


def generated(count: int, seed: int) -> list[str]:
    import hypothesmith
    from hypothesis import HealthCheck, given, settings

    out: list[str] = []
    strategy = hypothesmith.from_grammar() if seed % 2 == 0 else hypothesmith.from_node()

    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(source: str) -> None:
        out.append(source)

    collect()
    return [with_trigger(program) for program in out[:count]]


def lint_one(source: str) -> tuple[bool, list[str], str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        valid = compiles(source)
        try:
            findings = lint_source(source, "fuzz.py", ALL).findings
        except BaseException as error:  # noqa: BLE001 - counted, not raised
            return valid, [], f"exception {type(error).__name__}: {error}"
    refused = ""
    if valid and len(source) < 100_000:
        import libcst

        try:
            libcst.parse_module(source)
        except Exception as error:  # noqa: BLE001 - valid Python libcst cannot parse: counted
            refused = "libcst refused: " + str(error).splitlines()[0][:200]
    return valid, [f"{f.code} {f.message}" for f in findings if f.code == "DDP999"], refused


BATCH = 500


def record(chunk: list[str], counts: dict[str, int], args: argparse.Namespace) -> None:
    outcomes = run_tasks(lint_one, chunk, args.jobs, args.budget, lambda source, why: (compiles(source), [], why))
    for source, (valid, ddp999, trouble) in zip(chunk, outcomes):
        number = counts["programs"]
        counts["programs"] += 1
        counts["compile_ok"] += valid
        kind = None
        if "time budget" in trouble:
            kind = "hangs"
        elif "crashed" in trouble:
            kind = "crashes"
        elif trouble.startswith("libcst refused"):
            kind = "valid_but_libcst_refused"
        elif trouble:
            kind = "exceptions"
        if ddp999 and valid:
            kind = "ddp999_on_valid"
        elif ddp999:
            counts["ddp999_on_invalid"] += 1
        if kind:
            counts[kind] += 1
            (args.out / f"{kind}-{number}.py").write_bytes(source.encode("utf-8", "surrogatepass"))
            (args.out / f"{kind}-{number}.txt").write_text(trouble or "\n".join(ddp999))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--generated", type=int, default=3000, help="how many of them hypothesmith writes (the rest are mutated fixtures)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per program before it counts as a hang")
    parser.add_argument("--out", type=Path, default=Path("fuzz-lint-out"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    fixtures = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "fixtures").glob("*/*.py"))]
    started = time.monotonic()
    half = min(args.generated, args.programs)
    # Mutations first (cheap to make), hypothesmith's programs after: progress figures come early.
    mutated = [mutate(rng.choice(fixtures), rng) for _ in range(args.programs - half)]

    def later() -> list[str]:
        made = generated(half // 2, 0) + generated(half - half // 2, 1)
        print(f"hypothesmith wrote {len(made)} programs", file=sys.stderr, flush=True)
        return made

    counts = {"programs": 0, "compile_ok": 0, "crashes": 0, "hangs": 0, "exceptions": 0, "ddp999_on_valid": 0, "ddp999_on_invalid": 0, "valid_but_libcst_refused": 0}
    args.out.mkdir(parents=True, exist_ok=True)
    for make in (lambda: mutated, later):
        programs = make()
        for first in range(0, len(programs), BATCH):
            record(programs[first : first + BATCH], counts, args)
            print(json.dumps(counts), file=sys.stderr, flush=True)  # progress: the figures so far
    counts["total_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(counts, indent=2))


if __name__ == "__main__":
    main()
