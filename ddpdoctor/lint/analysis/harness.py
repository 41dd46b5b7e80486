"""Test-suite detection: test files and unit-test classes choose devices, ranks and learning rates
per test case on purpose; rules about those choices stay silent there."""

from __future__ import annotations

import os.path

from ddpdoctor.lint.analysis.model import Call, ModuleModel

TEST_HARNESS_MODULES = ("unittest", "pytest", "torch.testing._internal", "horovod.common.util")


def is_test_module(model: ModuleModel) -> bool:
    """True for a test suite rather than a training script: a file named like a test
    (`test_*.py`, `*_test.py`, `*_tests.py`, `conftest.py`) or one built on a test harness
    (unittest, pytest, torch's internal distributed test fixtures). Tests pin devices, ranks and
    learning rates per test case on purpose; rules about those choices stay silent there."""
    name = os.path.basename(model.path)
    if name.startswith("test_") or name.endswith(("_test.py", "_tests.py")) or name == "conftest.py":
        return True
    return any(model.uses_module(module) for module in TEST_HARNESS_MODULES)


def in_test_case(call: Call) -> bool:
    """True inside a unit-test class (`class TestAllreduce(unittest.TestCase)`, `TorchTests`):
    test harnesses choose devices per test on purpose and are not training scripts."""
    function = call.function
    klass = call.ctx.klass
    while klass is None and function is not None:
        klass, function = function.klass, function.parent
    return klass is not None and (klass.startswith("Test") or klass.endswith(("Test", "Tests")))


