"""The analysis facts issue 11's rules (DDP012, DP003, DDP001/DDP008 extensions) added, asked
directly: node indices and once-per-node conditions, which rank a condition compares, the
`n_gpu > 1` single-process idiom, process groups (DeepSpeed included), multi-node evidence, CUDA
use, this process's device for a fix, and `Klass(...)` reaching `__init__`."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import ModuleModel, Runs, build_analysis, devices, launch, ranks, who_runs

PRELUDE = """\
import argparse
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
"""


def build(source: str, world_size: Optional[int] = None) -> ModuleModel:
    return build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)), world_size=world_size)


def target(model: ModuleModel):  # type: ignore[no-untyped-def]
    (call,) = [c for c in model.calls if c.dotted == "target"]
    return call


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("args = argparse.Namespace()\nif args.nr == 0:\n    target()\n", Runs.NODE0),
        ("node_rank = int(os.environ['GROUP_RANK'])\nif node_rank == 0:\n    target()\n", Runs.NODE0),
        ("if int(os.environ['SLURM_NODEID']) == 0:\n    target()\n", Runs.NODE0),
        ("machine_rank = 0\nif 0 == machine_rank:\n    target()\n", Runs.NODE0),
        ("step = 0\nnode_rank = 1\nif step % 10 == 0 and node_rank == 0:\n    target()\n", Runs.NODE0),
        ("node_rank = 1\nif node_rank in [0]:\n    target()\n", Runs.NODE0),
        # a name of any spelling bound to the node index
        ("node = int(os.environ['SLURM_NODEID'])\nif node == 0:\n    target()\n", Runs.NODE0),
        # `!=`, `or` and the `else` side do not restrict to node 0 (a zero test on a non-rank stays undecidable).
        ("node_rank = 1\nif node_rank != 0:\n    target()\n", Runs.UNKNOWN),
        ("node_rank = 1\nok = True\nif ok or node_rank == 0:\n    target()\n", Runs.UNKNOWN),
        ("node_rank = 1\nif node_rank == 0:\n    pass\nelse:\n    target()\n", Runs.UNKNOWN),
        # A global rank built from the node index is a rank, not the node.
        ("args = argparse.Namespace()\nrank = args.nr * 8 + 1\nif rank == 0:\n    target()\n", Runs.RANK0),
        ("def save():\n    target()\nargs = argparse.Namespace()\nif args.nr == 0:\n    save()\n", Runs.NODE0),
    ],
)
def test_node_index_conditions(source: str, expected: Runs) -> None:
    model = build(source)
    assert who_runs(model, target(model)).runs is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", Runs.SINGLE), ("torch.cuda.device_count()", Runs.ALL)],
)
def test_n_gpu_idiom(value: str, expected: Runs) -> None:
    source = f"""\
    args = argparse.Namespace()
    if args.local_rank == -1:
        args.n_gpu = torch.cuda.device_count()
    else:
        dist.init_process_group("nccl")
        args.n_gpu = {value}
    if args.n_gpu > 1:
        target()
    """
    for text, answer in ((source, expected), (source.replace("> 1", ">= 2"), expected), (source.replace("> 1", "> 2"), Runs.ALL)):
        model = build(text)
        assert who_runs(model, target(model)).runs is answer


@pytest.mark.parametrize(
    ("test", "kinds"),
    [
        ("dist.get_rank() == 0", {"global"}),
        ("int(os.environ['LOCAL_RANK']) == 0", {"local"}),
        ("args.local_rank in [-1, 0]", {"local"}),
        ("args.local_rank == -1 or dist.get_rank() == 0", {"global"}),
        ("not args.distributed or args.rank % ngpus == 0", {"local"}),
        ("gpu == 0", {"local"}),
        ("is_local_main_process()", {"local"}),
        ("is_main_process()", {"global"}),
        ("is_master", {"local"}),
        ("args.rank == 0 and gpu == 0", {"global", "local"}),
        # built in steps (`args.rank += gpu` after `node * ngpus`): not certainly local
        ("args.rank == 0", {"global"}),
        ("stepped.rank == 0", {"unknown"}),
        ("not (dist.get_rank() != 0)", {"global"}),
        # the operand true only in distributed runs says nothing about which rank
        ("args.distributed and dist.get_rank() == 0", {"global"}),
    ],
)
def test_guard_rank_kinds(test: str, kinds: set[str]) -> None:
    source = f"""\
    def worker(gpu, args, ngpus):
        is_master = int(os.environ["LOCAL_RANK"]) == 0
        stepped = argparse.Namespace()
        stepped.rank = int(os.environ["SLURM_NODEID"]) * ngpus
        stepped.rank += gpu
        if {test}:
            target()
    mp.spawn(worker, nprocs=2)
    """
    model = build(source)
    answer = who_runs(model, target(model))
    assert answer.guard is not None
    assert ranks.guard_rank_kinds(model, answer.guard) == kinds


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("dist.init_process_group('nccl')\n", "torch.distributed.init_process_group"),
        ("dist.init_process_group('gloo', rank=0, world_size=1)\n", None),
        ("import horovod.torch as hvd\nhvd.init()\n", "horovod.torch.init"),
        ("import deepspeed\ndeepspeed.init_distributed()\n", "deepspeed.init_distributed"),
        ("import deepspeed\nengine, *_ = deepspeed.initialize(model=m)\n", "deepspeed.initialize"),
        # a DDP wrap or a spawn alone is no process group created here
        ("m = torch.nn.parallel.DistributedDataParallel(m)\nmp.spawn(print, nprocs=2)\n", None),
    ],
)
def test_process_group_setup(source: str, expected: Optional[str]) -> None:
    found = launch.process_group_setup(build(source))
    assert (found.name if found is not None else None) == expected
    if expected is not None:
        assert launch.process_group_setup(build(source, world_size=1)) is None


def test_multiprocess_evidence_knows_deepspeed() -> None:
    found = launch.multiprocess_evidence(build("import deepspeed\ndeepspeed.init_distributed()\n"))
    assert found is not None and found.name == "deepspeed.init_distributed"


@pytest.mark.parametrize(
    ("source", "several"),
    [
        ("p = argparse.ArgumentParser()\np.add_argument('--nnodes', type=int)\n", True),
        ("p = argparse.ArgumentParser()\np.add_argument('-nr', '--nr', type=int)\n", True),
        ("p = argparse.ArgumentParser()\np.add_argument('--node-rank', type=int)\n", True),
        ("p = argparse.ArgumentParser()\np.add_argument('--n', dest='num_nodes', type=int)\n", True),
        ("n = int(os.environ['SLURM_NNODES'])\n", True),
        ("g = os.environ.get('GROUP_RANK')\n", True),
        ("node_rank = 0\n", True),
        # what torchrun sets on any node, a help text, a parameter: no evidence of several nodes
        ("r = int(os.environ['LOCAL_RANK'])\nw = int(os.environ['WORLD_SIZE'])\n", False),
        ("p = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int, help='nodes')\n", False),
        ("def f(nodes):\n    return nodes\n", False),
    ],
)
def test_multinode_evidence(source: str, several: bool) -> None:
    assert (launch.multinode_evidence(build(source)) is not None) is several


@pytest.mark.parametrize(
    ("source", "cuda"),
    [
        ("m = torch.nn.Linear(2, 2).cuda()\n", True),
        ("torch.cuda.set_device(0)\n", True),
        ("d = torch.device('cuda:1')\n", True),
        ("d = f'cuda:{r}'\n", True),
        ("dist.init_process_group('nccl')\n", True),
        ("m = Wrap(m, device_ids=[r])\n", True),
        ("dist.init_process_group('gloo')\nm = torch.nn.Linear(2, 2).to('cpu')\nname = 'cudagraphs'\n", False),
    ],
)
def test_uses_cuda(source: str, cuda: bool) -> None:
    assert devices.uses_cuda(build(source)) is cuda


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("local_rank = int(os.environ['LOCAL_RANK'])\ndevice = torch.device('cuda', local_rank)\ntarget()\n", "device"),
        ("local_rank = int(os.environ['LOCAL_RANK'])\nloc = f'cuda:{local_rank}'\ntarget()\n", "loc"),
        # the process index mp.spawn passes is the local rank too
        ("def worker(i):\n    loc = f'cuda:{i}'\n    target()\nmp.spawn(worker, nprocs=2)\n", "loc"),
        ("local_rank = int(os.environ['LOCAL_RANK'])\ntorch.cuda.set_device(local_rank)\ntarget()\n", 'f"cuda:{local_rank}"'),
        # the global rank is no device; a pin under another condition, or after the call, does not count
        ("rank = dist.get_rank()\ndevice = torch.device('cuda', rank)\ntarget()\n", None),
        ("local_rank = int(os.environ['LOCAL_RANK'])\nif ok:\n    torch.cuda.set_device(local_rank)\ntarget()\n", None),
        ("local_rank = int(os.environ['LOCAL_RANK'])\ntarget()\ntorch.cuda.set_device(local_rank)\n", None),
        ("local_rank = int(os.environ['LOCAL_RANK'])\nif ok:\n    device = torch.device('cuda', local_rank)\ntarget()\n", None),
        # an attribute is no plain variable: any call in between may rebind it
        ("local_rank = int(os.environ['LOCAL_RANK'])\nargs.device = torch.device('cuda', local_rank)\ntarget()\n", None),
    ],
)
def test_local_device_expression(source: str, expected: Optional[str]) -> None:
    model = build(source)
    assert devices.local_device_expression(model, target(model)) == expected


def test_constructor_call_reaches_init() -> None:
    source = """\
    class Trainer:
        def __init__(self):
            target()
    class Other:
        def __init__(self):
            pass
    if dist.get_rank() == 0:
        Trainer()
    Other()
    """
    model = build(source)
    assert who_runs(model, target(model)).runs is Runs.RANK0
    (init,) = [f for f in model.functions if f.qualname == "Trainer.__init__"]
    assert [c.dotted for c in model.callers(init)] == ["Trainer"]


@pytest.mark.parametrize(
    "test",
    ["RANK == -1", "LOCAL_RANK == -1", "WORLD_SIZE == 1", "cuda and RANK == -1 and torch.cuda.device_count() > 1"],
)
def test_upper_case_launcher_constants_are_single_process_tests(test: str) -> None:
    source = f"RANK = int(os.getenv('RANK', -1))\nLOCAL_RANK = RANK\nWORLD_SIZE = 1\ncuda = True\nif {test}:\n    target()\n"
    model = build(source)
    assert who_runs(model, target(model)).runs is Runs.SINGLE


@pytest.mark.parametrize(("value", "expected"), [("1", Runs.SINGLE), ("2", Runs.ALL)])
def test_n_gpu_idiom_through_a_helper_parameter(value: str, expected: Runs) -> None:
    source = f"""\
    def train(args, model):
        if args.n_gpu > 1 and not isinstance(model, torch.nn.DataParallel):
            target()
    def main():
        args = argparse.Namespace()
        if args.local_rank == -1:
            args.n_gpu = torch.cuda.device_count()
        else:
            dist.init_process_group("nccl")
            args.n_gpu = {value}
        train(args, None)
    main()
    """
    model = build(source)
    assert who_runs(model, target(model)).runs is expected


# ---- facts moved out of rules (issue 10: a rule never walks the tree itself)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("f'ckpt_node{args.nr}.pt'", True),
        ("f'ckpt_{socket.gethostname()}.pt'", True),
        ("node_path", True),  # followed through the variable
        ("f'ckpt_{args.epoch}.pt'", False),
        ("'ckpt.pt'", False),
    ],
)
def test_names_the_node(path: str, expected: bool) -> None:
    source = f"""\
    import socket
    args = argparse.Namespace()
    node_rank = int(os.environ["GROUP_RANK"])
    node_path = f"ckpt_{{node_rank}}.pt"
    target({path})
    """
    model = build(source)
    call = target(model)
    value = call.arg(0)
    assert value is not None
    assert ranks.names_the_node(model, value, call.order, call.function) is expected


@pytest.mark.parametrize(
    ("expr", "expected"),
    [("model.state_dict()", True), ("self.net", True), ("params", True), ("optimizer.zero_grad()", False), ("1", False)],
)
def test_mentions_identifier(expr: str, expected: bool) -> None:
    from ddpdoctor.lint.analysis import syntax

    node = cst.parse_expression(expr)
    assert syntax.mentions_identifier(node, ("state_dict", "model", "net", "params")) is expected


@pytest.mark.parametrize(
    ("expr", "divisors"),
    [("(i + 1) % accum == 0", ["accum"]), ("i % 2 == 0 and step % args.k == 1", ["2", "args.k"]), ("i == 0", [])],
)
def test_modulo_divisors(expr: str, divisors: list[str]) -> None:
    from ddpdoctor.lint.analysis import syntax

    module = cst.Module(body=[])
    found = [module.code_for_node(d) for d in syntax.modulo_divisors(cst.parse_expression(expr))]
    assert sorted(found) == sorted(divisors)
