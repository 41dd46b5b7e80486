"""What a function does for its callers, asked directly: which parameter a training loop draws its
batches from, with the backward that makes it a training loop."""

from __future__ import annotations

import pathlib
import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import Function, ModuleModel, build_analysis, summaries


def test_drawn_params_name_each_parameter_with_its_loops_backward() -> None:
    model = build_analysis(
        cst.parse_module(
            textwrap.dedent(
                """
                def train(model, loader, extra):
                    for x in loader:
                        model(x).sum().backward()
                    for x, y in zip(loader, extra):
                        model(x, y).mean().backward()
                """
            )
        )
    )
    (train,) = model.functions
    drawn = summaries.drawn_params(model, train)
    assert {name: model.line_of(call.node) for name, call in drawn.items()} == {"loader": 4, "extra": 6}


def test_mentions_rank_anywhere_in_a_path_through_variables() -> None:
    model = build_analysis(
        cst.parse_module(
            textwrap.dedent(
                """\
                import torch.distributed as dist
                me = dist.get_rank()
                prefix = "out"
                target(f"ckpt_{me}_{prefix}.pt")
                target(f"{prefix}/ckpt_{me}.pt")
                target(f"{prefix}/ckpt.pt")
                """
            )
        )
    )
    calls = [c for c in model.calls if c.dotted == "target"]
    assert [summaries.mentions_rank(model, c.arg(0), c.order, c.function) for c in calls] == [True, True, False]


def test_mentions_reads_subscripts_and_takes_any_test() -> None:
    model = build_analysis(
        cst.parse_module(
            textwrap.dedent(
                """\
                import os
                folder = os.getcwd()
                target(f"{folder}/ckpt_{os.environ['RANK']}.pt")
                target(f"{folder}/ckpt_{os.environ['HOME']}.pt")
                """
            )
        )
    )
    first, second = (c for c in model.calls if c.dotted == "target")
    # The launcher's variable read by a subscript is a rank.
    assert summaries.mentions_rank(model, first.arg(0), first.order, first.function)
    assert not summaries.mentions_rank(model, second.arg(0), second.order, second.function)

    def is_cwd(model: ModuleModel, node: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
        return isinstance(node, cst.Call) and model.qualify(node.func) == "os.getcwd"

    # Any question of one node, asked through variables: the folder is the working directory.
    assert summaries.mentions(model, first.arg(0), first.order, first.function, is_cwd)
    assert not summaries.mentions(model, first.arg(0), first.order, first.function, lambda *_: False)


TRAINER_CLASS = textwrap.dedent(
    """
    import torch

    for warmup in range(3):
        pass

    class Trainer:
        def __init__(self, model, train_dl, valid_dl, epochs=3):
            self.model = model
            self.train_loader = train_dl
            self.valid_loader = valid_dl
            self.epochs = epochs
            self.scratch = train_dl

        def fit_epoch(self, epoch):
            for x, y in self.train_loader:
                self.model(x).sum().backward()
            self._extra()

        def _extra(self):
            for x, y in self.valid_loader:
                loss = self.model(x).sum()
                loss.backward()

        def evaluate(self):
            for x, y in self.valid_loader:
                self.model(x)

        def reset(self):
            self.scratch = None
    """
)


def trainer_model() -> ModuleModel:
    return build_analysis(cst.parse_module(TRAINER_CLASS))


def method(model: ModuleModel, name: str) -> Function:
    return next(f for f in model.functions if f.name == name)


def test_drawn_attributes_follow_the_method_and_the_methods_it_calls_on_self() -> None:
    model = trainer_model()
    assert summaries.drawn_attributes(model, method(model, "fit_epoch")) == {"self.train_loader", "self.valid_loader"}
    # iterated without a backward: an evaluation, not a training loop
    assert summaries.drawn_attributes(model, method(model, "evaluate")) == frozenset()


def test_constructor_stores_map_attributes_to_parameters_never_reassigned() -> None:
    stores = summaries.constructor_stores(trainer_model(), "Trainer")
    # `self.scratch` is reset in another method: it may not hold the argument when read
    assert stores == {"self.model": "model", "self.train_loader": "train_dl", "self.valid_loader": "valid_dl",
                      "self.epochs": "epochs"}
    assert summaries.constructor_stores(trainer_model(), "Missing") == {}


def test_class_sets_epoch_anywhere_in_its_methods() -> None:
    assert summaries.class_sets_epoch(trainer_model(), "Trainer") is False
    reseeding = TRAINER_CLASS.replace("self._extra()", "self.train_loader.sampler.set_epoch(epoch)")
    assert summaries.class_sets_epoch(build_analysis(cst.parse_module(reseeding)), "Trainer") is True


def model_in_project(tmp_path: pathlib.Path, helper: tuple[str, str], source: str) -> ModuleModel:
    """`train.py` holding `source`, in a project beside one helper module (name, text)."""
    from ddpdoctor.lint.analysis import ProjectSources

    (tmp_path / helper[0]).write_text(helper[1])
    main = tmp_path / "train.py"
    main.write_text(source)
    return build_analysis(cst.parse_module(source), str(main), project=ProjectSources.for_paths([tmp_path]))


def test_a_method_call_links_to_the_class_of_another_project_module(tmp_path: pathlib.Path) -> None:
    source = (
        "from engine import Trainer\n"
        "trainer = Trainer(net, loader, None)\n"
        "trainer.fit_epoch(0)\n"
        "trainer.missing(0)\n"
        "other = make()\n"
        "other.fit_epoch(0)\n"
    )
    model = model_in_project(tmp_path, ("engine.py", TRAINER_CLASS), source)
    calls = {model.code_of(c.node): c for c in model.calls}
    linked = summaries.linked_method(model, calls["trainer.fit_epoch(0)"])
    assert linked is not None
    other, found, constructor = linked
    assert pathlib.Path(other.path).name == "engine.py" and found.qualname == "Trainer.fit_epoch"
    assert model.code_of(constructor.node) == "Trainer(net, loader, None)"
    # a method the class does not define, and an object not built from a project class
    assert summaries.linked_method(model, calls["trainer.missing(0)"]) is None
    assert summaries.linked_method(model, calls["other.fit_epoch(0)"]) is None
    # without a project nothing is linked
    assert summaries.linked_method(build_analysis(cst.parse_module(source)), calls["trainer.fit_epoch(0)"]) is None


DATA_HELPERS = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    def loaders(cfg, data):
        sampler = DistributedSampler(data)
        train = DataLoader(data, batch_size=4, sampler=sampler)
        return train, sampler, DataLoader(data, batch_size=4)

    def one_loader(data):
        return DataLoader(data, sampler=DistributedSampler(data, shuffle=True))

    def ordered(data):
        return DataLoader(data, sampler=DistributedSampler(data, shuffle=False))

    def undecided(data, cfg):
        return DataLoader(data, sampler=DistributedSampler(data, shuffle=cfg.shuffle))
    """
)


def test_returned_shuffled_loaders_by_position() -> None:
    model = build_analysis(cst.parse_module(DATA_HELPERS))
    assert set(summaries.returned_shuffled_loaders(model, method(model, "loaders"))) == {0}
    assert set(summaries.returned_shuffled_loaders(model, method(model, "one_loader"))) == {None}
    assert summaries.returned_shuffled_loaders(model, method(model, "ordered")) == {}
    assert summaries.returned_shuffled_loaders(model, method(model, "undecided")) == {}


def test_a_name_bound_to_a_project_helpers_return(tmp_path: pathlib.Path) -> None:
    source = (
        "from data import loaders, one_loader\nfrom tqdm import tqdm\n"
        "a, s, v = loaders(cfg, ds)\n"
        "b = one_loader(ds)\n"
        "c = tqdm(b)\n"
        "d = local(ds)\n"
        "e = one_loader(ds)\nif cfg.other:\n    e = local(ds)\n"
        "use(a, b, c, d, e)\n"
    )
    model = model_in_project(tmp_path, ("data.py", DATA_HELPERS), source)
    use = next(c for c in model.calls if c.dotted == "use")

    def bound(name: str) -> Optional[tuple[str, Optional[int], str]]:
        expr = next(arg.value for arg in use.node.args if model.code_of(arg.value) == name)
        found = summaries.returned_by_project_helper(model, expr, use.order, use.function)
        return None if found is None else (found[1].name, found[2], found[3])

    assert bound("a") == ("loaders", 0, "a")
    assert bound("b") == ("one_loader", None, "b")
    assert bound("c") == ("one_loader", None, "b")  # through the progress bar, named as the loader
    assert bound("d") is None  # not a project helper
    assert bound("e") is None  # another assignment may reach the use


@pytest.mark.parametrize(
    ("body", "cleared"),
    [
        ("opt.zero_grad()\n    loss.backward()\n    if i % k == 0:\n        opt.step()", True),
        # cleared only with the step: what is in between accumulates
        ("loss.backward()\n    if i % k == 0:\n        opt.step()\n        opt.zero_grad()", False),
        # cleared after the backward, not before it
        ("loss.backward()\n    opt.zero_grad()", False),
        # cleared under a condition the backward does not share
        ("if i % k == 0:\n        opt.zero_grad()\n    loss.backward()", False),
        # a zero_grad before the loop clears nothing between iterations (but one inside still counts)
        ("loss.backward()\n    if i % k == 0:\n        opt.step()", False),
        # a shared condition is no obstacle
        ("if train:\n        opt.zero_grad()\n        loss.backward()", True),
    ],
)
def test_gradients_cleared_before_the_backward_in_each_iteration(body: str, cleared: bool) -> None:
    model = build_analysis(cst.parse_module(f"opt.zero_grad()\nfor i in range(10):\n    {body}\n"))
    backward = next(c for c in model.calls if c.attr == "backward")
    assert summaries.gradients_cleared_before(model, backward, model.loops[0]) is cleared


# ---- effects: what a call does for its caller, across modules


def _project(tmp_path: pathlib.Path, files: dict[str, str], main: str) -> ModuleModel:
    from ddpdoctor.lint.analysis import ProjectSources

    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    path = tmp_path / main
    return build_analysis(cst.parse_module(path.read_text()), str(path), project=ProjectSources.for_paths([tmp_path]))


def _call(model: ModuleModel, dotted: str) -> "summaries.Call":
    return next(c for c in model.calls if c.dotted == dotted)


def test_effects_follow_calls_through_other_modules(tmp_path: pathlib.Path) -> None:
    model = _project(
        tmp_path,
        {
            "loss.py": "def backprop(loss):\n    loss.backward()\n",
            "engine.py": "from loss import backprop\n\ndef step(model, batch):\n    backprop(model(batch).sum())\n\ndef evaluate(model, batch):\n    return model(batch)\n",
            "train.py": "from engine import step, evaluate\nstep(net, b)\nevaluate(net, b)\n",
        },
        "train.py",
    )
    assert summaries.runs_backward(model, _call(model, "step"))
    assert not summaries.runs_backward(model, _call(model, "evaluate"))
    assert summaries.BACKWARD in summaries.module_effects(model)


def test_effects_stop_at_the_depth_bound(tmp_path: pathlib.Path) -> None:
    chain = {f"m{i}.py": f"from m{i + 1} import f{i + 1}\n\ndef f{i}(x):\n    f{i + 1}(x)\n" for i in range(1, 8)}
    chain["m8.py"] = "def f8(x):\n    x.backward()\n"
    chain["train.py"] = "from m{n} import f{n}\nf{n}(loss)\n"
    near = _project(tmp_path, {**chain, "train.py": chain["train.py"].format(n=8 - summaries.EFFECT_DEPTH + 1)}, "train.py")
    assert summaries.runs_backward(near, next(iter(near.calls)))
    far = _project(tmp_path, {**chain, "train.py": chain["train.py"].format(n=8 - summaries.EFFECT_DEPTH)}, "train.py")
    assert not summaries.runs_backward(far, next(iter(far.calls)))


def test_an_inherited_method_is_found_through_the_bases_across_modules(tmp_path: pathlib.Path) -> None:
    model = _project(
        tmp_path,
        {
            "base.py": "import torch\n\nclass Root:\n    def prepare(self):\n        torch.cuda.set_device(0)\n\nclass Mixin:\n    def prepare(self):\n        pass\n",
            "mid.py": "from base import Root\n\nclass Middle(Root):\n    pass\n",
            "train.py": (
                "from mid import Middle\nfrom base import Mixin, Root\n\n"
                "class Trainer(Middle):\n    def run(self):\n        self.prepare()\n\n"
                "class Quiet(Mixin, Root):\n    def run(self):\n        self.prepare()\n\n"
                "Trainer().run()\n"
            ),
        },
        "train.py",
    )
    found = summaries.method_of(model, "Trainer", "prepare")
    assert found is not None and found[0].path.endswith("base.py") and found[1].klass == "Root"
    quiet = summaries.method_of(model, "Quiet", "prepare")
    assert quiet is not None and quiet[1].klass == "Mixin"  # the first base wins, as in Python
    trainer_run, quiet_run = (c for c in model.calls if c.dotted == "self.prepare")
    assert summaries.PINS_GPU in summaries.call_effects(model, trainer_run)
    assert summaries.PINS_GPU not in summaries.call_effects(model, quiet_run)


def test_horovod_effects_and_the_lr_writers(tmp_path: pathlib.Path) -> None:
    model = _project(
        tmp_path,
        {
            "dist.py": (
                "import horovod.torch as hvd\n\n"
                "def sync(model, opt):\n    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
                "    hvd.broadcast_optimizer_state(opt, root_rank=0)\n\n"
                "def warm(opt, base):\n    for g in opt.param_groups:\n        g['lr'] = base * hvd.size()\n\n"
                "def decay(opt):\n    for g in opt.param_groups:\n        g['lr'] = g['lr'] * 0.1\n"
            ),
            "train.py": "from dist import sync, warm, decay\nfrom vendor_sched import make\nsync(m, o)\nwarm(o, 0.1)\ndecay(o)\nprint(o)\nmake(o)\nlog(x)\n",
        },
        "train.py",
    )
    assert summaries.call_effects(model, _call(model, "sync")) >= {summaries.BROADCASTS_PARAMETERS, summaries.BROADCASTS_OPTIMIZER}
    assert summaries.call_effects(model, _call(model, "warm")) >= {summaries.SCALES_LR, summaries.WRITES_LR, summaries.READS_WORKER_COUNT}
    assert summaries.call_effects(model, _call(model, "decay")) == {summaries.WRITES_LR}
    unfollowed = summaries.handed_to_unfollowed(model, frozenset({"o"}))
    assert unfollowed is not None and unfollowed.dotted == "make"
    assert summaries.handed_to_unfollowed(model, frozenset({"x"})) is not None
    assert summaries.handed_to_unfollowed(model, frozenset({"m"})) is None  # only to sync, which is followed


def test_attribute_writes_follow_parameters_into_helpers_and_other_modules(tmp_path: pathlib.Path) -> None:
    model = _project(
        tmp_path,
        {
            "slots.py": (
                "def adopt(args):\n    args.gpu = 3\n\n"
                "def relay(opts):\n    adopt(opts)\n\n"
                "def raw(ns, key):\n    setattr(ns, key, 1)\n\n"
                "def bulk(ns):\n    vars(ns).update(gpu=1)\n\n"
                "def reads(args):\n    return args.gpu + 1\n"
            ),
            "train.py": "from slots import adopt, relay, raw, bulk, reads\n\ndef use(cfg):\n    cfg.device.index = 0\n",
        },
        "train.py",
    )
    other = model.project_model(tmp_path / "slots.py")
    assert other is not None
    by_name = {f.name: f for f in other.functions}
    assert summaries.attribute_writes(other, by_name["adopt"]) == {("args", "gpu")}
    assert summaries.attribute_writes(other, by_name["relay"]) == {("opts", "gpu")}  # through adopt(opts)
    assert summaries.attribute_writes(other, by_name["raw"]) == {("ns", summaries.ANY_ATTRIBUTE)}
    assert summaries.attribute_writes(other, by_name["bulk"]) == {("ns", summaries.ANY_ATTRIBUTE)}
    assert summaries.attribute_writes(other, by_name["reads"]) == frozenset()
    (use,) = model.functions
    assert summaries.attribute_writes(model, use) == {("cfg", "device")}


REWRITES = {
    "slots.py": "def adopt(args):\n    args.gpu = 3\n\ndef show(args):\n    print(args.gpu)\n",
    "base.py": (
        "class Job:\n    def claim(self):\n        self.local_rank = 5\n\n"
        "    def report(self):\n        print(self.local_rank)\n"
    ),
}


@pytest.mark.parametrize(
    ("body", "name", "writer"),
    [
        ("args.gpu = 1\nadopt(args)\nHERE", "args.gpu", "adopt"),  # a project helper writes it
        ("args.gpu = 1\nshow(args)\nHERE", "args.gpu", None),  # followed, only reads it
        ("args.gpu = 1\nprint(args)\nHERE", "args.gpu", None),  # a builtin
        ("args.gpu = 1\ntune(args)\nHERE", "args.gpu", "tune"),  # cannot be followed
        ("adopt(args)\nargs.gpu = 1\nHERE", "args.gpu", None),  # written before the binding
        ("args.gpu = 1\nadopt(other)\nHERE", "args.gpu", None),  # handed something else
        ("args.gpu = 1\nsetattr(args, k, 2)\nHERE", "args.gpu", "setattr"),
        ("args.gpu = 1\nHERE\nadopt(args)", "args.gpu", None),  # after the point asked about
        ("gpu = 1\nadopt(gpu)\nHERE", "gpu", None),  # a local: no call rebinds it
    ],
)
def test_rewritten_before_names_the_call_that_may_rebind_an_attribute(
    tmp_path: pathlib.Path, body: str, name: str, writer: Optional[str]
) -> None:
    lines = textwrap.indent(body.replace("HERE", "mark()"), "    ")
    text = "from slots import adopt, show\nfrom vendor import tune\n\ndef main(args, other, k):\n" + lines + "\n"
    model = _project(tmp_path, {**REWRITES, "train.py": text}, "train.py")
    here = _call(model, "mark")
    found = summaries.rewritten_before(model, name, here.order, here.function)
    assert (found.dotted if found is not None else None) == writer


def test_rewritten_before_follows_inherited_methods_across_modules(tmp_path: pathlib.Path) -> None:
    text = (
        "from base import Job\n\nclass Trainer(Job):\n"
        "    def __init__(self):\n        self.local_rank = 1\n        self.claim()\n        mark()\n\n"
        "class Evaluator(Job):\n"
        "    def __init__(self):\n        self.local_rank = 1\n        self.report()\n        mark()\n"
    )
    model = _project(tmp_path, {**REWRITES, "train.py": text}, "train.py")
    trainer, evaluator = (c for c in model.calls if c.dotted == "mark")
    found = summaries.rewritten_before(model, "self.local_rank", trainer.order, trainer.function)
    assert found is not None and found.dotted == "self.claim"
    assert summaries.rewritten_before(model, "self.local_rank", evaluator.order, evaluator.function) is None


HOLDER = (
    "import torch\n\nclass Objective:\n"
    "    def __init__(self, net, scale=1.0):\n        self.net = net\n        self.scale = scale\n\n"
    "    def loss(self, x):\n        return self._inner(x) * self.scale\n\n"
    "    def _inner(self, x):\n        return self.net(x).sum()\n\n"
    "    def describe(self):\n        return str(self.scale)\n\n"
    "    @torch.no_grad()\n    def sample(self, x):\n        return self.net(x)\n\n"
    "    def score(self, x):\n        with torch.inference_mode():\n            return self.net(x)\n\n"
    "class Module(Objective):\n    def forward(self, x):\n        return self.net.forward(x)\n"
)


def test_forwarded_attributes_follow_the_class_methods_and_call_means_forward(tmp_path: pathlib.Path) -> None:
    model = _project(tmp_path, {"objective.py": HOLDER, "train.py": "from objective import Objective\n"}, "train.py")
    other = model.project_model(tmp_path / "objective.py")
    assert other is not None
    assert "net" in summaries.forwarded_attributes(other, "Objective", "loss")  # through self._inner
    assert "net" not in summaries.forwarded_attributes(other, "Objective", "describe")
    assert summaries.forwarded_attributes(other, "Objective", "sample") == frozenset()  # records no gradient
    assert summaries.forwarded_attributes(other, "Objective", "score") == frozenset()
    assert summaries.forwarded_attributes(other, "Objective", "__call__") == frozenset()  # no forward, no __call__
    assert summaries.forwarded_attributes(other, "Module", "__call__") == {"net"}  # nn.Module: __call__ is forward
    assert "net" in summaries.forwarded_attributes(other, "Module", "loss")  # inherited


DDP_NAME = "torch.nn.parallel.DistributedDataParallel"


@pytest.mark.parametrize(
    ("body", "stale"),
    [
        ("net = net.cuda()\nobj = Objective(net)\nnet = DDP(net)\nobj.loss(x)", True),
        ("obj = Objective(net)\nnet = DDP(net.cuda())\nobj.loss(x)", True),  # .cuda() moves the same object
        ("obj = Objective(net=net)\nnet = DDP(net)\nobj.loss(x)", True),  # by keyword
        ("obj = Module(net)\nnet = DDP(net)\nobj(x)", True),  # the holder's own forward
        ("obj = Objective(net)\nnet = DDP(net)\nobj.describe()", False),  # runs no forward of it
        ("net = DDP(net)\nobj = Objective(net)\nobj.loss(x)", False),  # built after: holds the wrapper
        ("obj = Objective(net)\nnet = DDP(net)\nobj.net = net\nobj.loss(x)", False),  # refreshed
        ("obj = Objective(net)\nddp = DDP(net)\nobj.loss(x)", False),  # `net` is not rebound
        ("obj = Objective(net)\nobj.loss(x)\nnet = DDP(net)", False),  # used before the wrap
        ("obj = Objective(other)\nnet = DDP(net)\nobj.loss(x)", False),  # holds something else
    ],
)
def test_stale_holders_find_a_holder_built_before_the_name_was_rebound(
    tmp_path: pathlib.Path, body: str, stale: bool
) -> None:
    text = (
        "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom objective import Objective, Module\n\n"
        "def main(net, other, x):\n" + textwrap.indent(body, "    ") + "\n"
    )
    model = _project(tmp_path, {"objective.py": HOLDER, "train.py": text}, "train.py")
    found = summaries.stale_holders(model, (DDP_NAME,))
    assert [(s.holder, s.wrapped, s.attribute) for s in found] == ([("obj", "net", "net")] if stale else [])


def test_stale_holders_see_self_attributes_across_the_methods_of_the_class(tmp_path: pathlib.Path) -> None:
    text = (
        "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom objective import Objective\n\n"
        "class Trainer:\n"
        "    def __init__(self, net):\n        self.model = net\n        self.objective = Objective(self.model)\n"
        "        self.model = DDP(self.model)\n\n"
        "    def step(self, x):\n        return self.objective.loss(x)\n\n"
        "class Rebuilt(Trainer):\n"
        "    def __init__(self, net):\n        self.model = net\n        self.obj2 = Objective(self.model)\n"
        "        self.model = DDP(self.model)\n\n"
        "    def reset(self):\n        self.obj2 = Objective(self.model)\n\n"
        "    def step(self, x):\n        return self.obj2.loss(x)\n"
    )
    model = _project(tmp_path, {"objective.py": HOLDER, "train.py": text}, "train.py")
    found = summaries.stale_holders(model, (DDP_NAME,))
    assert [(s.holder, model.line_of(s.use.node)) for s in found] == [("self.objective", 11)]


def test_a_loader_a_project_helper_built_on_a_shuffling_sampler(tmp_path: pathlib.Path) -> None:
    source = (
        "from data import loaders, one_loader, ordered\n"
        "a, s, v = loaders(cfg, ds)\nb = ordered(ds)\nc = one_loader(ds)\nuse(a, s, v, b, c)\n"
    )
    model = model_in_project(tmp_path, ("data.py", DATA_HELPERS), source)
    use = _call(model, "use")
    found = {
        model.code_of(arg.value): summaries.helper_built_shuffled_loader(model, arg.value, use.order, use.function)
        for arg in use.args
    }
    a, c = found.pop("a"), found.pop("c")
    assert a is not None and (a[1].name, a[3], a[0].line_of(a[2].node)) == ("loaders", "a", 6)
    assert c is not None and (c[1].name, c[3]) == ("one_loader", "c")
    assert found == {"s": None, "v": None, "b": None}  # the sampler, an unsampled and an ordered loader


EPOCH_HELPERS = (
    "def start_epoch(loader, epoch):\n    loader.sampler.set_epoch(epoch)\n\n"
    "def run_epoch(model, loader, optimizer):\n    for x in loader:\n        model(x).sum().backward()\n\n"
    "def log(loader, epoch):\n    print(epoch)\n"
)


def test_calls_into_another_module_that_reseed_or_draw(tmp_path: pathlib.Path) -> None:
    source = (
        "from engine import start_epoch, run_epoch, log\n"
        "start_epoch(dl, 1)\nrun_epoch(net, dl, opt)\nrun_epoch(net, optimizer=opt, loader=other)\nlog(dl, 1)\nlocal(dl)\n"
    )
    model = model_in_project(tmp_path, ("engine.py", EPOCH_HELPERS), source)
    calls = {model.code_of(c.node): c for c in model.calls}
    setter = summaries.called_epoch_setter(model, calls["start_epoch(dl, 1)"])
    assert setter is not None and (setter[0].name, setter[1]) == ("start_epoch", {"loader"})
    assert summaries.called_epoch_setter(model, calls["log(dl, 1)"]) is None
    assert summaries.called_epoch_setter(model, calls["local(dl)"]) is None
    drawn = summaries.drawn_arguments(model, calls["run_epoch(net, dl, opt)"])
    assert [(f.name, model.code_of(a)) for f, a in drawn] == [("run_epoch", "dl")]
    by_keyword = summaries.drawn_arguments(model, calls["run_epoch(net, optimizer=opt, loader=other)"])
    assert [model.code_of(a) for _, a in by_keyword] == ["other"]
    assert summaries.drawn_arguments(model, calls["start_epoch(dl, 1)"]) == []


def test_a_trainer_of_another_module_that_reseeds_or_draws_what_it_was_given(tmp_path: pathlib.Path) -> None:
    reseeding = TRAINER_CLASS + "\n    def begin(self, epoch):\n        self.sampler.set_epoch(epoch)\n"
    source = "from engine import Trainer\ntrainer = Trainer(net, loader, None)\ntrainer.fit_epoch(0)\ntrainer.evaluate()\n"
    model = model_in_project(tmp_path, ("engine.py", TRAINER_CLASS), source)
    fit, evaluate = (c for c in model.calls if c.attr in ("fit_epoch", "evaluate"))
    found = summaries.trainer_drawn_params(model, fit)
    assert found is not None and model.code_of(found[0].node) == "Trainer(net, loader, None)"
    assert (found[1].qualname, sorted(found[2])) == ("Trainer.__init__", ["train_dl", "valid_dl"])
    assert summaries.trainer_drawn_params(model, evaluate) is None  # its loop trains nothing
    assert not summaries.trainer_sets_epoch(model, fit)
    model = model_in_project(tmp_path, ("engine.py", reseeding), source)
    fit = next(c for c in model.calls if c.attr == "fit_epoch")
    assert summaries.trainer_sets_epoch(model, fit)


CHECKPOINTS = (
    "import torch\nimport torch.distributed as dist\n\n"
    "def save_to(state, path):\n    torch.save(state, path)\n\n"
    "def save_last(state):\n    torch.save(state, 'last.pt')\n\n"
    "def save_main(state, path):\n    if dist.get_rank() == 0:\n        torch.save(state, path)\n"
)


def test_called_unguarded_save_names_the_helper_and_the_path_argument(tmp_path: pathlib.Path) -> None:
    source = "from ckpt import save_to, save_last, save_main\nsave_to(s, 'a.pt')\nsave_to(s)\nsave_last(s)\nsave_main(s, 'b.pt')\n"
    model = model_in_project(tmp_path, ("ckpt.py", CHECKPOINTS), source)
    calls = [c for c in model.calls if c.dotted is not None and c.dotted.startswith("save_")]
    found = [summaries.called_unguarded_save(model, c) for c in calls]
    shown = [None if f is None else (f[1].name, f[0].line_of(f[2].node), f[3] is not None and model.code_of(f[3])) for f in found]
    assert shown == [("save_to", 5, "'a.pt'"), None, ("save_last", 8, False), None]  # no path given; rank 0 only


GRADIENTS = (
    "import torch\n\n"
    "def clip(model):\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n\n"
    "def clip_unscaled(model, scaler, opt):\n    scaler.unscale_(opt)\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n\n"
    "def unscale(scaler, opt):\n    scaler.unscale_(opt)\n"
)


def test_clipping_callees_and_unscaling_calls_here_or_in_another_module(tmp_path: pathlib.Path) -> None:
    source = (
        "from grads import clip, clip_unscaled, unscale\n\n"
        "def local_clip(m):\n    clip(m)\n\n"
        "clip(net)\nclip_unscaled(net, sc, o)\nunscale(sc, o)\nlocal_clip(net)\nsc.unscale_(o)\nother(net)\n"
    )
    model = model_in_project(tmp_path, ("grads.py", GRADIENTS), source)
    top = [c for c in model.calls if c.function is None]
    assert [f.name for _, f in summaries.local_or_linked(model, top[0])] == ["clip"]
    assert [f.name for _, f in summaries.local_or_linked(model, top[3])] == ["local_clip"]  # this module's first
    assert summaries.local_or_linked(model, top[5]) == []
    clipping = [[(f.name, sorted(c.params)) for _, f, c in summaries.clipping_callees(model, call)] for call in top]
    assert clipping == [[("clip", ["model"])], [], [], [], [], []]  # clip_unscaled unscales first
    assert [summaries.call_unscales(model, call) for call in top] == [False, True, True, False, True, False]


def test_called_unpinned_group_and_called_collectives(tmp_path: pathlib.Path) -> None:
    helpers = (
        "import os\nimport torch\nimport torch.distributed as dist\n\n"
        "def setup():\n    dist.init_process_group('nccl')\n\n"
        "def setup_pinned():\n    dist.init_process_group('nccl')\n    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n\n"
        "def setup_gloo():\n    dist.init_process_group('gloo')\n\n"
        "def sync(t):\n    dist.barrier()\n    if dist.get_rank() == 0:\n        dist.broadcast(t, 0)\n    dist.all_reduce(t)\n"
    )
    source = "from dist_utils import setup, setup_pinned, setup_gloo, sync\nsetup()\nsetup_pinned()\nsetup_gloo()\nsync(x)\n"
    model = model_in_project(tmp_path, ("dist_utils.py", helpers), source)
    calls = [c for c in model.calls if c.function is None]
    groups = [summaries.called_unpinned_group(model, c) for c in calls]
    assert [None if g is None else g[0].line_of(g[1].node) for g in groups] == [6, None, None, None]
    reached = [[(name, other.line_of(inner.node)) for other, inner, name in summaries.called_collectives(model, c)] for c in calls]
    assert reached[3] == [("torch.distributed.barrier", 16), ("torch.distributed.all_reduce", 19)]  # not the rank-0 broadcast
    assert reached[:3] == [[], [], []]


ENGINE_LOOPS = (
    "import torch\nimport torch.distributed as dist\n\n"
    "def accumulate(model, loader, opt, accum_steps=4):\n"
    "    for i, x in enumerate(loader):\n        model(x).sum().backward()\n"
    "        if (i + 1) % accum_steps == 0:\n            opt.step()\n            opt.zero_grad()\n\n"
    "def single(model, loader, opt, accum_steps=1):\n"
    "    for i, x in enumerate(loader):\n        if accum_steps == 1:\n            model(x).sum().backward()\n"
    "            opt.step()\n            opt.zero_grad()\n\n"
    "def cleared(model, loader, opt, k):\n"
    "    for i, x in enumerate(loader):\n        opt.zero_grad()\n        model(x).sum().backward()\n"
    "        if i % k == 0:\n            opt.step()\n\n"
    "def nan_exit(model, loader):\n"
    "    for x in loader:\n        loss = model(x).sum()\n        if torch.isnan(loss):\n            break\n        loss.backward()\n\n"
    "def agreed_exit(model, loader):\n"
    "    for x in loader:\n        loss = model(x).sum()\n        flag = torch.isnan(loss).float()\n"
    "        dist.all_reduce(flag)\n        if flag.item() > 0:\n            break\n        loss.backward()\n"
)


def test_accumulation_summaries_here_and_through_a_call(tmp_path: pathlib.Path) -> None:
    source = (
        "from engine import accumulate, single, cleared\n"
        "accumulate(net, dl, opt)\nsingle(net, dl, opt)\ncleared(net, dl, opt, 4)\naccumulate(loader=dl, opt=opt, model=ddp)\n"
    )
    model = model_in_project(tmp_path, ("engine.py", ENGINE_LOOPS), source)
    other = model.project_model(tmp_path / "engine.py")
    assert other is not None
    found = summaries.accumulating_param(other, method(other, "accumulate"))
    assert found is not None and found[0] == "model" and other.line_of(found[1].test) == 7
    assert summaries.accumulating_param(other, method(other, "single")) is None  # runs only when accum_steps == 1
    assert summaries.accumulating_param(other, method(other, "cleared")) is None  # zero_grad before every backward
    calls = [c for c in model.calls if c.function is None]
    called = [summaries.called_accumulation(model, c) for c in calls]
    assert [None if c is None else (c[1], model.code_of(c[3])) for c in called] == [
        ("model", "net"), None, None, ("model", "ddp")
    ]


def test_called_divergent_exits_name_the_exit_and_the_collective_it_skips(tmp_path: pathlib.Path) -> None:
    source = "from engine import nan_exit, agreed_exit\nnan_exit(ddp, dl)\nagreed_exit(ddp, dl)\n"
    model = model_in_project(tmp_path, ("engine.py", ENGINE_LOOPS), source)
    nan, agreed = (c for c in model.calls if c.function is None)
    found = summaries.called_divergent_exits(model, nan)
    assert [(o.line_of(e.node), o.line_of(after.node)) for o, e, after, _ in found] == [(29, 30)]
    assert summaries.called_divergent_exits(model, agreed) == []  # every rank takes the same decision
