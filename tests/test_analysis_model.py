"""The model's newer answers asked directly: **kwargs read whole, star imports, tuple unpacking of
a call's return, constructor calls as call sites, and calls linked to another project module."""

from __future__ import annotations

import pathlib
import textwrap

import libcst as cst
import pytest

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


def test_origin_calls_through_an_unpacked_tuple_return() -> None:
    """`_, loader = build()`: the loader's origin is the call at its position in build's return
    tuple, on every branch; a return of another shape (a bare name, a tuple of another length, which
    would raise on unpacking) tells nothing."""
    model = model_of(
        """
        from torch.utils.data import DataLoader, DistributedSampler
        def build(ds, train):
            sampler = DistributedSampler(ds)
            if train:
                return ds, DataLoader(ds, sampler=sampler)
            if ds is None:
                return ds
            if ds == 0:
                return ds, DataLoader(ds, batch_size=2), sampler
            return ds, DataLoader(ds, batch_size=1)
        _, loader = build(None, True)
        picked = loader
        first, second = build(None, False)
        other = first
        """
    )
    picked, other = model.assignments_to("picked")[0], model.assignments_to("other")[0]
    origins = model.origin_calls(picked.value, picked.order, None)
    assert [c.name for c in origins] == ["torch.utils.data.DataLoader", "torch.utils.data.DataLoader"]
    # position 0 of both tuple returns is the parameter `ds`, bound to None here: no call
    assert model.origin_calls(other.value, other.order, None) == []


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


def test_clipping_summary() -> None:
    from ddpdoctor.lint.analysis import summaries

    model = model_of(
        """
        import torch
        from torch.nn.utils import clip_grad_value_
        def clip(model, max_norm):
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        def clip_params(params, encoder):
            clip_grad_value_(params, 0.5)
            torch.nn.utils.clip_grad_norm_(encoder.parameters(), 1.0)
        def unscale_then_clip(scaler, optimizer, model):
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        def clip_then_unscale(scaler, optimizer, model):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.unscale_(optimizer)
        def global_model():
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        def step(optimizer):
            optimizer.step()
        """
    )
    fn = {f.name: f for f in model.functions}
    found = summaries.clipping(model, fn["clip"])
    assert found is not None and found.params == {"model"} and not found.unscales_first
    assert model.line_of(found.clip.node) == 5
    found = summaries.clipping(model, fn["clip_params"])
    assert found is not None and found.params == {"params", "encoder"} and found.clip.name == "torch.nn.utils.clip_grad_value_"
    found = summaries.clipping(model, fn["unscale_then_clip"])
    assert found is not None and found.unscales_first
    found = summaries.clipping(model, fn["clip_then_unscale"])
    assert found is not None and not found.unscales_first  # the clip already saw scaled gradients
    found = summaries.clipping(model, fn["global_model"])
    assert found is not None and found.params == frozenset()  # `net` is no parameter
    assert summaries.clipping(model, fn["step"]) is None


def test_unscales_summary() -> None:
    from ddpdoctor.lint.analysis import summaries

    model = model_of(
        """
        def unscale(scaler, optimizer):
            scaler.unscale_(optimizer)
        def prepare(scaler, optimizer):
            unscale(scaler, optimizer)
        def step(scaler, optimizer):
            scaler.step(optimizer)
        """
    )
    fn = {f.name: f for f in model.functions}
    assert summaries.unscales(model, fn["unscale"])
    assert summaries.unscales(model, fn["prepare"])  # through its own helper
    assert not summaries.unscales(model, fn["step"])  # step unscales internally, but after any clip


def test_loader_samplers_direct_and_inside_a_batch_sampler() -> None:
    model = model_of(
        """
        from torch.utils.data import BatchSampler, DataLoader, DistributedSampler
        plain = DistributedSampler(a)
        DataLoader(a, sampler=plain)
        batched = DistributedSampler(b)
        DataLoader(b, batch_sampler=BatchSampler(batched, 8, False))
        DataLoader(c, batch_size=4)
        """
    )
    direct, inside, none = model.calls_named("torch.utils.data.DataLoader")
    plain, batched = model.calls_named("torch.utils.data.DistributedSampler")
    assert plain in model.loader_samplers(direct) and batched not in model.loader_samplers(direct)
    assert batched in model.loader_samplers(inside) and plain not in model.loader_samplers(inside)
    assert model.loader_samplers(none) == []
    assert (model.name_bound_to(plain), model.name_bound_to(direct)) == ("plain", None)


def test_call_sites_skip_a_def_rebound_before_the_call() -> None:
    """Two top-level `def step` in a row: a module-level call after both, and a call inside a
    function (which runs after the module body), reach only the second; a call between the two
    reaches the first; a rival `def` under an `if` may not run, so it shadows nothing."""
    model = model_of(
        """
        def step(): pass
        step()
        def step(): pass
        def run():
            step()
        step()
        def tick(): pass
        if flag:
            def tick(): pass
        tick()
        """
    )
    first, second = model.functions_named("step")
    early, in_run, late = [c for c in model.calls if c.node.func.value == "step"]  # type: ignore[attr-defined]
    assert model.call_sites(first) == [early]
    assert model.call_sites(second) == [in_run, late]
    plain, guarded = model.functions_named("tick")
    assert len(model.call_sites(plain)) == 1 and len(model.call_sites(guarded)) == 1


def test_parameter_default_of_an_uncalled_function_is_not_its_only_value() -> None:
    """`def fit(rank=0)` that nothing here calls: rank may be 0 or whatever another module passes;
    called here without the argument, it is the default only."""
    model = model_of(
        """
        def fit(rank=0):
            a = rank
        def step(rank=0):
            b = rank
        step()
        """
    )
    a, b = model.assignments_to("a")[0], model.assignments_to("b")[0]
    assert [model.code_of(v) for v, _, _ in model.leaf_values(a.value, a.order, a.function)] == ["0", "rank"]
    assert [model.code_of(v) for v, _, _ in model.leaf_values(b.value, b.order, b.function)] == ["0"]


def test_loops_that_run_at_most_once() -> None:
    model = model_of(
        """
        for epoch in range(1):
            pass
        for epoch in range(2, 3):
            pass
        for epoch in range(0):
            pass
        for epoch in range(3):
            pass
        for epoch in range(0, 4, 3):
            pass
        for epoch in range(epochs):
            pass
        for epoch in range(-1, 1):
            pass
        for epoch in [0]:
            pass
        while True:
            pass
        """
    )
    # Literal bounds only: `range(args.epochs)` with a default of 1 is set on the command line.
    assert [model.runs_at_most_once(loop) for loop in model.loops] == [
        True, True, True, False, False, False, False, False, False,
    ]


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


def test_unwrapped_at_construction() -> None:
    model = model_of(
        """
        from torch.nn.parallel import DistributedDataParallel as DDP
        a = DDP(net).module
        b = DDP(net)
        c = b.module
        d = other(net).module
        self.e = DDP(net, device_ids=[0]).module
        """
    )
    found = model.unwrapped_at_construction("torch.nn.parallel.DistributedDataParallel")
    assert [(assignment.target, wrap.name) for assignment, wrap in found] == [
        ("a", "torch.nn.parallel.DistributedDataParallel"),
        ("self.e", "torch.nn.parallel.DistributedDataParallel"),
    ]
def test_loader_samplers_given_by_position() -> None:
    # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)
    model = model_of(
        """
        from torch.utils.data import BatchSampler, DataLoader, DistributedSampler
        plain = DistributedSampler(a)
        DataLoader(a, 8, False, plain)
        batched = DistributedSampler(b)
        DataLoader(b, 1, False, None, BatchSampler(batched, 8, False))
        """
    )
    direct, inside = model.calls_named("torch.utils.data.DataLoader")
    plain, batched = model.calls_named("torch.utils.data.DistributedSampler")
    assert model.loader_samplers(direct) == [plain]
    assert model.loader_samplers(inside) == [batched]


def test_origin_calls_of_either_side_of_or_inside_a_function() -> None:
    model = model_of(
        """
        from torch.utils.data import DistributedSampler, RandomSampler
        def main(data):
            given = DistributedSampler(data)
            sampler = given or RandomSampler(data)
            target(sampler)
        main(d)
        """
    )
    (call,) = [c for c in model.calls if c.dotted == "target"]
    origins = model.origin_calls(call.arg(0), call.order, call.function)
    assert [c.name for c in origins] == [
        "torch.utils.data.DistributedSampler", "torch.utils.data.RandomSampler",
    ]


def test_argparse_defaults_including_argparse_own() -> None:
    model = model_of(
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--batch-size", type=int, default=64)
        parser.add_argument("--amp", action="store_true")
        parser.add_argument("--no-shuffle", dest="shuffle", action="store_false")
        parser.add_argument("--local_rank", type=int)
        parser.add_argument("epochs", type=int)
        args = parser.parse_args()
        """
    )
    defaults = {
        name: model.code_of(model.argparse_default(f"args.{name}"))
        for name in ("batch_size", "amp", "shuffle", "local_rank")
    }
    assert defaults == {"batch_size": "64", "amp": "False", "shuffle": "True", "local_rank": "None"}
    # a positional argument has argparse's own default too; a name nobody declared has none
    assert model.code_of(model.argparse_default("args.epochs")) == "None"
    assert model.argparse_default("args.lr") is None
    assert model.const_value(model.argparse_default("args.local_rank"), 0, None) is None


def test_a_method_call_on_another_object_is_no_call_site_of_a_module_function() -> None:
    model = model_of(
        """
        def step(state):
            return state
        class Loop:
            def step(self):
                return 1
            def run(self):
                self.step()
        optimizer.step()
        step(s)
        Loop.step(loop)
        """
    )
    helper = next(f for f in model.functions_named("step") if f.klass is None)
    method = next(f for f in model.functions_named("step") if f.klass is not None)
    assert [model.code_of(c.node) for c in model.call_sites(helper)] == ["step(s)"]
    assert sorted(model.code_of(c.node) for c in model.call_sites(method)) == ["Loop.step(loop)", "self.step()"]


def test_star_keywords_unknown_after_an_augmented_item_assignment() -> None:
    model = model_of(
        """
        from torch.utils.data import DataLoader
        kw = dict(batch_size=8)
        kw["batch_size"] *= 2
        DataLoader(ds, **kw)
        """
    )
    loader = model.calls_named("torch.utils.data.DataLoader")[0]
    assert loader.has_star_args() and loader.arg(keyword="batch_size") is None


def test_an_attribute_of_self_reaches_from_its_own_class_only() -> None:
    model = model_of(
        """
        class Student:
            def __init__(self):
                self.device = torch.device("cuda", local_rank)
            def run(self):
                target(self.device)
        class Teacher:
            def __init__(self):
                self.device = "cpu"
        """
    )
    (call,) = [c for c in model.calls if c.dotted == "target"]
    values = model.reaching_values(call.arg(0), call.order, call.function)
    assert [model.code_of(v) for v in values] == ['torch.device("cuda", local_rank)']


def test_calls_in_assignment_targets_and_in_the_else_of_a_try_are_seen() -> None:
    model = model_of(
        """
        registry().current, rest = pair
        try:
            import horovod.torch as hvd
        except ImportError:
            hvd = None
        else:
            hvd.init()
        """
    )
    assert [c.dotted for c in model.calls] == ["registry", "hvd.init"]


def test_routes_through_both_sides_of_a_conditional_inside_a_function() -> None:
    model = model_of(
        """
        import torch.distributed as dist
        def main(ok):
            r = dist.get_rank()
            target(r if ok else 0)
        main(True)
        """
    )
    (call,) = [c for c in model.calls if c.dotted == "target"]
    routes = model.routes(call.arg(0), call.order, call.function)
    assert [model.code_of(r.value) for r in routes] == ["dist.get_rank()", "0"]



def _device_ids_values(model, function_name: str) -> list[str]:  # type: ignore[no-untyped-def]
    """What `device_ids=[x]` of the DDP wrap inside `function_name` may finally be, as source text."""
    (wrap,) = [c for c in model.calls if c.dotted == "DDP" and c.function.name == function_name]
    element = wrap.arg(keyword="device_ids").elements[0].value
    return sorted(model.code_of(v) for v, _, _ in model.leaf_values(element, wrap.order, wrap.function))


# Each snippet defines `_gpu = 0` at the top and a `wrap(net)` reading it for `device_ids=[_gpu]`,
# after the function given here.
_WRAP = "def wrap(net):\n    return DDP(net, device_ids=[_gpu])\n"


@pytest.mark.parametrize(
    ("between", "expected"),
    [
        # A setter nobody here calls: its parameter is unknown, beside the module's default.
        ("def use_gpu(index):\n    global _gpu\n    _gpu = index\n", ["0", "index"]),
        # A setter called here brings the argument of its call site.
        ("def use_gpu(index):\n    global _gpu\n    _gpu = index\n"
         "use_gpu(int(os.environ['LOCAL_RANK']))\n", ["0", "int(os.environ['LOCAL_RANK'])"]),
        # Assigned in a function without `global`: a local of that function.
        ("def pick(index):\n    _gpu = index\n    return _gpu\n", ["0"]),
        # Declared `global` but only read: nothing rebinds it.
        ("def show():\n    global _gpu\n    print(_gpu)\n", ["0"]),
    ],
)
def test_a_global_read_in_a_function(between: str, expected: list[str]) -> None:
    model = model_of("import os\n_gpu = 0\n" + between + _WRAP)
    assert _device_ids_values(model, "wrap") == expected


def test_the_setter_reads_its_own_rebinding_first() -> None:
    model = model_of(
        """
        _gpu = 0
        def use_gpu(index):
            global _gpu
            _gpu = index
            return DDP(net, device_ids=[_gpu])
        def before_any_rebinding():
            global _gpu
            return DDP(net, device_ids=[_gpu])
        """
    )
    assert _device_ids_values(model, "use_gpu") == ["index"]
    assert _device_ids_values(model, "before_any_rebinding") == ["0", "index"]
