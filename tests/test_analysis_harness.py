"""Test-suite detection asked directly: a call inside a unit-test class, however the class is
named (`TestX`, `XTest`, `XTests`), or in a function nested in one of its methods."""

from __future__ import annotations

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import build_analysis, harness


@pytest.mark.parametrize(
    "klass, expected",
    [("TestAllreduce", True), ("AllreduceTest", True), ("TorchTests", True), ("Trainer", False), ("Testament", True)],
)
def test_in_test_case_by_class_name(klass: str, expected: bool) -> None:
    source = f"class {klass}:\n    def run(self):\n        def inner():\n            target()\n        target()\n"
    model = build_analysis(cst.parse_module(source))
    targets = [c for c in model.calls if c.dotted == "target"]
    assert [harness.in_test_case(c) for c in targets] == [expected, expected]


def test_module_level_calls_are_in_no_test_case() -> None:
    model = build_analysis(cst.parse_module("def main():\n    target()\ntarget()\n"))
    assert [harness.in_test_case(c) for c in model.calls] == [False, False]


def test_a_class_body_of_a_test_case_is_in_it() -> None:
    source = "import torch\nclass TestDevices:\n    device = torch.device('cuda:0')\nclass Config:\n    device = torch.device('cuda:0')\n"
    model = build_analysis(cst.parse_module(source))
    assert [harness.in_test_case(c) for c in model.calls] == [True, False]


@pytest.mark.parametrize(
    "name, source, expected",
    [
        # named like a test, and holding test cases or no entry point of its own: a test suite
        ("ddp_test.py", "def test_allreduce():\n    pass\n", True),
        ("ddp_test.py", "def main():\n    pass\n", True),
        ("test_ddp.py", "class TestDDP:\n    pass\nif __name__ == '__main__':\n    TestDDP()\n", True),
        ("test_ddp.py", "class DDPTests:\n    pass\nif __name__ == '__main__':\n    DDPTests()\n", True),
        ("conftest.py", "if __name__ == '__main__':\n    pass\n", True),
        ("ddp_test.py", "import unittest\nif __name__ == '__main__':\n    unittest.main()\n", True),
        ("train.py", "import pytest\n", True),
        # a program that only says "test" in its name: a smoke run of the launch
        ("torchrun_test.py", "def demo():\n    pass\nif __name__ == '__main__':\n    demo()\n", False),
        ("test_launch.py", "def main():\n    pass\nif __name__ == '__main__':\n    main()\n", False),
        ("train.py", "def main():\n    pass\n", False),
    ],
)
def test_is_test_module(name: str, source: str, expected: bool) -> None:
    assert harness.is_test_module(build_analysis(cst.parse_module(source), name)) is expected
