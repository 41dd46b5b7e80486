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


@pytest.mark.parametrize(
    "init_method, loopback",
    [
        ('"tcp://127.0.0.1:29500"', True),
        ('f"tcp://localhost:{port}"', True),
        ('"tcp://127.0.0.1:%d" % port', True),  # field evaluation 2026-11d
        ('"tcp://127.0.0.1:" + str(port)', True),
        ('"tcp://[::1]:{}".format(port)', True),
        ('"tcp://" "127.0.0.1:29500"', True),
        ('"tcp://%s:%d" % (host, port)', False),  # any host
        ('f"tcp://{host}:{port}"', False),
        ('"env://"', False),
        ("url", False),  # a value the module cannot follow
    ],
)
def test_is_loopback_rendezvous(init_method: str, loopback: bool) -> None:
    source = f"import torch.distributed as dist\ndist.init_process_group('gloo', init_method={init_method})\n"
    model = build_analysis(cst.parse_module(source))
    (init,) = model.calls_named(launch.INIT_PROCESS_GROUP)
    assert launch.is_loopback_rendezvous(model, init) is loopback


def test_a_loopback_address_on_one_path_only_is_not_loopback() -> None:
    source = textwrap.dedent(
        """\
        import torch.distributed as dist
        url = "tcp://127.0.0.1:%d" % port if local else "tcp://%s:%d" % (host, port)
        dist.init_process_group("nccl", init_method=url)
        """
    )
    model = build_analysis(cst.parse_module(source))
    (init,) = model.calls_named(launch.INIT_PROCESS_GROUP)
    assert launch.is_loopback_rendezvous(model, init) is False


@pytest.mark.parametrize(
    "source, line",
    [
        # In a script, a DDP wrap in a helper nothing calls (its call commented out with the init)
        # is dead code, not evidence (field evaluation 2026-11f) ...
        ("def wrap(net):\n    return DDP(net)\n\nif __name__ == '__main__':\n    train()\n", None),
        ("def wrap(net):\n    return DDP(net)\n\nif '__main__' == __name__:\n    train()\n", None),
        # ... but a helper the script calls, or hands to mp.spawn, counts,
        ("def wrap(net):\n    return DDP(net)\n\nif __name__ == '__main__':\n    wrap(net)\n", 5),
        ("def worker(i):\n    DDP(net)\n\nif __name__ == '__main__':\n    mp.spawn(worker, nprocs=2)\n", 5),
        # and in a library module the helper's callers are in other files: it counts.
        ("def wrap(net):\n    return DDP(net)\n", 5),
    ],
)
def test_ddp_wrap_evidence_in_scripts(source: str, line: Optional[int]) -> None:
    prelude = (
        "import torch.distributed as dist\nimport torch.multiprocessing as mp\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    )
    model = build_analysis(cst.parse_module(prelude + source))
    evidence = launch.multiprocess_evidence(model)
    assert (None if evidence is None else model.line_of(evidence.node)) == line


@pytest.mark.parametrize(
    "inits, single_node",
    [
        ('dist.init_process_group("nccl", init_method="tcp://127.0.0.1:{}".format(port))', True),
        ('dist.init_process_group("nccl", init_method="tcp://127.0.0.1:23456")\n'
         'dist.init_process_group("nccl", init_method=f"tcp://{host}:23456")', False),
        ('dist.init_process_group("nccl")', False),  # env:// from a launcher that may span nodes
        ("x = 1", False),  # no group created here: nothing known
    ],
)
def test_single_node_rendezvous(inits: str, single_node: bool) -> None:
    model = build_analysis(cst.parse_module("import torch.distributed as dist\n" + inits + "\n"))
    assert launch.single_node_rendezvous(model) is single_node


@pytest.mark.parametrize(
    "source, dead",
    [
        ("def helper():\n    target()\n\nif __name__ == '__main__':\n    pass\n", True),
        ("def helper():\n    target()\n\nif __name__ == '__main__':\n    helper()\n", False),
        ("def helper():\n    target()\n", False),  # a library module: its callers are elsewhere
        ("class Trainer:\n    def fit(self):\n        target()\n\nif __name__ == '__main__':\n    pass\n", False),
        ("target()\nif __name__ == '__main__':\n    pass\n", False),  # module level runs
    ],
)
def test_dead_in_script(source: str, dead: bool) -> None:
    model = build_analysis(cst.parse_module(source))
    (call,) = [c for c in model.calls if c.dotted == "target"]
    assert launch.dead_in_script(model, call.function) is dead
