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


@pytest.mark.parametrize(
    "call, nccl",
    [
        ('dist.init_process_group("nccl")', True),
        ('dist.init_process_group(backend="gloo")', False),
        ("dist.init_process_group(dist.Backend.NCCL)", True),
        ('dist.init_process_group("gloo" if cpu else "nccl")', True),  # the GPU run takes the NCCL arm
        ('dist.init_process_group("cpu:gloo,cuda:nccl")', True),
        # no backend: torch >= 2.0 creates NCCL for CUDA tensors and gloo for CPU ones
        ('dist.init_process_group(init_method="env://")', True),
        ("dist.init_process_group()", True),
        ("dist.init_process_group(**settings)", False),  # may carry any backend
        ("dist.init_process_group(backend=pick_backend())", False),  # unknown: not taken for NCCL
    ],
)
def test_may_create_nccl_group(call: str, nccl: bool) -> None:
    model = build_analysis(cst.parse_module("import torch.distributed as dist\n" + call + "\n"))
    (init,) = model.calls_named(launch.INIT_PROCESS_GROUP)
    assert launch.may_create_nccl_group(model, init) is nccl


def test_the_backend_option_s_argparse_default_decides() -> None:
    source = textwrap.dedent(
        """\
        import argparse
        import torch.distributed as dist
        parser = argparse.ArgumentParser()
        parser.add_argument("--dist-backend", default="{default}")
        class Trainer:
            def __init__(self, args):
                self.args = args
            def setup(self):
                dist.init_process_group(self.args.dist_backend)
        """
    )
    for default, nccl in (("nccl", True), ("gloo", False)):
        model = build_analysis(cst.parse_module(source.format(default=default)))
        (init,) = model.calls_named(launch.INIT_PROCESS_GROUP)
        assert launch.may_create_nccl_group(model, init) is nccl, default
