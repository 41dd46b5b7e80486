"""Test-suite detection: test files and unit-test classes choose devices, ranks and learning rates
per test case on purpose; rules about those choices stay silent there."""

from __future__ import annotations

import os.path

import libcst as cst

from ddpdoctor.lint.analysis.launch import is_script
from ddpdoctor.lint.analysis.model import Call, ModuleModel

TEST_HARNESS_MODULES = ("unittest", "pytest", "torch.testing._internal", "horovod.common.util")


def is_test_module(model: ModuleModel) -> bool:
    """True for a test suite rather than a training script: a file named like a test
    (`test_*.py`, `*_test.py`, `*_tests.py`, `conftest.py`) or one built on a test harness
    (unittest, pytest, torch's internal distributed test fixtures). Tests pin devices, ranks and
    learning rates per test case on purpose; rules about those choices stay silent there.

    A file named like a test that is a program of its own (an `if __name__ == "__main__":` entry)
    and holds no test case (`def test_...`, `class Test...`) is a script that only says "test" in
    its name: `torchrun_test.py`, a smoke run of the job launched by the project's batch file."""
    if any(model.uses_module(module) for module in TEST_HARNESS_MODULES):
        return True
    name = os.path.basename(model.path)
    if name == "conftest.py":
        return True
    if not (name.startswith("test_") or name.endswith(("_test.py", "_tests.py"))):
        return False
    return not is_script(model) or _holds_test_cases(model.module)


def _holds_test_cases(module: cst.Module) -> bool:
    """A top-level `def test_...` or a class named as a test case (`TestX`, `XTest`, `XTests`)."""
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value.startswith("test"):
            return True
        if isinstance(statement, cst.ClassDef):
            name = statement.name.value
            if name.startswith("Test") or name.endswith(("Test", "Tests")):
                return True
    return False


def in_test_case(call: Call) -> bool:
    """True inside a unit-test class (`class TestAllreduce(unittest.TestCase)`, `TorchTests`):
    test harnesses choose devices per test on purpose and are not training scripts."""
    function = call.function
    klass = call.ctx.klass
    while klass is None and function is not None:
        klass, function = function.klass, function.parent
    return klass is not None and (klass.startswith("Test") or klass.endswith(("Test", "Tests")))


