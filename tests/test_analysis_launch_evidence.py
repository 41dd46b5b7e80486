"""Launch evidence asked directly: which call makes a file a multi-process training script."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import build_analysis, launch


@pytest.mark.parametrize(
    "source, line",
    [
        # torch's fake backend simulates the world in one process; the real init after it counts
        ('dist.init_process_group("fake", rank=0, world_size=8)\ndist.init_process_group("nccl")', 5),
        ('dist.init_process_group("nccl", world_size=1)\ndist.init_process_group("gloo", world_size=2)', 5),
        ('dist.init_process_group("nccl", world_size=1)', None),
        ('dist.init_process_group("fake", rank=0, world_size=8)', None),
        # without an init in this file: the DDP wrap, then the launchers
        ("model = DDP(net)", 4),
        ("mp.spawn(worker, nprocs=2)", 4),
        ("x = 1", None),
    ],
)
def test_multiprocess_evidence(source: str, line: Optional[int]) -> None:
    prelude = (
        "import torch.distributed as dist\nimport torch.multiprocessing as mp\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    )
    model = build_analysis(cst.parse_module(prelude + textwrap.dedent(source) + "\n"))
    evidence = launch.multiprocess_evidence(model)
    assert (None if evidence is None else model.line_of(evidence.node)) == line
