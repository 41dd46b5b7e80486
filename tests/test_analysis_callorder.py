"""The call-order fact asked directly: how each function is entered, and whether one statement may
run before another across a class's methods and the module's helpers."""

from __future__ import annotations

import textwrap

import libcst as cst

from ddpdoctor.lint.analysis import Call, Function, ModuleModel, build_analysis, callorder


def model_of(source: str) -> ModuleModel:
    return build_analysis(cst.parse_module(textwrap.dedent(source)))


def call(model: ModuleModel, written: str) -> Call:
    """The one call whose source is `written` (as written, arguments included)."""
    found = [c for c in model.calls if model.code_of(c.node) == written]
    assert len(found) == 1, [model.code_of(c.node) for c in model.calls]
    return found[0]


def function(model: ModuleModel, qualname: str) -> Function:
    found = [f for f in model.functions if f.qualname == qualname]
    assert len(found) == 1
    return found[0]


def ways(model: ModuleModel, qualname: str) -> list[list[str]] | None:
    """`ways_in` spelled as the call sites' source, outermost first."""
    found = callorder.ways_in(model, function(model, qualname))
    return None if found is None else [[model.code_of(site.node) for site in way] for way in found]


HOLDER = """
    class Holder:
        def __init__(self, args):
            self.net = build()
            self.step = self.load_from_ckpt(args.path)
            if args.distributed:
                self.net = wrap(self.net)

        def load_model(self, path):
            self.net.load_state_dict(read(path))
            self.net = convert(self.net)

        def load_from_ckpt(self, path):
            if exists(path):
                self.load_model(path)
            return 0
    """


def test_the_constructor_and_the_methods_it_calls_are_placed_under_it() -> None:
    model = model_of(HOLDER)
    assert ways(model, "Holder.__init__") == [[]]
    assert ways(model, "Holder.load_from_ckpt") == [["self.load_from_ckpt(args.path)"]]
    assert ways(model, "Holder.load_model") == [["self.load_from_ckpt(args.path)", "self.load_model(path)"]]


def test_a_loading_method_the_constructor_calls_before_wrapping_runs_before_the_wrap() -> None:
    model = model_of(HOLDER)
    wrap, convert = call(model, "wrap(self.net)"), call(model, "convert(self.net)")
    assert not callorder.may_run_before(model, wrap, convert)
    assert callorder.may_run_before(model, convert, wrap)


def test_a_method_the_constructor_calls_after_wrapping_runs_after_the_wrap() -> None:
    model = model_of(
        """
        class Holder:
            def __init__(self):
                self.net = wrap(build())
                self.load()

            def load(self):
                self.net = convert(self.net)
        """
    )
    wrap, convert = call(model, "wrap(build())"), call(model, "convert(self.net)")
    assert callorder.may_run_before(model, wrap, convert)
    assert not callorder.may_run_before(model, convert, wrap)


def test_a_method_nothing_here_calls_runs_on_the_finished_object() -> None:
    # `resume` is an entry (another module or the user calls it), and only on a constructed object:
    # after everything the constructor did, and never before it.
    model = model_of(
        """
        class Trainer:
            def __init__(self):
                self.net = wrap(build())

            def load_weights(self):
                self.net = convert(self.net)

            def resume(self):
                self.load_weights()
        """
    )
    assert ways(model, "Trainer.resume") == [[]]
    wrap, convert = call(model, "wrap(build())"), call(model, "convert(self.net)")
    assert callorder.may_run_before(model, wrap, convert)
    assert not callorder.may_run_before(model, convert, wrap)


def test_a_method_called_from_the_constructor_and_from_resume_has_both_ways_in() -> None:
    model = model_of(
        """
        class Model:
            def __init__(self):
                self.restore()
                self.net = wrap(self.net)

            def restore(self):
                self.net = convert(self.net)

            def resume(self):
                self.restore()
        """
    )
    assert sorted(ways(model, "Model.restore") or []) == [["self.restore()"], ["self.restore()"]]
    wrap, convert = call(model, "wrap(self.net)"), call(model, "convert(self.net)")
    assert callorder.may_run_before(model, wrap, convert)  # on resume


def test_methods_called_on_an_instance_built_here_run_in_the_callers_order() -> None:
    model = model_of(
        """
        class Trainer:
            def distribute(self):
                self.net = wrap(self.net)

            def use_sync_bn(self):
                self.net = convert(self.net)

        def main():
            trainer = Trainer()
            trainer.use_sync_bn()
            trainer.distribute()

        main()
        """
    )
    assert ways(model, "Trainer.distribute") == [["main()", "trainer.distribute()"]]
    wrap, convert = call(model, "wrap(self.net)"), call(model, "convert(self.net)")
    assert not callorder.may_run_before(model, wrap, convert)
    assert callorder.may_run_before(model, convert, wrap)


def test_a_loop_around_both_call_sites_runs_either_first() -> None:
    model = model_of(
        """
        class Holder:
            def __init__(self, parts):
                for part in parts:
                    self.load()
                    self.net = wrap(self.net)

            def load(self):
                self.net = convert(self.net)
        """
    )
    wrap, convert = call(model, "wrap(self.net)"), call(model, "convert(self.net)")
    assert callorder.may_run_before(model, wrap, convert)


def test_a_shared_call_site_in_a_loop_repeats_what_it_calls() -> None:
    model = model_of(
        """
        class Holder:
            def __init__(self, parts):
                for part in parts:
                    self.step()

            def step(self):
                self.net = convert(self.net)
                self.net = wrap(self.net)
        """
    )
    wrap, convert = call(model, "wrap(self.net)"), call(model, "convert(self.net)")
    assert callorder.may_run_before(model, wrap, convert)
    # Without the loop, one call of `step` converts and then wraps.
    once = model_of(
        """
        class Holder:
            def __init__(self, parts):
                self.step()

            def step(self):
                self.net = convert(self.net)
                self.net = wrap(self.net)
        """
    )
    assert not callorder.may_run_before(once, call(once, "wrap(self.net)"), call(once, "convert(self.net)"))


def test_calls_in_one_statement_are_not_ordered_by_their_numbers() -> None:
    # `wrap(self.prepare())` runs `prepare` (and its conversion) before `wrap`, although the wrap
    # is numbered first: one statement is left unordered.
    model = model_of(
        """
        class Holder:
            def __init__(self):
                self.net = wrap(self.prepare())

            def prepare(self):
                self.net = convert(self.net)
                return self.net
        """
    )
    wrap, convert = call(model, "wrap(self.prepare())"), call(model, "convert(self.net)")
    assert callorder.may_run_before(model, wrap, convert)


def test_module_helpers_are_placed_under_their_callers() -> None:
    model = model_of(
        """
        def first():
            a()

        def second():
            b()

        def main():
            first()
            second()

        if __name__ == "__main__":
            main()
        """
    )
    assert ways(model, "second") == [["main()", "second()"]]
    assert not callorder.may_run_before(model, call(model, "b()"), call(model, "a()"))
    assert callorder.may_run_before(model, call(model, "a()"), call(model, "b()"))


def test_statements_of_different_entries_are_unordered() -> None:
    model = model_of(
        """
        def setup():
            a()

        def teardown():
            b()

        class Other:
            def __init__(self):
                c()

        class Holder:
            def run(self):
                d()
        """
    )
    a, b, c, d = (call(model, text) for text in ("a()", "b()", "c()", "d()"))
    assert callorder.may_run_before(model, b, a) and callorder.may_run_before(model, a, b)
    # Construction comes first only for the same class.
    assert callorder.may_run_before(model, d, c)


def test_unknown_ways_in_answer_may_run_before() -> None:
    handed_on = model_of(
        """
        class Holder:
            def __init__(self):
                self.hooks = [self.load]
                self.net = wrap(self.net)

            def load(self):
                self.net = convert(self.net)

            def later(self):
                self.load()
        """
    )
    assert ways(handed_on, "Holder.load") is None
    assert callorder.may_run_before(handed_on, call(handed_on, "wrap(self.net)"), call(handed_on, "convert(self.net)"))
    by_string = model_of(
        """
        class Holder:
            def __init__(self):
                getattr(self, "load")()

            def load(self):
                pass
        """
    )
    assert ways(by_string, "Holder.load") is None
    through_super = model_of(
        """
        class Holder(Base):
            def __init__(self):
                self.load()

            def load(self):
                super().load()
        """
    )
    assert ways(through_super, "Holder.load") is None


def test_a_comment_or_docstring_naming_the_method_does_not_make_it_unknown() -> None:
    model = model_of(
        '''
        class Holder:
            def __init__(self):
                # restore first, then wrap
                self.restore()

            def restore(self):
                """Calls restore on every part: a sentence, not a name."""
                pass
        '''
    )
    assert ways(model, "Holder.restore") == [["self.restore()"]]


def test_generators_coroutines_and_implicit_methods_have_unknown_ways_in() -> None:
    model = model_of(
        """
        class Holder:
            def __init__(self):
                self.batches()
                self.fetch()

            def batches(self):
                yield convert(self.net)

            async def fetch(self):
                pass

            def forward(self, x):
                return x

            def __call__(self, x):
                return x
        """
    )
    for name in ("batches", "fetch", "forward", "__call__"):
        assert ways(model, f"Holder.{name}") is None, name


def test_recursion_and_depth_are_bounded() -> None:
    recursive = model_of(
        """
        def walk(node):
            walk(node)

        walk(root)
        """
    )
    assert ways(recursive, "walk") is None
    chain = "\n".join(f"def f{i}():\n    f{i + 1}()\n" for i in range(8)) + "def f8():\n    pass\nf0()\n"
    deep = model_of(chain)
    assert ways(deep, "f4") == [["f0()", "f1()", "f2()", "f3()", "f4()"]]
    assert ways(deep, "f6") is None  # more than MAX_DEPTH calls down


def test_too_many_ways_in_are_unknown() -> None:
    sites = "\n".join("    helper()" for _ in range(callorder.MAX_ENTRIES + 1))
    model = model_of(f"def helper():\n    pass\n\ndef main():\n{sites}\n")
    assert ways(model, "helper") is None
    few = model_of("def helper():\n    pass\n\ndef main():\n" + "\n".join("    helper()" for _ in range(callorder.MAX_ENTRIES)) + "\n")
    assert ways(few, "helper") is not None


def test_static_and_class_methods_are_not_run_on_a_finished_object() -> None:
    model = model_of(
        """
        class Holder:
            def __init__(self):
                a()

            @staticmethod
            def build():
                b()
        """
    )
    # `build` needs no object: it may run before any construction.
    assert callorder.may_run_before(model, call(model, "b()"), call(model, "a()"))


def test_a_call_of_an_import_by_the_same_name_is_not_a_call_of_the_method() -> None:
    # The holder's `load` calls `torch.load`: that call cannot reach `Holder.load`.
    model = model_of(
        """
        import torch

        class Holder:
            def __init__(self, path):
                self.load(path)
                self.net = wrap(self.net)

            def load(self, path):
                self.net.load_state_dict(torch.load(path))
                self.net = convert(self.net)
        """
    )
    assert ways(model, "Holder.load") == [["self.load(path)"]]
    assert not callorder.may_run_before(model, call(model, "wrap(self.net)"), call(model, "convert(self.net)"))


def test_a_method_that_may_override_a_called_namesake_has_unknown_ways_in() -> None:
    # `Base.__init__` calls `self.setup()`: on a `Child` that runs `Child.setup`, during the
    # construction, although no call resolves to it.
    model = model_of(
        """
        class Base:
            def __init__(self):
                self.setup()

            def setup(self):
                pass

        class Child(Base):
            def __init__(self):
                super().__init__()
                self.net = convert(self.net)

            def setup(self):
                self.net = wrap(self.net)
        """
    )
    assert ways(model, "Base.setup") == [["self.setup()"]]
    assert ways(model, "Child.setup") is None
    assert callorder.may_run_before(model, call(model, "wrap(self.net)"), call(model, "convert(self.net)"))


def test_a_plain_function_is_not_reached_by_a_namesake_method_call() -> None:
    model = model_of(
        """
        def prepare():
            a()

        class Holder:
            def prepare(self):
                b()

            def run(self):
                self.prepare()

        def main():
            prepare()
        """
    )
    assert ways(model, "prepare") == [["prepare()"]]
    # The plain call `prepare()` reaches the module's function, never the method.
    assert ways(model, "Holder.prepare") == [["self.prepare()"]]


def test_a_call_site_that_reaches_two_methods_leaves_them_unordered() -> None:
    # `obj.load()` in a plain function may be either class's `load`: no common frame below it.
    model = model_of(
        """
        class First:
            def load(self):
                a()

        class Second:
            def load(self):
                b()

        def restore(self):
            self.load()
        """
    )
    assert ways(model, "First.load") == ways(model, "Second.load") == [["self.load()"]]
    a, b = call(model, "a()"), call(model, "b()")
    assert callorder.may_run_before(model, a, b) and callorder.may_run_before(model, b, a)


def test_only_a_loop_of_the_same_function_around_both_unorders_them() -> None:
    model = model_of(
        """
        class Holder:
            def __init__(self, parts):
                self.load()
                for part in parts:
                    wrap(part)

            def load(self):
                convert()

            def report(self, rows):
                for row in rows:
                    show(row)
        """
    )
    wrap, convert = call(model, "wrap(part)"), call(model, "convert()")
    assert not callorder.may_run_before(model, wrap, convert)
    # One statement is unordered with itself, in a loop or not.
    assert callorder.may_run_before(model, wrap, wrap) and callorder.may_run_before(model, convert, convert)
    # A call site starts before what it calls.
    assert callorder.may_run_before(model, call(model, "self.load()"), convert)


def test_construction_comes_first_for_a_method_called_through_the_module() -> None:
    # `distribute` is entered from `main`, through statements outside the class, on a built object.
    model = model_of(
        """
        class Trainer:
            def __init__(self):
                self.net = convert(self.net)

            def distribute(self):
                self.net = wrap(self.net)

        def main():
            trainer = Trainer()
            trainer.distribute()
        """
    )
    wrap, convert = call(model, "wrap(self.net)"), call(model, "convert(self.net)")
    assert not callorder.may_run_before(model, wrap, convert)
    assert callorder.may_run_before(model, convert, wrap)


def test_construction_orders_only_what_acts_on_the_same_class() -> None:
    # `Part.setup` runs inside `Owner`'s construction, but on a `Part`: not ordered by it.
    model = model_of(
        """
        class Owner:
            def __init__(self):
                self.part = Part()
                self.part.setup()

            def run(self):
                a()

        class Part:
            def setup(self):
                b()
        """
    )
    assert ways(model, "Part.setup") == [["self.part.setup()"]]
    assert callorder.may_run_before(model, call(model, "a()"), call(model, "b()"))


def test_static_and_class_methods_with_parameters_need_no_object() -> None:
    for decorator in ("staticmethod", "classmethod"):
        model = model_of(
            f"""
            class Holder:
                def __init__(self):
                    a()

                @{decorator}
                def build(path):
                    b()
            """
        )
        assert callorder.may_run_before(model, call(model, "b()"), call(model, "a()")), decorator
    plain = model_of(
        """
        class Holder:
            def __init__(self):
                a()

            def build(self, path):
                b()
        """
    )
    assert not callorder.may_run_before(plain, call(plain, "b()"), call(plain, "a()"))


def test_a_private_method_is_not_taken_for_a_dunder() -> None:
    model = model_of(
        """
        class Holder:
            def __init__(self):
                self.__load(b"weights")

            def __load(self, blob):
                convert()

            def private__(self):
                pass
        """
    )
    assert ways(model, "Holder.__load") == [['self.__load(b"weights")']]
    assert ways(model, "Holder.private__") == [[]]
