"""The model's newer answers asked directly: **kwargs read whole, star imports, tuple unpacking of
a call's return, constructor calls as call sites, and calls linked to another project module."""

from __future__ import annotations

import pathlib
import textwrap

import libcst as cst

from ddpdoctor.lint.analysis import ProjectSources, build_analysis, ranks


def model_of(source: str, path: str = "<string>", project: ProjectSources | None = None):  # type: ignore[no-untyped-def]
    return build_analysis(cst.parse_module(textwrap.dedent(source)), path, project=project)


def test_star_keywords_from_dict_update_and_item_assignment() -> None:
    model = model_of(
        """
        from torch.utils.data import DataLoader
        kw = dict(batch_size=8)
        kw.update(shuffle=True)
        kw["drop_last"] = True
        DataLoader(ds, **kw)
        """
    )
    loader = model.calls_named("torch.utils.data.DataLoader")[0]
    assert not loader.has_star_args()
    assert [model.code_of(loader.arg(keyword=k)) for k in ("batch_size", "shuffle", "drop_last")] == ["8", "True", "True"]
    assert loader.written_arg(keyword="shuffle") is None


def test_star_keywords_unknown_when_the_dict_is_changed_otherwise() -> None:
    model = model_of(
        """
        from torch.utils.data import DataLoader
        kw = dict(batch_size=8)
        kw.update(other)
        DataLoader(ds, **kw)
        """
    )
    loader = model.calls_named("torch.utils.data.DataLoader")[0]
    assert loader.has_star_args() and loader.arg(keyword="shuffle") is None


def test_names_from_a_torch_star_import_unless_bound_here() -> None:
    model = model_of(
        """
        from torch.distributed import *
        def barrier():
            pass
        init_process_group("nccl")
        barrier()
        """
    )
    assert [c.name for c in model.calls] == ["torch.distributed.init_process_group", None]


def test_constructor_call_is_a_call_site_of_init() -> None:
    model = model_of(
        """
        class Trainer:
            def __init__(self, rank):
                self.rank = rank
        Trainer(3)
        """
    )
    init = model.functions_named("__init__")[0]
    assert [model.code_of(v) for v in model.argument_values(init, "rank")] == ["3"]


def test_unpacked_rank_through_a_local_helper() -> None:
    model = model_of(
        """
        import os
        def setup():
            return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        rank, world = setup()
        x = rank
        y = world
        """
    )
    x, y = model.assignments_to("x")[0], model.assignments_to("y")[0]
    assert ranks.rank_source(model, x.value, x.order, None) == "global"
    assert ranks.rank_source(model, y.value, y.order, None) is None


def test_a_returned_local_is_read_inside_the_helper_that_returns_it() -> None:
    model = model_of(
        """
        import os
        def local_rank():
            value = int(os.environ["LOCAL_RANK"])
            return value
        gpu = local_rank()
        x = gpu
        value = 3
        y = local_rank()
        """
    )
    x, y = model.assignments_to("x")[0], model.assignments_to("y")[0]
    assert ranks.rank_source(model, x.value, x.order, None) == "local"
    assert ranks.rank_source(model, y.value, y.order, None) == "local"


def test_linked_function_in_another_project_module(tmp_path: pathlib.Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "ckpt.py").write_text("import torch\ndef save(m, p):\n    torch.save(m, p)\n")
    (tmp_path / "pkg" / "broken.py").write_text("def (:\n")
    main = tmp_path / "pkg" / "main.py"
    source = "from .ckpt import save\nfrom . import broken\nsave(model, 'x.pt')\nbroken.f()\nmissing()\n"
    main.write_text(source)
    project = ProjectSources.for_paths([tmp_path])
    model = model_of(source, str(main), project)
    linked = [model.linked_function(c) for c in model.calls]
    other, function = linked[0]  # type: ignore[misc]
    assert function.name == "save" and other.path.endswith("ckpt.py")
    assert linked[1:] == [None, None]  # an unparsable module and an unknown name break nothing
    assert model_of(source, str(main)).linked_function(model.calls[0]) is None  # no project: no link


def test_function_summaries() -> None:
    from ddpdoctor.lint.analysis import summaries

    model = model_of(
        """
        import io
        import torch
        from tqdm import tqdm
        def run_epoch(model, loader, sampler, epoch):
            sampler.set_epoch(epoch)
            for x in tqdm(loader):
                model(x).sum().backward()
        def evaluate(model, loader):
            for x in loader:
                model(x)
        def save(state, path):
            torch.save(state, path)
        def save_guarded(state, path):
            if torch.distributed.get_rank() == 0:
                torch.save(state, path)
        def serialise(state):
            torch.save(state, io.BytesIO())
        def shard(state, rank):
            torch.save(state, f"ckpt_{rank}.pt")
        """
    )
    fn = {f.name: f for f in model.functions}
    assert set(summaries.drawn_params(model, fn["run_epoch"])) == {"loader"}
    assert summaries.drawn_params(model, fn["evaluate"]) == {}  # no backward: not training
    assert summaries.epoch_set_params(model, fn["run_epoch"]) == {"sampler"}
    found = summaries.unguarded_save(model, fn["save"])
    assert found is not None and found[1] == "path"
    for name in ("save_guarded", "serialise", "shard", "evaluate"):
        assert summaries.unguarded_save(model, fn[name]) is None, name


def test_star_import_of_a_project_module_hands_on_only_its_public_imports(tmp_path: pathlib.Path) -> None:
    (tmp_path / "common.py").write_text("import torch.distributed as _dist\nfrom torch.cuda import set_device\n")
    main = tmp_path / "train.py"
    source = "from common import *\nset_device(0)\n_dist.barrier()\n"
    main.write_text(source)
    model = model_of(source, str(main), ProjectSources.for_paths([tmp_path]))
    assert [c.name for c in model.calls] == ["torch.cuda.set_device", None]


def test_linked_function_through_a_relatively_imported_submodule(tmp_path: pathlib.Path) -> None:
    (tmp_path / "pkg" / "utils").mkdir(parents=True)
    for init in ("pkg/__init__.py", "pkg/utils/__init__.py"):
        (tmp_path / init).write_text("")
    (tmp_path / "pkg" / "utils" / "ckpt.py").write_text("import torch\ndef save(m, p):\n    torch.save(m, p)\n")
    main = tmp_path / "pkg" / "main.py"
    source = "from .utils import ckpt\nckpt.save(model, 'x.pt')\n"
    main.write_text(source)
    model = model_of(source, str(main), ProjectSources.for_paths([tmp_path]))
    linked = model.linked_function(model.calls[0])
    assert linked is not None
    other, function = linked
    assert function.name == "save" and pathlib.Path(other.path) == tmp_path / "pkg" / "utils" / "ckpt.py"


def test_nested_functions_inside_methods_see_the_class() -> None:
    model = model_of(
        """
        import os
        class Trainer:
            def __init__(self):
                self.rank = int(os.environ["LOCAL_RANK"])
            def train(self, loader):
                def step(batch):
                    device = self.rank
                    log(batch)
                for batch in loader:
                    step(batch)
                    step(batch)
        """
    )
    step = model.functions_named("step")[0]
    assert step.qualname == "Trainer.train.<locals>.step"
    (device,) = model.assignments_to("device")
    (bound,) = model.reaching_assignments("self.rank", device.order, step)
    assert bound.function is not None and bound.function.name == "__init__"
    # both calls of the helper run its body: its call to log() is one call, listed once
    (loop,) = model.loops
    assert [c.dotted for c in model.calls_within(loop, depth=1)] == ["step", "step", "log"]


def test_assignment_kinds_and_statements() -> None:
    model = model_of(
        """
        def main(path, steps):
            with open(path) as handle:
                total = 0
            for step in range(steps):
                total += step
            first, *rest = steps
        """
    )
    found = [(a.target, a.kind, model.line_of(a.node)) for a in model.assignments]
    assert found == [
        ("path", "param", 2), ("steps", "param", 2), ("handle", "with", 3), ("total", "assign", 4),
        ("step", "for", 5), ("total", "augassign", 6), ("first", "unpack", 7), ("rest", "unpack", 7),
    ]


def test_the_else_guard_belongs_to_its_function() -> None:
    model = model_of(
        """
        import torch.distributed as dist
        def main():
            if dist.get_rank() != 0:
                pass
            else:
                target()
        """
    )
    answer = ranks.who_runs(model, model.calls[-1])
    assert answer.guard is not None and answer.guard.negated
    assert answer.guard.function is not None and answer.guard.function.name == "main"
