"""Unit tests for the device and rank placement rules (DDP003, DDP004, DDP005, DDP011, HVD003):
the decisions the fixtures do not pin down one by one."""

from __future__ import annotations

import textwrap

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source

HEADER = """
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
"""


def findings(source: str, code: str, world_size: int | None = None) -> list:
    text = HEADER + textwrap.dedent(source)
    result = lint_source(text, "snippet.py", Settings(select=(code,), world_size=world_size))
    return [f for f in result.findings if f.code == code]


# ---- DDP003 hardcoded-rank


@pytest.mark.parametrize(
    "source",
    [
        # rank 0 runs on local GPU 0 under every standard launcher
        """
        dist.init_process_group("nccl")
        if dist.get_rank() == 0:
            probe = torch.zeros(1, device="cuda:0")
        """,
        # only on the single-process path
        """
        if args.distributed:
            dist.init_process_group("nccl")
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        else:
            device = torch.device("cuda:0")
        """,
        # the tutorial's remapping: "cuda:0" is the key, not the target
        """
        dist.init_process_group("nccl")
        rank = int(os.environ["LOCAL_RANK"])
        state = torch.load("ckpt.pt", map_location={"cuda:0": f"cuda:{rank}"})
        """,
        # a single-process group
        """
        dist.init_process_group("gloo", rank=0, world_size=1)
        model = DDP(model.to("cuda:0"), device_ids=[0])
        """,
        # the `else` of a world-size test is the single-process side
        """
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        if world_size > 1:
            dist.init_process_group("nccl")
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        else:
            device = torch.device("cuda:0")
        """,
        # the index comes from an option the launcher sets per process
        """
        dist.init_process_group("nccl")
        torch.cuda.set_device(args.gpu)
        """,
        # no multi-process evidence at all
        """
        model = model.to("cuda:0")
        torch.cuda.set_device(0)
        """,
        # the literal is only one of the values: the other is computed
        """
        dist.init_process_group("nccl")
        device = "cuda:0"
        if "LOCAL_RANK" in os.environ:
            device = f"cuda:{os.environ['LOCAL_RANK']}"
        model.to(device)
        """,
    ],
)
def test_ddp003_silent(source: str) -> None:
    assert findings(source, "DDP003") == []


def test_ddp003_cuda_if_available_else_cpu_is_still_hardcoded() -> None:
    found = findings(
        """
        dist.init_process_group("nccl")
        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        """,
        "DDP003",
    )
    assert len(found) == 1
    assert "init_process_group at line" in found[0].message


def test_ddp003_reports_a_shared_literal_once_and_each_inline_literal() -> None:
    # A literal defined once is one fix (at its line); literals written at each use are each a fix.
    found = findings(
        """
        dist.init_process_group("nccl")
        device = "cuda:0"
        x = x.to(device)
        y = y.to(device)
        z = z.to("cuda:1")
        w = w.cuda(0)
        """,
        "DDP003",
    )
    assert [f.line for f in found] == [10, 12, 13]  # after the 7-line header
    assert "(set at line 9)" in found[0].message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('dist.init_process_group("nccl", rank=0)\n', 1),
        ('dist.init_process_group("nccl", rank=0, world_size=int(os.environ["WORLD_SIZE"]))\n', 1),
        ('dist.init_process_group("nccl", rank=0, world_size=4)\n', 1),
        ('dist.init_process_group("nccl", rank=0, world_size=n)\n', 0),  # unknown world size
        ('dist.init_process_group("nccl", rank=-1)\n', 0),  # -1: taken from the environment
    ],
)
def test_ddp003_init_rank(source: str, expected: int) -> None:
    assert len(findings(source, "DDP003")) == expected


def test_ddp003_visible_devices_idiom_is_silent_for_devices_only() -> None:
    source = """
    os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)
    dist.init_process_group("nccl", rank=0, world_size=2)
    torch.cuda.set_device(0)
    """
    found = findings(source, "DDP003")
    assert [f.line for f in found] == [9]  # the literal rank, not set_device(0)


# ---- DDP004 global-rank-as-device


@pytest.mark.parametrize(
    "source",
    [
        "torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())\n",
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n",
        # only the name says "rank": not traced to a source, not reported
        """
        def setup(rank):
            torch.cuda.set_device(rank)
        """,
        # the mp.spawn index, through a helper parameter
        """
        def setup(rank, world_size):
            torch.cuda.set_device(rank)
            dist.init_process_group("nccl", rank=rank, world_size=world_size)

        def worker(rank, world_size):
            setup(rank, world_size)

        mp.spawn(worker, args=(2,), nprocs=2)
        """,
        # sources disagree: stay silent
        """
        gpu = dist.get_rank() if os.environ.get("SINGLE_NODE") else int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(gpu)
        """,
    ],
)
def test_ddp004_silent(source: str) -> None:
    assert findings(source, "DDP004") == []


@pytest.mark.parametrize(
    "source",
    [
        "model = DDP(model, device_ids=[dist.get_rank()])\n",
        'device = "cuda:%d" % dist.get_rank()\nx = x.to(device)\n',
        'device = "cuda:{}".format(int(os.environ["RANK"]))\ntorch.cuda.set_device(device)\n',
        # a get_rank() helper with the usual single-process fallback
        """
        def get_rank():
            if not dist.is_initialized():
                return 0
            return dist.get_rank()

        torch.cuda.set_device(get_rank())
        """,
        # a copy of the environment (pytorch/examples distributed/ddp/example.py)
        """
        env = {key: os.environ[key] for key in ("RANK", "WORLD_SIZE")}
        rank = int(env["RANK"])
        torch.cuda.set_device(rank)
        """,
    ],
)
def test_ddp004_reports(source: str) -> None:
    assert len(findings(source, "DDP004")) == 1


def test_ddp004_device_object_reported_once() -> None:
    found = findings(
        """
        device = torch.device("cuda", dist.get_rank())
        model.to(device)
        batch.to(device)
        torch.cuda.set_device(device)
        """,
        "DDP004",
    )
    assert len(found) == 1


# ---- DDP005 world-size-from-device-count


def test_ddp005_setting_the_environment_is_not_reading_it() -> None:
    source = """
    def worker(rank):
        os.environ["RANK"] = str(rank)
        dist.init_process_group("nccl", rank=rank, world_size=torch.cuda.device_count())

    mp.spawn(worker, nprocs=torch.cuda.device_count())
    """
    assert findings(source, "DDP005") == []


def test_ddp005_env_init_without_spawn_is_a_launcher() -> None:
    source = """
    dist.init_process_group("nccl", init_method="env://", rank=args.local_rank, world_size=torch.cuda.device_count())
    """
    assert len(findings(source, "DDP005")) == 1


def test_ddp005_augmented_world_size_is_silent() -> None:
    source = """
    world_size = torch.cuda.device_count()
    world_size *= int(os.environ["NNODES"])
    dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=world_size)
    """
    assert findings(source, "DDP005") == []


# ---- DDP011 missing-set-device


@pytest.mark.parametrize(
    "source",
    [
        'dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))\n',
        "dist.init_process_group(backend)\n",  # cannot be followed
        # a utils-module helper no one in this file calls: the caller may pin first
        """
        def setup():
            dist.init_process_group("nccl")
        """,
        # a unit-test harness
        """
        class TestCollectives:
            def test_allreduce(self):
                dist.init_process_group("nccl")
        """,
    ],
)
def test_ddp011_silent(source: str) -> None:
    assert findings(source, "DDP011") == []


@pytest.mark.parametrize(
    "backend",
    ['"nccl" if torch.cuda.is_available() else "gloo"', '"gloo" if args.cpu else "nccl"'],
)
def test_ddp011_conditional_backend_with_an_nccl_arm(backend: str) -> None:
    # Issue 10: both arms are followed; the run that takes the NCCL arm needs its GPU pinned.
    consumer = "dist.barrier()\n"  # issue 10: only a use of the current device makes a finding
    assert len(findings(f"dist.init_process_group({backend})\n" + consumer, "DDP011")) == 1
    assert findings(f"dist.init_process_group({backend.replace('nccl', 'mpi')})\n" + consumer, "DDP011") == []


def test_ddp011_spawn_target_counts_as_called() -> None:
    source = """
    def worker(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        model = DDP(model.to(rank), device_ids=[rank])
        dist.barrier()

    mp.spawn(worker, args=(2,), nprocs=2)
    """
    assert len(findings(source, "DDP011")) == 1


# ---- HVD003 horovod-missing-set-device


@pytest.mark.parametrize(
    "source",
    [
        # explicit per-process indices do not depend on the current device
        "import horovod.torch as hvd\nhvd.init()\nx = x.cuda(hvd.local_rank())\n",
        'import horovod.torch as hvd\nhvd.init()\ndevice = torch.device("cuda", hvd.local_rank())\nx = x.to(device)\n',
        # a launcher wrapper gives each process one GPU
        'import horovod.torch as hvd\n'
        'os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]\n'
        'hvd.init()\nx = x.cuda()\n',
        # Horovod for TensorFlow: not this rule
        "import horovod.tensorflow as hvd\nhvd.init()\nx = x.cuda()\n",
    ],
)
def test_hvd003_silent(source: str) -> None:
    assert findings(source, "HVD003") == []


def test_hvd003_reports_bare_cuda() -> None:
    found = findings("import horovod.torch as hvd\nhvd.init()\nmodel = model.cuda()\n", "HVD003")
    assert len(found) == 1
    assert "line 9" in found[0].message  # the .cuda() call


@pytest.mark.parametrize("url", ["tcp://127.0.0.1:29511", "tcp://localhost:23456"])
def test_ddp005_loopback_rendezvous_is_one_node(url: str) -> None:
    source = f"""
    rank = int(os.environ["RANK"])
    dist.init_process_group("nccl", init_method="{url}", rank=rank, world_size=torch.cuda.device_count())
    """
    assert findings(source, "DDP005") == []
    assert len(findings(source.replace(url, "env://"), "DDP005")) == 1
