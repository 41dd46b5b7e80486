"""Issue 11's rules and extensions end to end (DDP012, DP003, DDP001's fixed value, DDP008's
once-per-node saves): the cases the fixtures only show indirectly, each written to fail if one
condition of the rule is dropped."""

from __future__ import annotations

import textwrap

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source

TORCHRUN = """\
import argparse
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = torch.nn.Linear(4, 4).cuda(local_rank)
"""


def lines(source: str, code: str, world_size: int | None = None) -> list[int]:
    findings = lint_source(textwrap.dedent(source), "train.py", Settings(select=(code,), world_size=world_size)).findings
    return [f.line for f in findings if f.code == code]


def messages(source: str, code: str) -> list[str]:
    findings = lint_source(textwrap.dedent(source), "train.py", Settings(select=(code,))).findings
    return [f.message for f in findings if f.code == code]


# ---------------------------------------------------------------------------------------- DDP012


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ('model.load_state_dict(torch.load("c.pt"))\n', [10]),
        ('sd = torch.load("c.pt")["model"]\nmodel.load_state_dict(sd)\n', [10]),
        ('ckpt = torch.load("c.pt")\nmodel.load_state_dict(ckpt.get("model"))\n', [10]),
        # A key-renaming comprehension over the loaded dict is still the checkpoint.
        ('ckpt = torch.load("c.pt")\nmodel.load_state_dict({k[7:]: v for k, v in ckpt["model"].items()})\n', [10]),
        ('model.load_state_dict(torch.load("c.pt", "cpu"))\n', []),
        ('model.load_state_dict(torch.load("c.pt", map_location=None))\n', []),
        # Unreadable or later-completed kwargs may hold map_location: silent.
        ('model.load_state_dict(torch.load("c.pt", *extra))\n', []),
        ('kw = {}\nkw["map_location"] = "cpu"\nmodel.load_state_dict(torch.load("c.pt", **kw))\n', []),
        ('kw = dict(map_location="cpu")\nmodel.load_state_dict(torch.load("c.pt", **kw))\n', []),
        ('kw = dict(weights_only=True)\nmodel.load_state_dict(torch.load("c.pt", **kw))\n', [11]),
        # Data, not a checkpoint.
        ('table = torch.load("c.pt")\nmodel.weight.data.copy_(table)\n', []),
        # Rank 0 only, or the single-process branch.
        ('if dist.get_rank() == 0:\n    model.load_state_dict(torch.load("c.pt"))\n', []),
        ('world_size = int(os.environ.get("WORLD_SIZE", 1))\nif world_size == 1:\n    model.load_state_dict(torch.load("c.pt"))\n', []),
        # A module-level helper nobody here calls: who runs it is unknown.
        ('def restore(m, p):\n    m.load_state_dict(torch.load(p))\n', []),
        ('def restore(m, p):\n    m.load_state_dict(torch.load(p))\nrestore(model, "c.pt")\n', [11]),
    ],
)
def test_ddp012_cases(tail: str, expected: list[int]) -> None:
    assert lines(TORCHRUN + tail, "DDP012") == expected


def test_ddp012_needs_cuda_and_several_processes() -> None:
    cpu = TORCHRUN.replace('"nccl"', '"gloo"').replace(".cuda(local_rank)", "").replace(
        "torch.cuda.set_device(local_rank)\n", ""
    )
    assert lines(cpu + 'model.load_state_dict(torch.load("c.pt"))\n', "DDP012") == []
    gpu = TORCHRUN + 'model.load_state_dict(torch.load("c.pt"))\n'
    assert lines(gpu, "DDP012", world_size=1) == []
    single = "import torch\nmodel = torch.nn.Linear(4, 4).cuda()\nmodel.load_state_dict(torch.load('c.pt'))\n"
    assert lines(single, "DDP012") == []


def test_ddp012_message_names_the_restore_line() -> None:
    (message,) = messages(TORCHRUN + 'ckpt = torch.load("c.pt")\n\nmodel.load_state_dict(ckpt["model"])\n', "DDP012")
    assert "restored by load_state_dict at line 12" in message and "map_location" in message


# ---------------------------------------------------------------------------------------- DP003


def test_dp003_fires_on_the_rank_path_only() -> None:
    source = TORCHRUN + "m1 = torch.nn.DataParallel(model)\nif not dist.is_initialized():\n    m2 = torch.nn.DataParallel(model)\n"
    assert lines(source, "DP003") == [10]


@pytest.mark.parametrize(
    "setup",
    ["import deepspeed\ndeepspeed.initialize(model=net)\n", "import horovod.torch as hvd\nhvd.init()\n"],
)
def test_dp003_knows_deepspeed_and_horovod(setup: str) -> None:
    source = "import torch\n" + setup + "net = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"
    assert lines(source, "DP003") == [len(source.splitlines())]


def test_dp003_silent_without_a_process_group_of_several() -> None:
    world_one = 'import torch\nimport torch.distributed as dist\ndist.init_process_group("gloo", rank=0, world_size=1)\nnet = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n'
    assert lines(world_one, "DP003") == []
    spawn_only = "import torch\nimport torch.multiprocessing as mp\nnet = torch.nn.DataParallel(torch.nn.Linear(2, 2))\nmp.spawn(print, nprocs=2)\n"
    assert lines(spawn_only, "DP003") == []


def test_dp003_n_gpu_branch_is_single_process_only_when_set_to_one() -> None:
    base = TORCHRUN + "args = argparse.Namespace()\nargs.n_gpu = {value}\nif args.n_gpu > 1:\n    model = torch.nn.DataParallel(model)\n"
    assert lines(base.format(value="torch.cuda.device_count()"), "DP003") == [13]
    assert lines(base.format(value="1"), "DP003") == []


def test_dp003_silent_when_the_other_branch_of_the_same_if_wraps_in_ddp() -> None:
    source = TORCHRUN + "flag = True\nif flag:\n    m = torch.nn.DataParallel(model)\nelse:\n    m = DDP(model)\n"
    assert lines(source, "DP003") == []
    source = TORCHRUN + "flag = True\nif flag:\n    m = torch.nn.DataParallel(model)\nif not flag:\n    m = DDP(model)\n"
    assert lines(source, "DP003") == [12]


def test_dp003_skips_test_suites() -> None:
    source = "import unittest\n" + TORCHRUN + "m = torch.nn.DataParallel(model)\n"
    assert lines(source, "DP003") == []


# ---------------------------------------------------------------------------------------- DDP001

LOOP = """\
import argparse
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
dist.init_process_group("nccl")
parser = argparse.ArgumentParser()
args = parser.parse_args()
sampler = DistributedSampler(train_set)
loader = DataLoader(train_set, sampler=sampler)
start = 3
for epoch in range(args.epochs):
    sampler.set_epoch({value})
    for x, y in loader:
        model(x).sum().backward()
{after}"""


@pytest.mark.parametrize(
    ("value", "after", "expected"),
    [
        ("0", "", [12]),
        ("-1", "", [12]),
        ("args.epochs", "", [12]),
        ("start", "", [12]),
        ("int(start) + 1", "", [12]),
        ("epoch", "", []),
        ("start + epoch", "", []),
        ("args.epochs", "    args.epochs += 1\n", []),
        ("start", "    start += 1\n", []),
        ("trainer.state.epoch", "", []),
        ("next_epoch()", "", []),
        ("epochs_seen[0]", "", []),
        ("unknown_global", "", []),
    ],
)
def test_ddp001_value_that_does_not_change(value: str, after: str, expected: list[int]) -> None:
    assert lines(LOOP.format(value=value, after=after), "DDP001") == expected


def test_ddp001_fixed_value_has_its_own_message_and_no_fix() -> None:
    source = LOOP.format(value="args.epochs", after="")
    findings = lint_source(source, "train.py", Settings(select=("DDP001",))).findings
    (finding,) = findings
    assert "called with a value that does not change per epoch" in finding.message
    assert "`sampler.set_epoch(epoch)`" in finding.message
    assert finding.fix is None


def test_ddp001_self_counter_set_outside_init_is_not_fixed() -> None:
    source = textwrap.dedent(
        """\
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler
        class T:
            def __init__(self, ds):
                dist.init_process_group("nccl")
                self.sampler = DistributedSampler(ds)
                self.loader = DataLoader(ds, sampler=self.sampler)
                self.epoch = 0
            def on_epoch_end(self):
                self.epoch = self.epoch + 1
            def fit(self, model):
                for _ in range(10):
                    self.sampler.set_epoch(self.epoch)
                    for x in self.loader:
                        model(x).backward()
        """
    )
    assert lines(source, "DDP001") == []
    assert lines(source.replace("self.epoch = self.epoch + 1", "pass"), "DDP001") == [13]


# ---------------------------------------------------------------------------------------- DDP008

SPAWN = """\
import argparse
import socket
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
def worker(gpu, args):
    rank = args.nr * args.gpus + gpu
    dist.init_process_group("nccl", rank=rank, world_size=args.gpus * args.nodes)
    model = torch.nn.Linear(2, 2).cuda(gpu)
    if {test}:
        torch.save(model.state_dict(), {path})
parser = argparse.ArgumentParser()
parser.add_argument("--nodes", type=int, default=2)
parser.add_argument("--gpus", type=int, default=8)
parser.add_argument("--nr", type=int, default=0)
args = parser.parse_args()
mp.spawn(worker, nprocs=args.gpus, args=(args,))
"""


@pytest.mark.parametrize(
    ("test", "path", "word"),
    [
        ("args.nr == 0", '"ckpt.pt"', "node index"),
        ("0 == args.nr", '"ckpt.pt"', "node index"),
        ("args.nr in [0]", '"ckpt.pt"', "node index"),
        ("gpu == 0", '"ckpt.pt"', "once per node"),
        ("rank % args.gpus == 0", '"ckpt.pt"', "once per node"),
        ("gpu == 0", 'f"node{args.nr}/ckpt.pt"', None),
        ("gpu == 0", 'f"{socket.gethostname()}/ckpt.pt"', None),
        ("rank == 0", '"ckpt.pt"', None),
        ("dist.get_rank() == 0", '"ckpt.pt"', None),
        ("args.nr != 0", '"ckpt.pt"', None),
    ],
)
def test_ddp008_once_per_node(test: str, path: str, word: str | None) -> None:
    found = messages(SPAWN.format(test=test, path=path), "DDP008")
    if word is None:
        assert found == []
    else:
        (message,) = found
        assert word in message and "every rank" not in message


def test_ddp008_local_rank_guard_needs_several_nodes() -> None:
    single = SPAWN.replace('parser.add_argument("--nodes", type=int, default=2)\n', "").replace(
        'parser.add_argument("--nr", type=int, default=0)\n', ""
    ).replace("args.nr * args.gpus + gpu", "gpu").replace("args.gpus * args.nodes", "args.gpus")
    assert messages(single.format(test="gpu == 0", path='"ckpt.pt"'), "DDP008") == []
    assert len(messages(SPAWN.format(test="gpu == 0", path='"ckpt.pt"'), "DDP008")) == 1


def test_ddp008_helper_called_under_node_guard() -> None:
    source = SPAWN.format(test="args.nr == 0", path='"ckpt.pt"').replace(
        "        torch.save(model.state_dict(), \"ckpt.pt\")\n", "        save(model)\n"
    ) + "def save(model):\n    torch.save(model.state_dict(), 'ckpt.pt')\n"
    assert lines(source, "DDP008") == [19]
