"""The devices layer's facts, asked directly: where a module relies on the current CUDA device
(issue 10: DDP011 fires only when something does)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import build_analysis, devices

PRELUDE = """\
import os
import torch
import torch.distributed as dist
local_rank = int(os.environ["LOCAL_RANK"])
"""


def uses(source: str) -> list[tuple[int, str]]:
    """(line counted from the snippet's first line, what) for each use of the current device."""
    model = build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)))
    offset = PRELUDE.count("\n")
    return [(model.line_of(use.call.node) - offset, use.what) for use in devices.current_device_uses(model)]


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("model = torch.nn.Linear(2, 2).cuda()\n", "bare .cuda()"),
        ("x = torch.zeros(2).cuda(non_blocking=True)\n", "bare .cuda()"),
        ('x = torch.zeros(2).to("cuda")\n', '.to("cuda") without a device index'),
        ('device = torch.device("cuda")\nx = torch.zeros(2).to(device)\n', ".to(device) without a device index"),
        (
            'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\nx = torch.zeros(2).to(device)\n',
            ".to(device) without a device index",
        ),
        ('x = torch.zeros(2, device="cuda")\n', 'device="cuda" without a device index'),
        ('state = torch.load("ckpt.pt", map_location="cuda")\n', 'map_location="cuda" without a device index'),
        ("index = torch.cuda.current_device()\n", "torch.cuda.current_device()"),
        ("torch.cuda.synchronize()\n", "torch.cuda.synchronize() without a device"),
        ("free, total = torch.cuda.mem_get_info()\n", "torch.cuda.mem_get_info() without a device"),
        ("dist.barrier()\n", "dist.barrier() without device_ids"),
        ("out = [None] * 2\ndist.all_gather_object(out, 1)\n", "dist.all_gather_object()"),
        ("objs = [1]\ndist.broadcast_object_list(objs, src=0)\n", "dist.broadcast_object_list()"),
    ],
)
def test_uses_of_the_current_device(source: str, what: str) -> None:
    found = uses(source)
    assert [w for _, w in found] == [what]
    assert found[0][0] == textwrap.dedent(source).count("\n")  # reported at the using call (last line)


@pytest.mark.parametrize(
    "source",
    [
        'x = torch.zeros(2).to(f"cuda:{local_rank}")\n',
        'device = torch.device("cuda", local_rank)\nx = torch.zeros(2).to(device)\n',
        'x = torch.zeros(2).cuda(local_rank)\n',
        'x = torch.zeros(2, device="cuda:{}".format(local_rank))\n',
        "x = torch.zeros(2).to(torch.float16)\n",
        'x = torch.zeros(2).to("cpu")\n',
        "dist.barrier(device_ids=[local_rank])\n",
        'objs = [1]\ndist.broadcast_object_list(objs, src=0, device=torch.device("cuda", local_rank))\n',
        "torch.cuda.synchronize(local_rank)\n",
        # empty_cache empties every device's cache; allocator counters open no context
        "torch.cuda.empty_cache()\nprint(torch.cuda.max_memory_allocated())\n",
        # restores to the saved index, not the current device (another rule's business)
        'state = torch.load("ckpt.pt")\n',
        # rank 0 is local rank 0: GPU 0 is its own
        "if dist.get_rank() == 0:\n    probe = torch.zeros(1).cuda()\n",
        # only a single-process run gets here
        "if not dist.is_initialized():\n    model = torch.nn.Linear(2, 2).cuda()\n",
        # a helper nothing here calls
        "def build():\n    return torch.nn.Linear(2, 2).cuda()\n",
        # a unit-test class chooses its devices per test
        "class TestSync:\n    def test_sync(self):\n        torch.cuda.synchronize()\n",
        # `device=` of a project function: where the function uses it decides
        'def build(device):\n    return device\nbuild(device="cuda")\n',
    ],
)
def test_not_uses_of_the_current_device(source: str) -> None:
    assert uses(source) == []


def test_uses_are_listed_in_the_order_written() -> None:
    source = "model = torch.nn.Linear(2, 2).cuda()\ndist.barrier()\ntorch.cuda.synchronize()\n"
    assert [line for line, _ in uses(source)] == [1, 2, 3]
