"""The model's lookups that keep a file's analysis linear in its size, asked directly: each answers
what a scan of the whole module answered (same items, same order), including the cases a careless
index gets wrong: nested functions, class bodies, a loop's `else:`, namesakes in other functions
and classes, `global`, and several names asked at once."""

from __future__ import annotations

import textwrap

import libcst as cst

from ddpdoctor.lint.analysis import build_analysis, ranks


def model_of(source: str):  # type: ignore[no-untyped-def]
    return build_analysis(cst.parse_module(textwrap.dedent(source)), "<string>")


def test_calls_named_and_method_calls_with_several_names_keep_source_order() -> None:
    model = model_of(
        """
        import torch
        import torch.distributed as dist
        dist.barrier()
        torch.save(a, "x")
        dist.barrier()
        opt.step()
        opt.zero_grad()
        opt.step()
        """
    )
    named = model.calls_named("torch.save", "torch.distributed.barrier")
    assert [c.dotted for c in named] == ["dist.barrier", "torch.save", "dist.barrier"]
    assert [c.dotted for c in model.method_calls("zero_grad", "step")] == ["opt.step", "opt.zero_grad", "opt.step"]
    assert [c.dotted for c in model.method_calls("step")] == ["opt.step", "opt.step"]
    assert model.calls_named("torch.load") == [] and model.method_calls("backward", "no_sync") == []


def test_scope_calls_are_a_body_own_calls() -> None:
    model = model_of(
        """
        setup()
        class Trainer:
            configure()
            def fit(self):
                step()
                def inner():
                    nested()
                after()
        teardown()
        """
    )
    fit = model.functions_named("fit")[0]
    inner = model.functions_named("inner")[0]
    assert [c.dotted for c in model.scope_calls(None)] == ["setup", "configure", "teardown"]
    assert [c.dotted for c in model.scope_calls(fit)] == ["step", "after"]
    assert [c.dotted for c in model.scope_calls(inner)] == ["nested"]


def test_calls_inside_a_loop_leave_out_its_else_nested_functions_and_what_follows() -> None:
    model = model_of(
        """
        def train(loader):
            before()
            for batch in loader:
                first()
                for part in batch:
                    deep()
                def helper():
                    hidden()
                last()
            else:
                finished()
            after()
        """
    )
    outer = next(loop for loop in model.loops if model.code_of(loop.iter) == "loader")
    assert [c.dotted for c in model.calls_inside(outer)] == ["first", "deep", "last"]
    deep = next(c for c in model.calls if c.dotted == "deep")
    assert [c.dotted for c in model.calls_inside(outer, until=deep.order)] == ["first"]
    assert [c.dotted for c in model.calls_inside(outer, until=deep.order + 1)] == ["first", "deep"]
    train = model.functions_named("train")[0]
    assert [c.dotted for c in model.calls_inside(train)] == ["before", "first", "deep", "last", "finished", "after"]


def test_calls_in_statement() -> None:
    model = model_of(
        """
        import torch
        torch.save(model.state_dict(), path(rank()))
        other()
        """
    )
    save = model.calls_named("torch.save")[0]
    assert [c.dotted for c in model.calls_in_statement(save.statement)] == ["torch.save", "model.state_dict", "path", "rank"]


def test_enclosing_loops_innermost_first_within_one_function() -> None:
    model = model_of(
        """
        for run in runs:
            def train():
                for epoch in range(3):
                    for phase in phases:
                        for batch in loader:
                            pass
                    for val in val_loader:
                        pass
                else:
                    for tail in tails:
                        pass
            for other in others:
                pass
        """
    )
    by_target = {loop.target_names[0]: loop for loop in model.loops}
    names = lambda loops: [loop.target_names[0] for loop in loops]  # noqa: E731
    assert names(model.enclosing_loops(by_target["batch"])) == ["phase", "epoch"]
    assert names(model.enclosing_loops(by_target["val"])) == ["epoch"]
    assert names(model.enclosing_loops(by_target["tail"])) == []  # the for-else runs after the loop
    assert names(model.enclosing_loops(by_target["epoch"])) == []  # `run` is the module's loop, not train's
    assert names(model.enclosing_loops(by_target["other"])) == ["run"]


def test_loops_drawing_a_loader_directly_through_iter_and_next() -> None:
    model = model_of(
        """
        from torch.utils.data import DataLoader
        train_loader = DataLoader(train_set)
        val_loader = DataLoader(val_set)
        for epoch in range(3):
            for x in train_loader:
                pass
            batches = iter(val_loader)
            while True:
                batch = next(batches)
        for i, y in enumerate(val_loader):
            pass
        """
    )
    train, val = model.calls_named("torch.utils.data.DataLoader")
    code = lambda loops: [model.code_of(loop.node)[:9] for loop in loops]  # noqa: E731
    assert code(model.loops_drawing(train)) == ["for x in "]
    assert code(model.loops_drawing(val)) == ["while Tru", "for i, y "]
    # Several loaders at once: each loop once, in the model's order of loops.
    assert model.loops_drawing(val, train) == [
        loop for loop in model.loops if loop in model.loops_drawing(train) + model.loops_drawing(val)
    ]


def test_reaching_assignments_per_scope_with_globals_and_namesakes() -> None:
    model = model_of(
        """
        x = 1
        def one():
            x = 2
            use_one(x)
            x = 3
        def two():
            use_two(x)
        def setter():
            global x
            x = 4
        def early():
            use_early(x)
            x = 5
        """
    )

    def reaching(name: str) -> list[str]:
        use = next(c for c in model.calls if c.dotted == name)
        found = model.reaching_assignments("x", use.order, use.function)
        return [model.code_of(a.value) for a in found]

    assert reaching("use_one") == ["2"]
    assert reaching("use_two") == ["1", "4"]  # the module's value, or the setter's
    assert reaching("use_early") == []  # a local read before it is assigned


def test_self_attributes_of_namesake_classes_stay_apart() -> None:
    model = model_of(
        """
        class A:
            def __init__(self):
                self.loader = make_a()
            def run(self):
                use_a(self.loader)
        class B:
            def __init__(self):
                self.loader = make_b()
            def run(self):
                use_b(self.loader)
        """
    )
    for user, maker in (("use_a", "make_a()"), ("use_b", "make_b()")):
        use = next(c for c in model.calls if c.dotted == user)
        found = model.reaching_assignments("self.loader", use.order, use.function)
        assert [model.code_of(a.value) for a in found] == [maker]


def test_callers_through_an_instance_only_for_the_class_it_holds() -> None:
    model = model_of(
        """
        class Trainer:
            def fit(self):
                pass
        class Tuner:
            def fit(self):
                pass
        def main():
            trainer = Trainer()
            tuner = Tuner()
            trainer.fit()
            tuner.fit()
            Trainer.fit(trainer)
        """
    )
    trainer_fit, tuner_fit = model.functions_named("fit")
    assert [model.code_of(c.node) for c in model.callers(trainer_fit)] == ["Trainer.fit(trainer)", "trainer.fit()"]
    assert [model.code_of(c.node) for c in model.callers(tuner_fit)] == ["tuner.fit()"]


def test_assignments_of_a_value_and_the_name_it_is_bound_to() -> None:
    model = model_of(
        """
        from torch.utils.data.distributed import DistributedSampler
        sampler = train_sampler = DistributedSampler(ds)
        loose = [DistributedSampler(ds)]
        """
    )
    bound, loose = model.calls_named("torch.utils.data.distributed.DistributedSampler")
    assert [a.target for a in model.assignments_of(bound.node)] == ["sampler", "train_sampler"]
    assert model.name_bound_to(bound) == "sampler"
    assert model.assignments_of(loose.node) == [] and model.name_bound_to(loose) is None


def test_main_process_test_prefers_the_branch_in_the_same_function() -> None:
    model = model_of(
        """
        import torch
        import torch.distributed as dist
        def log():
            if dist.get_rank() == 0:
                print("hello")
        def save(rank):
            if rank == 0:
                print("saving")
            torch.save(state, "ckpt.pt")
        def main():
            dist.init_process_group("nccl")
            save(dist.get_rank())
            torch.save(state, "other.pt")
        """
    )
    in_save, in_main = model.calls_named("torch.save")
    assert ranks.main_process_test(model, in_save) == "rank == 0"
    # `rank` means nothing in main: the other function's test is the one that reads the same there.
    assert ranks.main_process_test(model, in_main) == "dist.get_rank() == 0"
