"""A small, seeded fuzz run: generated and mutated programs never crash the linter, and a program
Python compiles never gets DDP999. The large run (>= 10,000 programs) is benchmarks/fuzz_lint.py."""

from __future__ import annotations

import random
import sys
import warnings
from pathlib import Path

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_programs import compiles, mutate, with_trigger  # noqa: E402

FIXTURES = sorted((Path(__file__).resolve().parent.parent / "fixtures").glob("*/*.py"))
ALL = Settings(select=("ALL",))


def check(source: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings from compile() on generated code
        valid = compiles(source)
        findings = lint_source(source, "fuzz.py", ALL).findings  # must not raise
    if valid:
        assert [f.message for f in findings if f.code == "DDP999"] == [], repr(source)


@settings(max_examples=30, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(hypothesmith.from_grammar())
def test_generated_programs(source: str) -> None:
    check(with_trigger(source))


@pytest.mark.parametrize("seed", range(4))
def test_mutated_fixtures(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(15):
        check(mutate(rng.choice(FIXTURES).read_text(encoding="utf-8"), rng))


@pytest.mark.parametrize(
    "source",
    [
        "class A(b=1, *c):\n    pass\n",  # libcst's grammar lacks a keyword before *args in bases
        "(w): int = 1\n",  # ... and a parenthesised annotated target
        "import torch\nscaler = torch.cuda.amp.GradScaler()\nclass A(b=1, *c):\n    pass\n",
    ],
)
def test_valid_python_libcst_refuses_gets_no_ddp999(source: str) -> None:
    compile(source, "t.py", "exec")
    assert [f.code for f in lint_source(source, "t.py", ALL).findings] == []
