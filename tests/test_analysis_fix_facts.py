"""The analysis facts that fixes are built from: how the module spells a name, where a statement
can be inserted, how an expression becomes a factor."""

from __future__ import annotations

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import build_analysis
from ddpdoctor.lint.analysis.syntax import as_left_factor


def model_of(source: str):  # type: ignore[no-untyped-def]
    return build_analysis(cst.parse_module(source))


@pytest.mark.parametrize(
    "source, qualified, expected",
    [
        ("import horovod.torch as hvd\n", "horovod.torch.size", "hvd.size"),
        ("from horovod import torch as hvd\n", "horovod.torch.local_rank", "hvd.local_rank"),
        ("import torch\nimport torch.distributed as dist\n", "torch.distributed.get_rank", "dist.get_rank"),
        ("import torch.cuda\n", "torch.cuda.set_device", "torch.cuda.set_device"),
        ("from torch.cuda import set_device\nimport torch\n", "torch.cuda.set_device", "set_device"),
        # an import inside a function is not in scope everywhere
        ("def main():\n    import horovod.torch as hvd\n", "horovod.torch.size", None),
        # a name the module rebinds is not the import any more
        ("import horovod.torch as hvd\nhvd = None\n", "horovod.torch.size", None),
        ("import torch\n", "horovod.torch.size", None),
    ],
)
def test_spelling(source: str, qualified: str, expected: object) -> None:
    assert model_of(source).spelling(qualified) == expected


def test_own_lines_only_for_statements_that_start_their_line() -> None:
    source = "if a:\n    hvd.init()  # c\n    y = f(\n      2)\nif b: g()\nh(); k()\nwhile w():\n    pass\n"
    model = model_of(source)
    by_name = {c.dotted: model.own_lines(c) for c in model.calls}
    assert by_name == {
        "hvd.init": (2, 2, "    "),
        "f": (3, 4, "    "),
        "g": None,
        "h": (6, 6, ""),
        "k": (6, 6, ""),
        "w": None,
    }


@pytest.mark.parametrize(
    "code, expected",
    [
        ("args.lr", "args.lr"),
        ("0.1", "0.1"),
        ("args.lr / 2", "args.lr / 2"),
        ("base ** 2", "base ** 2"),
        ("-lr", "-lr"),
        ("(a + b)", "(a + b)"),
        ("a + b", "(a + b)"),
        ("a if c else b", "(a if c else b)"),
        ("not a", "(not a)"),
        ("cfg['lr']", "cfg['lr']"),
    ],
)
def test_as_left_factor(code: str, expected: str) -> None:
    assert as_left_factor(cst.parse_expression(code), code) == expected


LOCAL_RANK_CASES = {
    "torchrun variable": (
        "import os\nimport torch.distributed as dist\ndef main():\n    local_rank = int(os.environ['LOCAL_RANK'])\n"
        "    dist.init_process_group('nccl')\n    X()\n",
        "local_rank",
    ),
    "negative fallback": ("import os\ndef main():\n    local_rank = int(os.environ.get('LOCAL_RANK', -1))\n    X()\n", None),
    "global rank only": ("import os\ndef main():\n    rank = int(os.environ['RANK'])\n    X()\n", None),
    "spawn index stored on args": (
        "import torch.multiprocessing as mp\ndef worker(gpu, args):\n    args.gpu = gpu\n    X()\n"
        "mp.spawn(worker, nprocs=2, args=(1,))\n",
        "args.gpu",
    ),
    "spawn index parameter": (
        "import torch.multiprocessing as mp\ndef worker(gpu, args):\n    X()\nmp.spawn(worker, nprocs=2, args=(1,))\n",
        "gpu",
    ),
    "after hvd.init()": ("import horovod.torch as hvd\ndef main():\n    hvd.init()\n    X()\n", "hvd.local_rank()"),
    "before hvd.init()": ("import horovod.torch as hvd\ndef main():\n    X()\n    hvd.init()\n", None),
    "bound only in a branch": (
        "import os\ndef main(d):\n    if d:\n        local_rank = int(os.environ['LOCAL_RANK'])\n    X()\n",
        None,
    ),
    "argparse --local_rank alone (torchrun passes none)": (
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int, default=0)\n"
        "args = p.parse_args()\nX()\n",
        None,
    ),
    "rank modulo the GPU count": (
        "import torch.distributed as dist, torch\ndef main():\n    rank = dist.get_rank()\n"
        "    device_id = rank % torch.cuda.device_count()\n    X()\n",
        "device_id",
    ),
    "bound in another function": (
        "import os\ndef setup():\n    local_rank = int(os.environ['LOCAL_RANK'])\ndef main():\n    X()\n",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(LOCAL_RANK_CASES))
def test_local_rank_expression(name: str) -> None:
    from ddpdoctor.lint.analysis import ranks

    source, expected = LOCAL_RANK_CASES[name]
    model = model_of(source)
    point = next(c for c in model.calls if c.dotted == "X")
    assert ranks.local_rank_expression(model, point.order, point.ctx) == expected


MAIN_TEST_CASES = {
    "dist.get_rank() written in the same function": (
        "import torch, torch.distributed as dist\ndef main():\n    dist.init_process_group('nccl')\n"
        "    if dist.get_rank() == 0:\n        print('hi')\n    X()\n",
        "dist.get_rank() == 0",
    ),
    "a module-level helper": (
        "import torch.distributed as dist\ndef is_main_process():\n    return dist.get_rank() == 0\ndef main():\n"
        "    dist.init_process_group('nccl')\n    if is_main_process():\n        print('x')\n    X()\n",
        "is_main_process()",
    ),
    "horovod": ("import horovod.torch as hvd\nhvd.init()\nif hvd.rank() == 0:\n    print(1)\nX()\n", "hvd.rank() == 0"),
    "a variable bound by the same assignment at both places": (
        "import torch.distributed as dist\ndef main():\n    dist.init_process_group('nccl')\n    rank = dist.get_rank()\n"
        "    if rank == 0:\n        print(1)\n    X()\n",
        "rank == 0",
    ),
    "a variable of another function": (
        "import torch.distributed as dist\ndef f():\n    rank = dist.get_rank()\n    if rank == 0:\n        print(1)\n"
        "def main():\n    dist.init_process_group('nccl')\n    X()\n",
        None,
    ),
    "a local-rank test (once per node)": (
        "import os, torch.distributed as dist\ndef main():\n    dist.init_process_group('nccl')\n"
        "    local_rank = int(os.environ['LOCAL_RANK'])\n    if local_rank == 0:\n        print(1)\n    X()\n",
        None,
    ),
    "no test at all": ("import torch.distributed as dist\ndist.init_process_group('nccl')\nX()\n", None),
    "a rank test mixed with an epoch test": (
        "import torch.distributed as dist\ndef main(epoch):\n    dist.init_process_group('nccl')\n"
        "    if dist.get_rank() == 0 and epoch % 5 == 0:\n        print(1)\n    X()\n",
        None,
    ),
    "the else of a non-zero test: its text says the opposite": (
        "import torch.distributed as dist\ndef main():\n    dist.init_process_group('nccl')\n"
        "    if dist.get_rank() != 0:\n        pass\n    else:\n        print(1)\n    X()\n",
        None,
    ),
    "an attribute of self (any call may change it)": (
        "import torch.distributed as dist\nclass Trainer:\n    def run(self):\n        dist.init_process_group('nccl')\n"
        "        self.rank = dist.get_rank()\n        if self.rank == 0:\n            print(1)\n        X()\n",
        None,
    ),
    "the single-process-or-rank-0 idiom": (
        "import torch.distributed as dist\ndef main(args):\n    dist.init_process_group('nccl')\n"
        "    if not args.distributed or args.rank == 0:\n        print(1)\n    X()\n",
        "not args.distributed or args.rank == 0",
    ),
    # A flag raised only under `rank == 0` says "main process" in a distributed run, but stays False in a
    # single-process run: as the test of a fix it would stop that run from saving at all.
    "a flag raised on rank 0": (
        "import torch.distributed as dist\ndef main():\n    dist.init_process_group('nccl')\n    loud = False\n"
        "    if dist.get_rank() == 0:\n        loud = True\n    if loud:\n        print(1)\n    X()\n",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(MAIN_TEST_CASES))
def test_main_process_test(name: str) -> None:
    from ddpdoctor.lint.analysis import ranks

    source, expected = MAIN_TEST_CASES[name]
    model = model_of(source)
    point = next(c for c in model.calls if c.dotted == "X")
    assert ranks.main_process_test(model, point) == expected


def test_indentable_lines_refuses_multiline_strings() -> None:
    model = model_of('def f():\n    save(x,\n         "a")  # c\n    save(y, """\nz""")\n')
    first, second = [c for c in model.calls if c.dotted == "save"]
    assert model.indentable_lines(first) == ["    save(x,", '         "a")  # c']
    assert model.indentable_lines(second) is None
