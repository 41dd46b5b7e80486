"""The launch layer's facts about values built from the number of workers, asked directly (HVD001
asks them: is a learning rate scaled by hvd.size(), is the batch a global one shared among the
workers, does an allreduce op name Adasum)."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import Call, ModuleModel, build_analysis, launch

PRELUDE = """\
import argparse
import horovod.torch as hvd
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--batch-size", type=int, default=256)
args = parser.parse_args()
"""
SIZE = launch.HOROVOD_SIZE_CALLS


def build(source: str) -> ModuleModel:
    return build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)))


def target(model: ModuleModel) -> Call:
    (call,) = [c for c in model.calls if c.dotted == "target"]
    return call


def scaling(source: str) -> str:
    model = build(source)
    call = target(model)
    value = call.arg(0)
    assert value is not None
    return launch.scaling_by(model, value, SIZE, call.order, call.function)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("target(0.1)\n", launch.UNSCALED),
        ("target(args.lr)\n", launch.UNSCALED),  # the argparse default, used as it is
        ("lr = args.lr * 2\ntarget(lr)\n", launch.UNSCALED),
        ("target(args.lr * hvd.size())\n", launch.SCALED),
        ("lr = args.lr\nlr *= hvd.size()\ntarget(lr)\n", launch.SCALED),
        ("scaler = hvd.size() if not args.adasum else 1\ntarget(args.lr * scaler)\n", launch.SCALED),
        ("target(float(args.lr) * hvd.local_size())\n", launch.SCALED),
        ("def build(lr=0.1):\n    target(lr)\nbuild()\n", launch.UNSCALED),
        ("def build(lr):\n    target(lr)\nbuild(0.1 * hvd.size())\n", launch.SCALED),
        ("target(config.learning_rate)\n", launch.UNKNOWN_SCALING),  # a config object: cannot be followed
        ("target(load_lr())\n", launch.UNKNOWN_SCALING),
    ],
)
def test_scaling_by_the_worker_count(source: str, expected: str) -> None:
    assert scaling(source) == expected


def test_mentions_calls_follows_a_local_schedule_function() -> None:
    model = build("def warmup(epoch):\n    return epoch * hvd.size()\ntarget(warmup)\n")
    call = target(model)
    assert launch.mentions_calls(model, call.arg(0), SIZE, call.order, call.function)
    model = build("def warmup(epoch):\n    return epoch * 2\ntarget(warmup)\n")
    call = target(model)
    assert not launch.mentions_calls(model, call.arg(0), SIZE, call.order, call.function)


def divided(source: str) -> Optional[int]:
    model = build(source)
    assignment = launch.batch_divided_among_workers(model, SIZE)
    return None if assignment is None else model.line_of(assignment.node) - PRELUDE.count("\n")


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("args.batch_size = int(args.batch_size / hvd.size())\n", 1),
        ("batch_size = args.batch_size // torch.cuda.device_count()\n", 1),
        ("workers = hvd.size()\nper_worker_batch = args.batch_size // workers\n", 2),
        ("n = torch.cuda.device_count()\nbatch = 512 // n\n", 2),
        # not a batch, or not divided by the workers
        ("lr = args.lr / hvd.size()\n", None),
        ("batch_size = args.batch_size // 2\n", None),
        ("batch_size = args.batch_size * hvd.size()\n", None),
    ],
)
def test_batch_divided_among_workers(source: str, line: Optional[int]) -> None:
    assert divided(source) == line


@pytest.mark.parametrize(
    ("op", "expected"),
    [("hvd.Adasum", True), ("hvd.Adasum if args.adasum else hvd.Average", True), ("hvd.Average", False)],
)
def test_mentions_names(op: str, expected: bool) -> None:
    model = build(f"target({op})\n")
    value = target(model).arg(0)
    assert value is not None
    assert launch.mentions_names(model, value, frozenset({"horovod.torch.Adasum"})) is expected
