"""Data split across ranks, asked directly: which functions and classes take one rank's share, which
values hold such a share, which loop items come from one, and which save paths are built from them."""

from __future__ import annotations

import pathlib
import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import ModuleModel, ProjectSources, build_analysis, sharding

DATA_LOADER = "torch.utils.data.DataLoader"


def model_of(source: str, path: str = "<string>", project: Optional[ProjectSources] = None) -> ModuleModel:
    return build_analysis(cst.parse_module(textwrap.dedent(source)), path, project=project)


def partitions(body: str) -> bool:
    """Whether `def take(rows, it, ds):` with this body takes one rank's share."""
    model = model_of(
        "import itertools\nimport os\nimport numpy as np\nimport torch.distributed as dist\n"
        "def take(rows, it, ds):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    )
    take = next(f for f in model.functions if f.name == "take")
    return sharding.partitions_by_rank(model, take)


@pytest.mark.parametrize(
    "body",
    [
        # contiguous slice, both bounds through variables
        "me, n = dist.get_rank(), dist.get_world_size()\nper = len(rows) // n\nreturn rows[me * per : (me + 1) * per]",
        # strided slice, the launcher's variables
        'return rows[int(os.environ["RANK"]) :: int(os.environ["WORLD_SIZE"])]',
        # the world size in the subscripted value, the rank in the index
        "return np.array_split(rows, dist.get_world_size())[dist.get_rank()]",
        # a permutation indexed through a conditional rank
        "rank = dist.get_rank() if dist.is_initialized() else 0\nk = len(rows) // dist.get_world_size()\n"
        "order = np.random.permutation(len(rows))\nreturn rows[order[rank * k : rank * k + k]]",
        "return [rows[i] for i in range(dist.get_rank(), len(rows), dist.get_world_size())]",
        "return itertools.islice(it, dist.get_rank(), None, dist.get_world_size())",
        "return ds.shard(num_shards=dist.get_world_size(), index=dist.get_rank())",
        "return [r for i, r in enumerate(rows) if i % dist.get_world_size() == dist.get_rank()]",
        "for i, r in enumerate(it):\n    if dist.get_rank() != i % world_size:\n        continue\n    yield r",
    ],
)
def test_each_way_of_taking_a_share(body: str) -> None:
    assert partitions(body)


@pytest.mark.parametrize(
    "body",
    [
        "return rows[dist.get_rank()]",  # indexed by the rank, no world size: a per-rank pick, no share
        "return rows[: dist.get_world_size()]",  # the world size alone
        "return rows[dist.get_rank() % len(rows)]",
        "return [r for i, r in enumerate(rows) if i % dist.get_world_size() == 0]",  # not the rank's items
        "return list(range(0, len(rows), dist.get_world_size()))",  # a stride from 0 on every rank
        "print(rows[0], dist.get_rank(), dist.get_world_size())",
        # the share is taken in a nested function that is never called
        "def later():\n    return rows[dist.get_rank() :: dist.get_world_size()]\nreturn rows",
    ],
)
def test_rank_and_world_size_uses_that_take_no_share(body: str) -> None:
    assert not partitions(body)


def test_a_class_takes_its_share_only_in_what_the_loader_calls() -> None:
    model = model_of(
        """
        import torch.distributed as dist

        def slice_for_me(rows):
            return rows[dist.get_rank() :: dist.get_world_size()]

        class Split:
            def __init__(self, rows):
                self.rows = self._mine(rows)
            def _mine(self, rows):
                return slice_for_me(rows)

        class Whole:
            def __init__(self, rows):
                self.rows = rows
            def preview(self):
                return slice_for_me(self.rows)
        """
    )
    assert sharding.class_partitions_by_rank(model, "Split")
    # The share is taken in a method the DataLoader never calls: the dataset itself is whole.
    assert not sharding.class_partitions_by_rank(model, "Whole")


def test_a_factory_a_star_re_export_and_a_generator_method(tmp_path: pathlib.Path) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "__init__.py").write_text(
        "from .streams import *\n\ndef pick(kind):\n    return Stream\n"
    )
    (tmp_path / "corpus" / "streams.py").write_text(
        textwrap.dedent(
            """
            from .cut import mine

            class Stream:
                def __init__(self, path):
                    self.path = path
                def load(self):
                    return mine(open(self.path).readlines())
                def epochs(self):
                    while True:
                        yield self.load()
                def everything(self):
                    while True:
                        yield open(self.path).readlines()
            """
        )
    )
    (tmp_path / "corpus" / "cut.py").write_text(
        "import torch.distributed as dist\n\ndef mine(rows):\n"
        "    n = len(rows) // dist.get_world_size()\n    return rows[dist.get_rank() * n : (dist.get_rank() + 1) * n]\n"
    )
    main = tmp_path / "train.py"
    source = textwrap.dedent(
        """
        from torch.utils.data import DataLoader
        from corpus import pick
        split = DataLoader(next(pick("x")("a.txt").epochs()), shuffle=True)
        whole = DataLoader(next(pick("x")("a.txt").everything()), shuffle=True)
        cls = pick("x")
        made = DataLoader(cls("a.txt").load(), shuffle=True)
        """
    )
    main.write_text(source)
    model = model_of(source, str(main), ProjectSources.for_paths([tmp_path]))
    loaders = model.calls_named(DATA_LOADER)
    assert [sharding.loader_split_across_ranks(model, loader) for loader in loaders] == [True, False, True]
    built = next(c for c in model.calls if c.dotted == "cls")
    assert [(owner.path.endswith("streams.py"), name) for owner, name in sharding.instantiated_classes(model, built)] == [
        (True, "Stream")
    ]
    # Without the project the class behind the factory cannot be read: nothing is claimed.
    alone = model_of(source, str(main))
    assert not any(sharding.loader_split_across_ranks(alone, loader) for loader in alone.calls_named(DATA_LOADER))


def test_samplers_and_words_that_split_a_loader() -> None:
    model = model_of(
        """
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler, Subset
        a = DataLoader(ds, sampler=DistributedSampler(ds))
        b = DataLoader(Subset(ds, range(dist.get_rank(), len(ds), dist.get_world_size())))
        c = DataLoader(ds.shard(8, 0))
        d = DataLoader(ds, sampler=RandomSampler(ds))
        e = DataLoader(ds)
        """
    )
    split = [sharding.loader_split_across_ranks(model, loader) for loader in model.calls_named(DATA_LOADER)]
    assert split == [True, True, True, False, False]


def test_loop_items_leave_out_counters() -> None:
    model = model_of(
        """
        for i, (x, y) in enumerate(loader):
            pass
        for a, b in zip(p, q):
            pass
        for batch in tqdm(loader, total=3):
            pass
        for pair in enumerate(loader):
            pass
        while True:
            pass
        """
    )
    items = [[(name, model.code_of(source)) for name, source in model.loop_items(loop)] for loop in sorted(model.loops, key=lambda l: l.order)]
    assert items == [[("x", "loader"), ("y", "loader")], [("a", "p"), ("b", "q")], [("batch", "loader")], [], []]


SAVES = """
import os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

class Mine:
    def __init__(self, rows):
        self.rows = rows[dist.get_rank() :: dist.get_world_size()]

split = DataLoader(Mine(rows), batch_size=4)
whole = DataLoader(rows, batch_size=4)
sampled = DataLoader(rows, sampler=DistributedSampler(rows))
for epoch in range(3):
    for step, batch in enumerate(split):
        for i in range(len(batch["name"])):
            torch.save(batch["x"][i], os.path.join("out", batch["name"][i] + ".pt"))
            torch.save(batch["x"][i], f"out/{i}.pt")
        for name in batch["name"]:
            torch.save(0, f"out/{name}.pt")
        names = batch["name"]
        torch.save(0, names[0])
        torch.save(0, f"step_{step}.pt")
        torch.save(0, f"epoch_{epoch}.pt")
    for batch in whole:
        torch.save(0, batch["name"][0])
    for x, names in sampled:
        torch.save(x, names[0])
    drawn = iter(split)
    item = next(drawn)
    torch.save(0, item["name"])
"""


def test_per_item_paths_are_built_from_items_of_split_data() -> None:
    model = model_of(SAVES)
    saves = model.calls_named("torch.save")
    found = {model.line_of(s.node): sharding.per_item_path(model, s.arg(1), s.order, s.function) for s in saves}
    assert found == {
        17: True,  # the item's own name
        18: False,  # the counter of a range over the batch: the same on every rank
        20: True,  # a name drawn from the batch's own list
        22: True,  # through a plain assignment
        23: False,  # the loop's step counter
        24: False,  # the epoch
        26: False,  # the loader is not split: every rank writes every file
        28: True,  # a DistributedSampler splits it
        31: True,  # drawn with next()
    }


def test_world_size_spellings() -> None:
    model = model_of(
        """
        import os
        import horovod.torch as hvd
        import torch.distributed as dist
        probe(dist.get_world_size(), hvd.size(), os.environ["WORLD_SIZE"], get_world_size(), args.world_size, self.num_replicas)
        probe(dist.get_rank(), torch.cuda.device_count(), args.size, world)
        """
    )
    first, second = (c for c in model.calls if c.dotted == "probe")
    assert [sharding.is_world_size(model, a.value, first.order, None) for a in first.args] == [True] * 6
    assert [sharding.is_world_size(model, a.value, second.order, None) for a in second.args] == [False] * 4


def test_loops_that_iterate_their_share_directly() -> None:
    model = model_of(
        """
        import torch
        import torch.distributed as dist
        rank, world_size = dist.get_rank(), dist.get_world_size()
        for index in range(rank, len(files), world_size):
            torch.save(0, f"out/{index}.pt")
        mine = files[rank::world_size]
        for name in mine:
            torch.save(0, name + ".pt")
        for other in range(world_size):
            torch.save(0, f"out/{other}.pt")
        for name in files:
            torch.save(0, name + ".pt")
        """
    )
    saves = model.calls_named("torch.save")
    # `range(world_size)` visits every rank's index on every rank: its name alone splits nothing.
    assert [sharding.per_item_path(model, s.arg(1), s.order, s.function) for s in saves] == [True, True, False, False]
