"""Where the value a call builds is read (`reads.value_reads`) and which processes read it
(`ranks.who_reads`), asked directly on small snippets. The value asked about is the one
`DataLoader(...)` call of each snippet."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import Runs, build_analysis, ranks
from ddpdoctor.lint.analysis.reads import value_reads

PRELUDE = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
"""


def _model_and_loader(source: str):  # type: ignore[no-untyped-def]
    model = build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)))
    (loader,) = model.calls_named("torch.utils.data.DataLoader")
    return model, loader


def reader_lines(source: str) -> Optional[list[int]]:
    """The lines of the steps that read the loader (counted from the snippet's first line), or None."""
    model, loader = _model_and_loader(source)
    readers = value_reads(model, loader)
    if readers is None:
        return None
    offset = PRELUDE.count("\n")
    return [model.line_of(r.node) - offset - 1 for r in readers]


def read_by(source: str) -> Runs:
    model, loader = _model_and_loader(source)
    return ranks.who_reads(model, loader).runs


def test_reads_of_a_local_through_calls_and_a_for_loop() -> None:
    source = """\
        def main(ds):
            preview = DataLoader(ds, shuffle=True)
            batch = next(iter(preview))
            for x in preview:
                print(x, len(preview))
        """
    # `next(iter(preview))` is one read (the outer call); the `for` is owned by its target binding.
    assert reader_lines(source) == [2, 3, 4]


def test_reads_of_a_self_attribute_in_other_methods() -> None:
    source = """\
        class Runner:
            def __init__(self, ds):
                self.preview = DataLoader(ds, shuffle=True)
            def show(self):
                return self.draw(next(iter(self.preview)))
        """
    assert reader_lines(source) == [4]


def test_an_alias_is_read_where_it_is_made() -> None:
    # Whoever later draws from `loaders["train"]` is a process that ran this assignment: the
    # processes that can touch the loader are bounded by those that run the statements naming it.
    source = """\
        def main(ds):
            loader = DataLoader(ds, shuffle=True)
            loaders = {"train": loader}
            run(loaders)
        """
    assert reader_lines(source) == [2]


def test_nothing_reads_it() -> None:
    assert reader_lines("def main(ds):\n    preview = DataLoader(ds, shuffle=True)\n") == []


@pytest.mark.parametrize(
    "source",
    [
        # returned: the callers read it
        "def build(ds):\n    loader = DataLoader(ds, shuffle=True)\n    return loader\n",
        # tested in a condition, which is no recorded step
        "def main(ds):\n    loader = DataLoader(ds, shuffle=True)\n    if loader:\n        pass\n",
        # read on another object than self
        "class R:\n    def __init__(self, ds):\n        self.loader = DataLoader(ds)\n"
        "def go(r):\n    return list(r.loader)\n",
        # not bound to a name at all
        "def main(ds):\n    run(DataLoader(ds, shuffle=True))\n",
        # bound to an attribute of something else
        "def main(ds, holder):\n    holder.loader = DataLoader(ds, shuffle=True)\n    run(holder.loader)\n",
    ],
)
def test_unknown_when_the_value_escapes(source: str) -> None:
    assert reader_lines(source) is None


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # drawn from on rank 0 only
        ("def main(ds):\n    v = DataLoader(ds, shuffle=True)\n    if dist.get_rank() == 0:\n"
         "        print(next(iter(v)))\n", Runs.RANK0),
        # rank 0, and the single-process path: still the main process only
        ("def main(ds, distributed):\n    v = DataLoader(ds, shuffle=True)\n    if not distributed:\n"
         "        print(next(iter(v)))\n    elif dist.get_rank() == 0:\n        print(len(v))\n", Runs.RANK0),
        # read on every rank (main() is called at the top level, so every process runs it)
        ("def main(ds):\n    v = DataLoader(ds, shuffle=True)\n    for x in v:\n        print(x)\n"
         "main(None)\n", Runs.ALL),
        # rank 0 in one place, every rank in another
        ("def main(ds):\n    v = DataLoader(ds, shuffle=True)\n    if dist.get_rank() == 0:\n"
         "        print(len(v))\n    for x in v:\n        print(x)\nmain(None)\n", Runs.ALL),
        # a helper nobody here calls: who runs its reads is unknown
        ("def main(ds):\n    v = DataLoader(ds, shuffle=True)\n    for x in v:\n        print(x)\n", Runs.UNKNOWN),
        # never read, or read where it cannot be followed: unknown
        ("def main(ds):\n    v = DataLoader(ds, shuffle=True)\n", Runs.UNKNOWN),
        ("def main(ds):\n    v = DataLoader(ds, shuffle=True)\n    return v\n", Runs.UNKNOWN),
    ],
)
def test_who_reads(source: str, expected: Runs) -> None:
    assert read_by(source) is expected


def test_a_gpu_index_the_class_hands_ddp_as_its_device_is_a_rank_in_tests() -> None:
    # The index comes from another module through the constructor; handing it to DDP as the one
    # device says it is this process's own GPU, so `== 0` is the first process.
    source = """\
        class Trainer:
            def __init__(self, ds, net, **kwargs):
                self.gpu_index = kwargs["gpu_index"]
                self.net = torch.nn.parallel.DistributedDataParallel(net, device_ids=[self.gpu_index])
                self.preview = DataLoader(ds, shuffle=True)
            def run(self, epoch):
                if self.gpu_index == 0 and epoch % 10 == 0:
                    print(next(iter(self.preview)))
        """
    assert read_by(source) is Runs.RANK0


@pytest.mark.parametrize(
    "wrap",
    [
        # the index only moves a tensor: no evidence it is the process's own GPU
        "self.net = net.cuda(self.gpu_index)",
        # DDP is given a device list, not one device
        "self.net = torch.nn.parallel.DistributedDataParallel(net, device_ids=[self.gpu_index, 1])",
    ],
)
def test_an_index_not_handed_over_as_the_own_device_stays_undecided(wrap: str) -> None:
    source = f"""\
        class Trainer:
            def __init__(self, ds, net, **kwargs):
                self.gpu_index = kwargs["gpu_index"]
                {wrap}
                self.preview = DataLoader(ds, shuffle=True)
            def run(self, epoch):
                if self.gpu_index == 0 and epoch % 10 == 0:
                    print(next(iter(self.preview)))
        """
    assert read_by(source) is Runs.UNKNOWN


def test_a_variable_pinned_with_set_device_is_a_rank_in_the_same_function_only() -> None:
    source = """\
        def worker(gpu, ds):
            torch.cuda.set_device(gpu)
            v = DataLoader(ds, shuffle=True)
            if gpu == 0:
                print(next(iter(v)))
        """
    assert read_by(source) is Runs.RANK0
    other = """\
        def pin(gpu):
            torch.cuda.set_device(gpu)
        def worker(gpu, ds):
            v = DataLoader(ds, shuffle=True)
            if gpu == 0:
                print(next(iter(v)))
        """
    assert read_by(other) is Runs.UNKNOWN
