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
        # through a conversion, a sign or the other side of a conditional, inside a function
        ("def main():\n    lr = args.lr\n    target(float(lr))\nmain()\n", launch.UNSCALED),
        ("def main():\n    lr = args.lr\n    target(-lr)\nmain()\n", launch.UNSCALED),
        ("def main():\n    target(-load_lr())\nmain()\n", launch.UNKNOWN_SCALING),  # a sign knows no more
        ("def main():\n    lr = args.lr\n    target(0.1 if args.fixed else lr)\nmain()\n", launch.UNSCALED),
        ("def main():\n    lr = load_lr()\n    target(0.1 if args.fixed else lr)\nmain()\n", launch.UNKNOWN_SCALING),
        ("def main():\n    lr = args.lr * 2\n    target(0.1 if args.fixed else lr)\nmain()\n", launch.UNSCALED),
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
        # only the attribute's own name counts: an lr kept on a batch-named object is no batch
        ("batch_config.lr = args.lr / hvd.size()\n", None),
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


def test_env_reads_in_each_spelling_but_not_the_writes() -> None:
    model = build(
        """\
        import os
        os.environ["MASTER_PORT"] = "29500"
        a = os.environ["RANK"]
        b = os.environ.get("LOCAL_RANK")
        c = os.getenv("WORLD_SIZE")
        if "SLURM_PROCID" in os.environ or "OMPI_COMM_WORLD_RANK" not in os.environ:
            pass
        os.environ["MASTER_ADDR"] = "localhost"
        d = os.environ["NODE_RANK"]
        """
    )
    assert sorted(key for key, _ in launch.env_reads(model)) == [
        "LOCAL_RANK", "NODE_RANK", "OMPI_COMM_WORLD_RANK", "RANK", "SLURM_PROCID", "WORLD_SIZE",
    ]


@pytest.mark.parametrize(
    ("source", "key"),
    [
        ('import os\nenv = dict(os.environ)\ntarget(env["RANK"])\n', "RANK"),
        ('import os\nenv = os.environ.copy()\ntarget(env["LOCAL_RANK"])\n', "LOCAL_RANK"),
        ('import os\nenv = {k: os.environ[k] for k in ("RANK",)}\ntarget(env["RANK"])\n', "RANK"),
        # a dict of the script's own, not a copy of the environment
        ('env = dict(defaults)\ntarget(env["RANK"])\n', None),
        ('env = dict(RANK="0")\ntarget(env["RANK"])\n', None),
        ('env = load_env()\ntarget(env["RANK"])\n', None),
    ],
)
def test_env_copy_key(source: str, key: Optional[str]) -> None:
    model = build(source)
    call = target(model)
    value = call.arg(0)
    assert value is not None
    assert launch.env_copy_key(model, value, call.order, call.function) == key
