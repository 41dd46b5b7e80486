"""The facts DDP015/DDP016/DDP017/DDP019 ask, asked directly: which evaluations run on shards and
whether their score is combined across ranks (`evaluation`), which `rank=` arguments are local
ranks and which jobs are single-node by construction (`rank_arguments`), which writes every rank
makes on one path (`shared_writes`). Each is tested just inside and just past what it accepts."""

from __future__ import annotations

import pathlib
import textwrap

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import ModuleModel, ProjectSources, build_analysis, evaluation, rank_arguments, shared_writes

HEAD = """\
import os
import tempfile
import numpy as np
import torch
import torch.distributed as dist
import torchvision
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
dist.init_process_group("nccl")
"""


def model_of(source: str, project: ProjectSources | None = None, path: str = "<string>") -> ModuleModel:
    return build_analysis(cst.parse_module(HEAD + textwrap.dedent(source)), path, project=project)


# ------------------------------------------------------------------------------------ evaluation

EVAL = """\
loader = DataLoader(ds, sampler={sampler})
@torch.no_grad()
def check(model):
    total = 0.0
    for x, y in loader:
        total += (model(x) == y).sum().item()
{after}
"""


def unreduced(sampler: str = "DistributedSampler(ds)", after: str = "    return total") -> int:
    return len(evaluation.unreduced_evaluations(model_of(EVAL.format(sampler=sampler, after=after))))


@pytest.mark.parametrize(
    "after, expected",
    [
        ("    return total", 1),
        ("    print(total)", 1),  # only logged
        ("    best = total", 1),  # kept as the best score
        ("    dist.all_reduce(total)\n    return total", 0),
        ("    return reduce_tensor(total)", 0),  # a helper named for reducing
        ("    dist.barrier()\n    return total", 1),  # a barrier combines nothing
        ("    pass", 0),  # the result is neither returned nor reported
        ("    print('done')", 0),  # a progress line without the loop's result
        ("    return model", 0),  # returns something the loop did not accumulate
        ("    score = total / 2\n    print(score)", 1),  # the result reported through a variable
    ],
)
def test_an_evaluation_is_unreduced_until_something_combines_it(after: str, expected: int) -> None:
    assert unreduced(after=after) == expected


def test_only_a_split_loader_makes_a_shard_evaluation() -> None:
    assert unreduced(sampler="None") == 0
    assert unreduced(sampler="torch.utils.data.SequentialSampler(ds)") == 0


def test_a_training_loop_is_no_evaluation() -> None:
    source = EVAL.format(sampler="DistributedSampler(ds)", after="    return total").replace(
        "        total +=", "        model(x).sum().backward()\n        total +="
    )
    assert evaluation.unreduced_evaluations(model_of(source)) == []


SCRIPT_EVAL = """\
loader = DataLoader(ds, sampler={sampler})
correct = 0
{opening}
    for x, y in loader:
        correct += (model(x) == y).sum().item()
{after}
"""


@pytest.mark.parametrize(
    "sampler, opening, after, expected",
    [
        # a script's own final evaluation, at module level, under no_grad
        ("DistributedSampler(ds)", "with torch.no_grad():", "print(correct / len(ds))", 1),
        ("DistributedSampler(ds)", "with torch.inference_mode():", "best = correct", 1),
        # combined after the loop, directly or through a helper named for it
        ("DistributedSampler(ds)", "with torch.no_grad():", "dist.all_reduce(correct)\nprint(correct)", 0),
        ("DistributedSampler(ds)", "with torch.no_grad():", "print(reduce_mean(correct))", 0),
        # nothing reported; the whole data set; no sign that it evaluates (module-level code)
        ("DistributedSampler(ds)", "with torch.no_grad():", "pass", 0),
        ("None", "with torch.no_grad():", "print(correct)", 0),
        ("DistributedSampler(ds)", "if True:", "print(correct)", 0),
    ],
)
def test_a_module_level_evaluation_of_a_script(sampler: str, opening: str, after: str, expected: int) -> None:
    source = SCRIPT_EVAL.format(sampler=sampler, opening=opening, after=after)
    assert len(evaluation.unreduced_evaluations(model_of(source))) == expected


@pytest.mark.parametrize(
    "caller, expected",
    [
        ("acc = check(m)\nprint(acc)", 1),
        ("acc = check(m)\nacc = reduce_mean(acc)", 0),  # the caller reduces the result
        ("print(reduce_mean(check(m)))", 0),
        ("acc = check(m)\nother = reduce_mean(loss)", 1),  # it reduces something else
    ],
)
def test_a_caller_that_reduces_the_result_counts(caller: str, expected: int) -> None:
    source = EVAL.format(sampler="DistributedSampler(ds)", after="    return total") + caller + "\n"
    assert len(evaluation.unreduced_evaluations(model_of(source))) == expected


def test_a_metric_method_of_another_module_that_all_reduces_counts(tmp_path: pathlib.Path) -> None:
    (tmp_path / "metrics.py").write_text(
        "import torch.distributed as dist\n"
        "class Meter:\n"
        "    def update(self, v):\n        dist.all_reduce(v)\n        self.v = v\n"
        "class Plain:\n"
        "    def update(self, v):\n        self.v = v\n",
        encoding="utf-8",
    )
    for klass, expected in (("Meter", 0), ("Plain", 1)):
        main = tmp_path / "main.py"
        source = EVAL.format(sampler="DistributedSampler(ds)", after="    return meter.v").replace(
            "        total +=", "        meter.update(model(x))\n        total +="
        )
        main.write_text(f"from metrics import {klass}\nmeter = {klass}()\n" + HEAD + source, encoding="utf-8")
        model = build_analysis(cst.parse_module(main.read_text()), str(main), project=ProjectSources([tmp_path]))
        assert len(evaluation.unreduced_evaluations(model)) == expected, klass


def test_a_sampler_factory_given_the_distributed_switch_is_a_split() -> None:
    assert unreduced(sampler="make_sampler(ds, False, args.distributed)") == 1
    assert unreduced(sampler="make_sampler(ds, False, args.shuffle)") == 0


def test_shard_local_score_follows_results_and_inline_sums() -> None:
    source = EVAL.format(sampler="DistributedSampler(ds)", after="    return total") + (
        "loss, acc = check(m), 1\nval = check(m)\nsched.step(val)\nsched.step(acc)\n"
    )
    model = model_of(source)
    steps = [c for c in model.calls if c.attr == "step"]
    found = [evaluation.shard_local_score(model, c.args[0].value, c.order, c.function) for c in steps]
    assert found[0] is not None and found[1] is None


# ------------------------------------------------------------------------------- rank arguments


def local_ranks(source: str) -> list[str]:
    model = model_of(source)
    return [
        model.code_of(a.rank) for a in rank_arguments.local_rank_arguments(model)
        if not rank_arguments.single_node_by_construction(model, a)
    ]


@pytest.mark.parametrize(
    "source, expected",
    [
        ('r = int(os.environ["LOCAL_RANK"])\ndist.init_process_group("nccl", rank=r, world_size=8)', ["r"]),
        ('r = int(os.environ["RANK"])\ndist.init_process_group("nccl", rank=r, world_size=8)', []),
        ("DistributedSampler(ds, rank=args.local_rank)", ["args.local_rank"]),
        ("DistributedSampler(ds, 8, args.local_rank)", ["args.local_rank"]),  # positional
        ("DistributedSampler(ds, rank=args.rank)", []),
        # single node by construction: this node's process count, or a loopback rendezvous
        ('r = int(os.environ["LOCAL_RANK"])\nDistributedSampler(ds, num_replicas=torch.cuda.device_count(), rank=r)', []),
        ('r = int(os.environ["LOCAL_RANK"])\nDistributedSampler(ds, num_replicas=int(os.environ["LOCAL_WORLD_SIZE"]), rank=r)', []),
        ('r = int(os.environ["LOCAL_RANK"])\nDistributedSampler(ds, num_replicas=int(os.environ["WORLD_SIZE"]), rank=r)', ["r"]),
        # built up in steps: the node's first rank plus the local index
        ('r = args.node_rank * 8\nr += int(os.environ["LOCAL_RANK"])\nDistributedSampler(ds, rank=r)', []),
    ],
)
def test_local_rank_arguments(source: str, expected: list[str]) -> None:
    assert local_ranks(source) == expected


def test_a_loopback_rendezvous_is_one_node() -> None:
    source = 'dist.init_process_group("nccl", init_method="tcp://127.0.0.1:1234", rank=args.local_rank, world_size=4)'
    model = build_analysis(cst.parse_module("import torch.distributed as dist\n" + source))
    found = rank_arguments.local_rank_arguments(model)
    assert len(found) == 1 and rank_arguments.single_node_by_construction(model, found[0])


SPAWN = """\
import torch.multiprocessing as mp
def worker(gpu, args):
    dist.init_process_group("nccl", rank=gpu, world_size=args.world_size)
{extra}
mp.spawn(worker, nprocs=4, args=(args,))
"""


def test_the_spawn_index_counts_only_where_the_script_reads_a_node_count() -> None:
    assert local_ranks(SPAWN.format(extra="")) == []
    assert local_ranks(SPAWN.format(extra="parser.add_argument('--nnodes', type=int)")) == ["gpu"]


# --------------------------------------------------------------------------------- shared writes


def written(body: str) -> list[str]:
    model = model_of("def go(out, root, model):\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\ngo(a, b, c)\n")
    return [w.what for w in shared_writes.every_rank_writes(model)]


@pytest.mark.parametrize(
    "body, expected",
    [
        ("model.save_pretrained(out)", ["save_pretrained"]),
        ("model.save_pretrained(out, is_main_process=dist.get_rank() == 0)", []),
        ("if dist.get_rank() == 0:\n    model.save_pretrained(out)", []),
        ("if dist.get_rank() != 0:\n    return\nmodel.save_pretrained(out)", []),
        ("model.save_pretrained(f'{out}/rank{dist.get_rank()}')", []),
        ("np.save(out + '/x.npy', 1)", ["np.save"]),
        ("open(out, 'w')", ["open(..., 'w')"]),
        ("open(out, 'a')", []),  # appending is not reported
        ("open(out)", []),
        ("open(os.path.join(tempfile.mkdtemp(), 'x'), 'w')", []),
        ("if not os.path.exists(out):\n    os.makedirs(out)", ["os.makedirs"]),
        ("if not os.path.exists(out):\n    os.makedirs(out, exist_ok=True)", []),
        ("os.makedirs(out)", []),  # no exists check: not the race this reports
        # pathlib spells the same race
        ("if not out.exists():\n    out.mkdir(parents=True)", ["Path.mkdir"]),
        ("if not out.is_dir():\n    out.mkdir()", ["Path.mkdir"]),
        ("if not out.exists():\n    out.mkdir(parents=True, exist_ok=True)", []),
        ("if not root.exists():\n    out.mkdir()", []),  # another path's check
        ("out.mkdir()", []),
        ("torchvision.datasets.MNIST(root, download=True)", ["torchvision.datasets.MNIST(download=True)"]),
        ("torchvision.datasets.MNIST(root, download=False)", []),
        ("torchvision.datasets.MNIST(f'{root}/{dist.get_rank()}', download=True)", []),
        ("if dist.get_rank() != 0:\n    dist.barrier()\ntorchvision.datasets.MNIST(root, download=True)", []),
        ("with accelerator.main_process_first():\n    np.save(out, 1)", []),
        ("if torch.cuda.device_count() == 1 or dist.get_rank() == 0:\n    np.save(out, 1)", []),
        ("if ok or flag:\n    np.save(out, 1)", ["np.save"]),
        # keywords name the path as positions do
        ("model.save_pretrained(save_directory=f'{out}/{dist.get_rank()}')", []),
        ("np.save(file=f'{out}/{dist.get_rank()}.npy', arr=1)", []),
        ("open(file=f'{out}/{dist.get_rank()}', mode='w')", []),
        ("open(out, mode='w')", ["open(..., 'w')"]),
        ("if not os.path.isdir(out):\n    os.mkdir(path=out)", ["os.mkdir"]),
        ("if not os.path.isdir(out):\n    os.mkdir(f'{out}{dist.get_rank()}')", []),
        ("if not os.path.exists(out):\n    os.makedirs(name=f'{out}{dist.get_rank()}')", []),
        ("if ok:\n    np.save(out, 1)", ["np.save"]),  # a condition that is no rank test
        ("if dist.get_rank() == 0 and ok:\n    np.save(out, 1)", []),
        ("with FileLock(root + '.lock'):\n    torchvision.datasets.MNIST(root, download=True)", []),
        ("with lock:\n    torchvision.datasets.MNIST(root, download=True)", []),
        ("with timer():\n    torchvision.datasets.MNIST(root, download=True)", ["torchvision.datasets.MNIST(download=True)"]),
    ],
)
def test_shared_writes(body: str, expected: list[str]) -> None:
    assert written(body) == expected


def test_the_parent_of_a_spawn_script_writes_once() -> None:
    source = (
        "import torch.multiprocessing as mp\n"
        "def worker(i):\n    np.save('x.npy', 1)\n"
        "def main():\n    np.save('y.npy', 1)\n    mp.spawn(worker, nprocs=2)\n"
        "main()\n"
    )
    model = model_of(source)
    assert [model.line_of(w.call.node) for w in shared_writes.every_rank_writes(model)] == [HEAD.count("\n") + 3]


@pytest.mark.parametrize(
    "start, expected",
    [
        # once per GPU, in a loop: the hand-written launcher of NVIDIA's multiproc.py / waveglow
        ("    for i in range(n):\n        subprocess.Popen([sys.executable, 'train.py', f'--rank={i}'])\n", []),
        ("    for i in range(n):\n        subprocess.Popen([str(sys.executable)] + argv)\n", []),
        ("    for i in range(n):\n        subprocess.Popen(['python', 'train.py'])\n", []),
        # one command, not a process per worker; a loop running another program
        ("    subprocess.Popen([sys.executable, 'eval.py'])\n", ["open(..., 'w')"]),
        ("    for i in range(n):\n        subprocess.Popen(['nvidia-smi'])\n", ["open(..., 'w')"]),
    ],
)
def test_a_function_starting_python_per_worker_is_the_parent(start: str, expected: list[str]) -> None:
    source = (
        "import subprocess\nimport sys\n"
        "def init_distributed(rank, n):\n    dist.init_process_group('nccl', world_size=n, rank=rank)\n"
        "def main(n, argv):\n    open('launch.log', 'w')\n" + start
        + "main(2, [])\n"
    )
    assert [w.what for w in shared_writes.every_rank_writes(model_of(source))] == expected


def test_a_horovod_spark_driver_writes_once_and_its_workers_on_every_rank() -> None:
    source = (
        "import horovod.spark\n"
        "def train_fn():\n    np.save('w.npy', 1)\n"
        "def main():\n    horovod.spark.run(train_fn, num_proc=2)\n    np.save('d.npy', 1)\n"
        "main()\n"
    )
    model = model_of(source)
    assert [model.line_of(w.call.node) for w in shared_writes.every_rank_writes(model)] == [HEAD.count("\n") + 3]


@pytest.mark.parametrize("reduces_inside, expected", [(True, 0), (False, 1)])
def test_a_meter_class_of_this_module_that_reduces_on_update(reduces_inside: bool, expected: int) -> None:
    body = "dist.all_reduce(v)\n        " if reduces_inside else ""
    source = (
        "class Meter:\n    def update(self, v):\n        " + body + "self.v = v\n"
        + EVAL.format(sampler="DistributedSampler(ds)", after="    return meter.v").replace(
            "        total +=", "        meter.update(model(x))\n        total +="
        ).replace("    total = 0.0\n", "    total = 0.0\n    meter = Meter()\n")
    )
    assert len(evaluation.unreduced_evaluations(model_of(source))) == expected


@pytest.mark.parametrize(
    "source, expected",
    [
        ('import os\nrank = int(os.environ["LOCAL_RANK"])\n', "it reads LOCAL_RANK"),
        ('import os\nworld = int(os.environ.get("WORLD_SIZE", 1))\n', "it reads WORLD_SIZE"),
        ('import os\nhome = os.environ["HOME"]\n', None),
        ('import torch.distributed as dist\ndist.init_process_group("nccl")\n', "init_process_group"),
    ],
)
def test_launched_as_ranks(source: str, expected: str | None) -> None:
    found = shared_writes.launched_as_ranks(build_analysis(cst.parse_module(source)))
    assert (found[1] if found is not None else None) == expected


@pytest.mark.parametrize(
    "tail, expected",
    [
        ("if __name__ == '__main__':\n    fire.Fire(train)\n", 1),  # handed to a command-line helper
        ("", 0),  # a library function nobody here runs
    ],
)
def test_a_script_entry_point_handed_on_runs_on_every_rank(tail: str, expected: int) -> None:
    source = "import fire\ndef train(out):\n    np.save(out, 1)\n" + tail
    assert len(shared_writes.every_rank_writes(model_of(source))) == expected


@pytest.mark.parametrize(("test", "expected"), [("val > best", 1), ("epoch > 30", 0)])
def test_a_hand_written_lr_change_under_a_shard_local_test(test: str, expected: int) -> None:
    source = EVAL.format(sampler="DistributedSampler(ds)", after="    return total") + (
        f"val = check(m)\nif {test}:\n    for g in opt.param_groups:\n        g['lr'] *= 0.5\n"
    )
    assert len(evaluation.metric_driven_lr_changes(model_of(source))) == expected
