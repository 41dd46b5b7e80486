"""The devices layer's facts, asked directly: where a module relies on the current CUDA device
(issue 10: DDP011 fires only when something does)."""

from __future__ import annotations

import pathlib
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
        "torch.cuda.synchronize(device=local_rank)\n",
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


# ---- a machine with exactly one GPU (field evaluation 2026-11c: GPU 0 named where it is the only one)


def one_gpu_branch(test: str, in_else: bool = False) -> bool:
    """Whether `test` (its `else` side when `in_else`) holds only on a machine with one GPU, read
    at the `target()` call in that branch."""
    body = f"if {test}:\n    pass\nelse:\n    target()\n" if in_else else f"if {test}:\n    target()\n"
    model = build_analysis(cst.parse_module(PRELUDE + "n = torch.cuda.device_count()\nsingle = n == 1\n" + body))
    (guard,) = next(c for c in model.calls if c.dotted == "target").ctx.guards
    return devices.is_one_gpu_test(model, guard.test, guard.order, guard.function, guard.negated)


@pytest.mark.parametrize(
    ("test", "in_else"),
    [
        ("torch.cuda.device_count() == 1", False),
        ("1 == torch.cuda.device_count()", False),
        ("torch.cuda.device_count() < 2", False),
        ("torch.cuda.device_count() <= 1", False),
        ("not torch.cuda.device_count() > 1", False),
        ("torch.cuda.device_count() > 1", True),
        ("torch.cuda.device_count() >= 2", True),
        ("n == 1", False),  # the count held in a variable
        ("single", False),  # the comparison held in a variable
        ("not single", True),
        ("n == 1 and local_rank >= 0", False),
        ("n > 1 or local_rank < 0", True),
    ],
)
def test_one_gpu_conditions(test: str, in_else: bool) -> None:
    assert one_gpu_branch(test, in_else)


@pytest.mark.parametrize(
    ("test", "in_else"),
    [
        ("torch.cuda.device_count() > 1", False),
        ("torch.cuda.device_count() == 1", True),
        ("torch.cuda.device_count() == 2", False),
        ("n == 1 or local_rank < 0", False),  # either may hold: not only on one GPU
        ("args.n_gpu == 1", False),  # a count not read from torch (HF examples set it to 1 per process)
        ("torch.cuda.is_available()", False),
    ],
)
def test_not_one_gpu_conditions(test: str, in_else: bool) -> None:
    assert not one_gpu_branch(test, in_else)


def only_gpu(source: str) -> list[tuple[str, bool]]:
    """(the literal, whether it is the only GPU there) for each hard-coded index reaching set_device."""
    model = build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)))
    sink = model.calls_named("torch.cuda.set_device")[0]
    indices = devices.device_indices(model, sink.arg(0), sink.order, sink.function)
    return [(model.code_of(i.node), devices.names_the_only_gpu(model, i, sink)) for i in indices if i.kind == "literal"]


def test_gpu_zero_assigned_on_the_one_gpu_path_is_the_only_gpu() -> None:
    source = """
    if torch.cuda.device_count() == 1:
        gpu = 0
    else:
        gpu = 1
    torch.cuda.set_device(gpu)
    """
    # GPU 1 on the several-GPU path is hard-coded all the same.
    assert sorted(only_gpu(source)) == [("0", True), ("1", False)]


def test_gpu_zero_at_a_sink_under_the_one_gpu_test() -> None:
    assert only_gpu("if torch.cuda.device_count() < 2:\n    torch.cuda.set_device(0)\n") == [("0", True)]
    # GPU 1 does not exist on a one-GPU machine: no reason to excuse it here.
    assert only_gpu("if torch.cuda.device_count() < 2:\n    torch.cuda.set_device(1)\n") == [("1", False)]
    assert only_gpu("torch.cuda.set_device(0)\n") == [("0", False)]


def test_pins_run_by_importing_a_project_module(tmp_path: pathlib.Path) -> None:
    from ddpdoctor.lint.analysis import ProjectSources

    (tmp_path / "gpu.py").write_text("import torch\ntorch.cuda.set_device(0)\n")
    (tmp_path / "tool.py").write_text(
        "import torch\ndef pin():\n    torch.cuda.set_device(0)\nif __name__ == '__main__':\n    torch.cuda.set_device(0)\n"
    )
    project = ProjectSources.for_paths([tmp_path])

    def pins(source: str) -> list[str]:
        main = tmp_path / f"train_{len(list(tmp_path.iterdir()))}.py"  # a new file: the project caches parses
        main.write_text(source)
        model = build_analysis(cst.parse_module(source), str(main), project=project)
        return [pathlib.Path(other.path).name for other, _ in devices.pinned_on_import(model)]

    assert pins("import gpu\n") == ["gpu.py"]
    assert pins("def main():\n    from gpu import torch\n") == ["gpu.py"]  # the import runs when main() does
    # a helper's pin runs when called, and the __main__ block not at all: importing pins nothing
    assert pins("import tool\n") == []
    assert pins("import torch\n") == []
    # without a project (standard input, a snippet) nothing is followed
    assert devices.pinned_on_import(build_analysis(cst.parse_module("import gpu\n"))) == []


def test_visible_devices_set_by_a_called_project_helper(tmp_path: pathlib.Path) -> None:
    from ddpdoctor.lint.analysis import ProjectSources

    (tmp_path / "hardware.py").write_text(
        "import os\nimport torch\n"
        "def narrow(spec):\n    os.environ['CUDA_VISIBLE_DEVICES'] = spec\n"
        "def name(index):\n    return torch.cuda.get_device_name(index)\n"
    )
    project = ProjectSources.for_paths([tmp_path])

    def narrowed(source: str) -> bool:
        main = tmp_path / f"train_{len(list(tmp_path.iterdir()))}.py"  # a new file: the project caches parses
        main.write_text(source)
        model = build_analysis(cst.parse_module(source), str(main), project=project)
        return devices.visible_devices_set_by_project_helper(model)

    assert narrowed("from hardware import narrow\nnarrow(args.gpu)\n") is True
    # torch's own calls before it are passed over, not the end of the search
    assert narrowed("import torch\nfrom hardware import narrow\ntorch.manual_seed(0)\nnarrow(args.gpu)\n") is True
    assert narrowed("import hardware\ndef main():\n    hardware.narrow(args.gpu)\nmain()\n") is True
    # a helper that only reads the hardware, or one imported and never called, narrows nothing
    assert narrowed("from hardware import name\nname(0)\n") is False
    assert narrowed("from hardware import narrow\n") is False
    # a call in a script's helper that nothing runs
    assert narrowed("from hardware import narrow\ndef unused():\n    narrow('0')\nif __name__ == '__main__':\n    pass\n") is False
    # without a project nothing is followed
    assert devices.visible_devices_set_by_project_helper(build_analysis(cst.parse_module("from hardware import narrow\nnarrow('0')\n"))) is False


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)\n', True),
        # the rank's entry of a configured list, through a variable
        ('gpus = [4, 5]\ngpu = gpus[local_rank]\nos.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)\n', True),
        ('os.environ["CUDA_VISIBLE_DEVICES"] = f"{dist.get_rank() % 8}"\n', True),
        # the same list for every process: each still sees every GPU
        ('os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"\n', False),
        ('ids = ",".join(str(i) for i in range(4))\nos.environ["CUDA_VISIBLE_DEVICES"] = ids\n', False),
        ('os.environ["OMP_NUM_THREADS"] = str(local_rank)\n', False),
        ("torch.cuda.set_device(local_rank)\n", False),
        # inside a setup function, from a variable of that function
        ('def pin():\n    mine = int(os.environ["LOCAL_RANK"])\n    os.environ["CUDA_VISIBLE_DEVICES"] = str(mine)\n'
         "pin()\n", True),
    ],
)
def test_one_visible_gpu_per_process(source: str, expected: bool) -> None:
    model = build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)))
    assert devices.one_visible_gpu_per_process(model) is expected


@pytest.mark.parametrize(
    "mapping, expected",
    [
        # the values are where the tensors land; the keys, where they were saved
        ("{'cuda:%d' % 0: 'cuda:%d' % rank}", [("expr", "rank")]),
        ("{'cuda:0': f'cuda:{rank}', 'cuda:1': f'cuda:{rank}'}", [("expr", "rank"), ("expr", "rank")]),
        ("{'cuda:1': 'cuda:0'}", [("literal", "'cuda:0'")]),
        ("{'cuda:0': 'cpu'}", [("other", "'cpu'")]),
        ("{}", [("other", "{}")]),
        ("{**saved}", [("other", "{**saved}")]),
    ],
)
def test_map_location_dict_maps_onto_its_values(mapping: str, expected: list[tuple[str, str]]) -> None:
    source = PRELUDE + f"rank = dist.get_rank()\nsaved = {{}}\ntorch.load('w.pt', map_location={mapping})\n"
    model = build_analysis(cst.parse_module(source))
    load = next(c for c in model.calls if c.name == "torch.load")
    indices = devices.device_indices(model, load.arg(keyword="map_location"), load.order, load.function, ints=False)
    assert [(i.kind, model.code_of(i.node)) for i in indices] == expected
