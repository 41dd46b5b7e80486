"""DDP001 missing-set-epoch: a shuffling DistributedSampler iterated epoch after epoch without `set_epoch`."""

from __future__ import annotations

import functools
from typing import Optional

import libcst as cst

from ddpdoctor.findings import Edit, Fix
from ddpdoctor.lint.analysis import Call, Function, Loop, contains, dotted_name, names_in, summaries
from ddpdoctor.lint.rules.base import Rule

SAMPLER = summaries.DISTRIBUTED_SAMPLER
DATA_LOADER = summaries.DATA_LOADER
MAX_CALLERS = 3


class MissingSetEpoch(Rule):
    """
    Valid:
        sampler = DistributedSampler(train_set)
        loader = DataLoader(train_set, batch_size=32, sampler=sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for images, target in loader:
                loss = criterion(model(images), target)
                loss.backward()
    Invalid:
        sampler = DistributedSampler(train_set)
        loader = DataLoader(train_set, batch_size=32, sampler=sampler)
        for epoch in range(epochs):
            for images, target in loader:
                loss = criterion(model(images), target)
                loss.backward()
    """

    code = "DDP001"
    # A script whose loader and sampler a project helper builds may never name the class, but binds
    # the sampler it is handed (`train_loader, train_sampler, val_loader = get_loaders(opt)`) or
    # reseeds it. Not a bare "sampler" or "loader": nearly every data file says those (torch's own
    # `grid_sampler`), and each file they let through is parsed.
    trigger_words = ("DistributedSampler", "sampler,", "sampler =", "sampler.set_epoch")

    def check(self) -> None:
        self.check_helper_built_loaders()
        samplers = [s for s in self.model.calls_named(SAMPLER) if summaries.shuffles(self.model, s)]
        if not samplers:
            return
        # Which loaders each sampler feeds, from one pass over the loaders.
        feeds: dict[int, list[Call]] = {}
        for loader in self.model.calls_named(DATA_LOADER):
            for fed_by in {id(s) for s in self.model.loader_samplers(loader)}:
                feeds.setdefault(fed_by, []).append(loader)
        set_epochs = self.model.method_calls("set_epoch")
        reported: set[tuple[int, int]] = set()
        for sampler in samplers:
            fed = feeds.get(id(sampler), [])
            if not fed:
                continue
            for draw, epoch_loops in self._draws(fed):
                for epoch_loop in epoch_loops:
                    key = (id(sampler), id(epoch_loop))
                    # One pass (`for epoch in range(1):`): no second epoch can repeat the order.
                    if key in reported or self.model.runs_at_most_once(epoch_loop):
                        continue
                    if self._reseeded_each_epoch(sampler, epoch_loop):
                        continue
                    within = self.model.calls_within(epoch_loop, depth=MAX_CALLERS)
                    setters = [c for c in within if c.attr == "set_epoch" and self._sets_epoch(c, sampler, fed)]
                    if setters:
                        fixed = [c for c in setters if self._fixed_per_epoch(c, epoch_loop, within)]
                        others = [c for c in set_epochs if c in within and c not in setters]
                        if len(fixed) == len(setters) and not any(self._unresolved(c) for c in others):
                            reported.add(key)
                            for call in fixed:
                                self._report_fixed(call, epoch_loop)
                        continue
                    if any(self._unresolved(c) for c in set_epochs if c in within):
                        continue
                    if any(self._helper_sets_epoch(c, sampler, fed) for c in within):
                        continue
                    reported.add(key)
                    name = self._name_of(sampler)
                    self.report(
                        draw,
                        f"This training loader draws from the shuffling DistributedSampler `{name}` (line "
                        f"{self.line(sampler.node)}), but set_epoch is never called in the epoch loop (line "
                        f"{self.line(epoch_loop.node)}), so every epoch repeats the same order on every rank. "
                        f"Call `{name}.set_epoch(epoch)` at the start of each epoch.",
                        fix=self._fix(sampler, epoch_loop),
                    )

    def check_helper_built_loaders(self) -> None:
        """A training loop over a loader that another project module's helper built on a shuffling
        DistributedSampler and handed back (`train_loader, train_sampler, val_loader =
        get_loaders(opt)`): a loop here, or a project function called in the epoch loop with that
        loader (`train(epoch, train_loader, ...)` whose loop draws from it). Reported when the epoch
        loop calls no `set_epoch` at all (on anything) and no project helper or trainer class that does."""
        model = self.model
        for draw, loaded, order, function, epoch_loop in self._helper_loader_draws():
            if model.runs_at_most_once(epoch_loop):
                continue
            built = summaries.helper_built_shuffled_loader(model, loaded, order, function)
            if built is None or self._epoch_loop_reseeds_something(epoch_loop):
                continue
            other, helper, sampler, loader = built
            self.report(
                draw,
                f"This training loader comes from {helper.name}() ({other.shown_path} line "
                f"{other.line_of(sampler.node)} builds it on a shuffling DistributedSampler), but set_epoch "
                f"is never called in the epoch loop (line {self.line(epoch_loop.node)}), so every epoch "
                f"repeats the same order on every rank. Call `{loader}.sampler.set_epoch(epoch)` (or "
                f"set_epoch on the sampler the helper returns) at the start of each epoch.",
            )

    def _helper_loader_draws(self) -> list[tuple[cst.CSTNode, cst.BaseExpression, int, Optional[Function], Loop]]:
        """Where a training loop draws from a loader, with the loader expression to trace back (and
        where it is evaluated) and the epoch loop around: the training loops of this module inside an
        epoch loop of their function, and calls in a loop of another project module's function that
        trains on the loader passed to it (reported at the call)."""
        model = self.model
        out: list[tuple[cst.CSTNode, cst.BaseExpression, int, Optional[Function], Loop]] = []
        for inner in model.loops:
            if inner.iter is None:
                continue
            around = model.enclosing_loops(inner)
            if not around or not self._trains(inner):
                continue
            # The outermost: the epoch loop, not a loop over phases or retries inside it.
            out.extend((inner.iter, expr, inner.order, inner.function, around[-1]) for expr in model.iterated_exprs(inner.iter))
        out.extend(
            (call.node, argument, call.order, call.function, call.loops[0])
            for call, _, argument in self._training_helper_arguments
        )
        return out

    @functools.cached_property
    def _training_helper_arguments(self) -> list[tuple[Call, Function, cst.BaseExpression]]:
        """Calls in a loop of another project module's function that trains on a loader it is given
        (`run_epoch(model, optimizer, train_loader)`), each with that function and the argument passed
        for a parameter its training loop draws from (one entry per such parameter)."""
        return [
            (call, function, argument)
            for call in self.model.calls
            if call.loops
            for function, argument in summaries.drawn_arguments(self.model, call)
        ]

    def _epoch_loop_reseeds_something(self, epoch_loop: Loop) -> bool:
        """Some `set_epoch` runs in the epoch loop (on whatever object), or a call there reaches a
        project helper or a trainer class that calls it."""
        for call in self.model.calls_within(epoch_loop, depth=MAX_CALLERS):
            if call.attr == "set_epoch" or summaries.called_epoch_setter(self.model, call) is not None:
                return True
            if summaries.trainer_sets_epoch(self.model, call):
                return True
        return False

    def _report_fixed(self, call: Call, epoch_loop: Loop) -> None:
        value = call.arg(0, "epoch")
        text = self.model.code_of(value) if value is not None else ""
        receiver = self.model.code_of(call.receiver) if call.receiver is not None else "sampler"
        node = epoch_loop.node
        target = node.target.value if isinstance(node, cst.For) and isinstance(node.target, cst.Name) else "epoch"
        self.report(
            call.node,
            f"`{receiver}.set_epoch({text})` is called with a value that does not change per epoch (epoch "
            f"loop at line {self.line(node)}): the sampler is reseeded with the same value every epoch, so "
            f"every epoch repeats the same order on every rank, as if set_epoch were missing. Pass the "
            f"current epoch: `{receiver}.set_epoch({target})`.",
        )

    def _fixed_per_epoch(self, call: Call, epoch_loop: Loop, within: list[Call], depth: int = 0) -> bool:
        """The value passed to set_epoch is certainly the same in every epoch: literals, and
        variables (or `args.`/`self.` attributes) that nothing in the epoch loop, nor any function it
        calls, assigns. A call, a subscript or a helper parameter is undecidable: not fixed."""
        value = call.arg(0, "epoch")
        if value is None:
            return False
        running = {id(epoch_loop.function)} | {id(c.function) for c in within}
        return self._fixed(value, call, epoch_loop, running, 0)

    def _fixed(self, expr: cst.BaseExpression, call: Call, epoch_loop: Loop, running: set[int], depth: int) -> bool:
        if depth > MAX_CALLERS * 2:
            return False
        if isinstance(expr, cst.Integer):
            return True
        if isinstance(expr, cst.UnaryOperation):
            return self._fixed(expr.expression, call, epoch_loop, running, depth + 1)
        if isinstance(expr, cst.BinaryOperation):
            return self._fixed(expr.left, call, epoch_loop, running, depth + 1) and self._fixed(
                expr.right, call, epoch_loop, running, depth + 1
            )
        if isinstance(expr, cst.Call) and dotted_name(expr.func) == "int" and len(expr.args) == 1:
            return self._fixed(expr.args[0].value, call, epoch_loop, running, depth + 1)
        name = dotted_name(expr)
        if name is None or name in epoch_loop.target_names:
            return False
        base, _, attr = name.partition(".")
        if "." in attr:
            return False  # `trainer.state.epoch`: an object something else may advance
        if attr and base == "self":
            # Any assignment outside __init__ may be the per-epoch update (a callback we cannot see).
            return all(a.function is not None and a.function.name == "__init__" for a in self.model.assignments_to(name))
        if attr:
            if not isinstance(expr, cst.Attribute) or not self._is_options(expr.value, call):
                return False
        else:
            reaching = self.model.reaching_assignments(name, call.order, call.function)
            if not reaching or any(a.kind == "param" for a in reaching):
                return False  # a global of another module, or a helper's parameter: undecidable
        for assignment in self.model.assignments_to(name) + (self.model.assignments_to(base) if attr else []):
            if self._updated_in_loop(assignment.order, assignment.function, epoch_loop, running):
                return False
        return True

    def _is_options(self, base: cst.BaseExpression, call: Call) -> bool:
        """`args` in `args.epochs`: every value it may hold is the result of `parse_args()`, whose
        attributes only change where this module assigns them."""
        leaves = self.model.leaf_values(base, call.order, call.function)
        return bool(leaves) and all(
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("parse_args", "parse_known_args")
            for value, _, _ in leaves
        )

    @staticmethod
    def _updated_in_loop(order: int, function: Optional[Function], epoch_loop: Loop, running: set[int]) -> bool:
        if function is epoch_loop.function:
            return order == epoch_loop.order or contains(epoch_loop, order)
        return id(function) in running

    def _draws(self, fed: list[Call]) -> list[tuple[cst.CSTNode, list[Loop]]]:
        """Where a training loop draws from one of the `fed` loaders, with the epoch loops that run
        it again and again: loops of this module, and calls of another project module's function
        whose training loop draws from the loader passed to it (`run_epoch(model, loader)` inside
        `for epoch in ...:`), reported at the call."""
        out: list[tuple[cst.CSTNode, list[Loop]]] = []
        for inner in self.model.loops_drawing(*fed):
            draws = [node for c, node in self.model.loop_draws(inner) if c.name == DATA_LOADER and c in fed]
            if draws and self._trains(inner):
                out.append((draws[0], self._epoch_loops(inner, fed)))
        drawing: list[Call] = []
        for call, _, argument in self._training_helper_arguments:
            if call not in drawing and any(o in fed for o in self.model.origin_calls(argument, call.order, call.function)):
                drawing.append(call)
        out.extend((call.node, [call.loops[0]]) for call in drawing)
        out.extend((call.node, [call.loops[0]]) for call in self._trainer_draws(fed))
        return out

    def _trainer_draws(self, fed: list[Call]) -> list[Call]:
        """Calls in a loop of a method of another project module's class whose training loop draws
        from a loader the constructor was given: `trainer = Trainer(model, train_dl=loader)`, then
        `for epoch in ...: trainer.train_epoch(epoch)` where `train_epoch` iterates
        `self.train_dataloader` that `__init__` set from `train_dl`."""
        out: list[Call] = []
        for call, constructor, init, params in self._trainer_calls:
            if any(o in fed for param in params for o in self._argument_origins(constructor, init, param)):
                out.append(call)
        return out

    @functools.cached_property
    def _trainer_calls(self) -> list[tuple[Call, Call, Function, list[str]]]:
        """The calls `_trainer_draws` asks about, found once: each with the constructor call, the
        class's `__init__` and the parameters it stores in attributes the method's loop draws from."""
        out: list[tuple[Call, Call, Function, list[str]]] = []
        for call in self.model.calls:
            if not call.loops or call.attr is None or call.receiver is None:
                continue  # cheap test first: linking reads and parses the other module
            found = summaries.trainer_drawn_params(self.model, call)
            if found is not None:
                constructor, init, params = found
                out.append((call, constructor, init, params))
        return out

    def _helper_sets_epoch(self, call: Call, sampler: Call, fed: list[Call]) -> bool:
        """A call of another project module's function that calls set_epoch on the loader or the
        sampler passed to it (`data.start_epoch(loader, epoch)`), or a method of another project
        module's class that calls set_epoch on anything (it may well be the sampler of the loader
        its constructor was given)."""
        if summaries.trainer_sets_epoch(self.model, call):
            return True
        if not any(
            o is sampler or o in fed for a in call.args for o in self.model.origin_calls(a.value, call.order, call.function)
        ):
            return False  # cheap test first: linking reads and parses the other module
        setter = summaries.called_epoch_setter(self.model, call)
        if setter is None:
            return False
        function, params = setter
        for param in sorted(params):
            origins = self._argument_origins(call, function, param)
            if sampler in origins or any(origin in fed for origin in origins):
                return True
        return False

    def _argument_origins(self, site: Call, function: Function, param: str) -> list[Call]:
        """The calls that may have produced what `site` passes for `function`'s parameter `param`
        (none when it passes nothing for it, or nothing traceable)."""
        argument = summaries.argument_for(site, function, param)
        return self.model.origin_calls(argument, site.order, site.function) if argument is not None else []

    def _fix(self, sampler: Call, epoch_loop: Loop) -> Optional[Fix]:
        """Insert `<sampler>.set_epoch(<epoch>)` as the epoch loop's first statement.

        Offered only when the edit is certainly right: a `for <name> in ...:` loop with an indented
        body, and one variable that holds exactly this sampler wherever the loop runs. It is applied
        by --fix only when that variable is bound unconditionally; a sampler created under
        `if args.distributed:` may be unbound or None on the other path, so there the fix is shown
        but left to a person (who may want `if args.distributed:` around it)."""
        node = epoch_loop.node
        if not isinstance(node, cst.For) or not isinstance(node.target, cst.Name):
            return None
        if not isinstance(node.body, cst.IndentedBlock) or not node.body.body:
            return None
        bound = [a for a in self.model.assignments_of(sampler.node) if a.kind == "assign"]
        if len(bound) != 1:
            return None
        holder = bound[0]
        if self.model.reaching_assignments(holder.target, epoch_loop.order, epoch_loop.function) != [holder]:
            return None
        first = node.body.body[0]
        position = self.model.position(first)
        line_text = self.model.source_lines[position.start.line - 1]
        indent = line_text[: position.start.column]
        if indent.strip():
            return None  # the first statement shares its line with something else
        statement = f"{holder.target}.set_epoch({node.target.value})"
        edit = Edit(position.start.line, 1, position.start.line, 1, f"{indent}{statement}\n")
        loop_guards = {id(g.test) for g in epoch_loop.guards}
        unconditional = all(id(g.test) in loop_guards for g in holder.ctx.guards)
        return Fix(f"call `{statement}` at the start of each epoch", applicable=unconditional, edits=(edit,))

    def _reseeded_each_epoch(self, sampler: Call, epoch_loop: Loop) -> bool:
        """`DistributedSampler(ds, seed=base_seed + epoch)` built inside the epoch loop: a new order
        every epoch without set_epoch."""
        inside = sampler.function is epoch_loop.function and contains(epoch_loop, sampler.order)
        seed = sampler.arg(4, "seed")
        if not inside or seed is None:
            return False
        # The seed must change with the loop (`args.seed + epoch`); `seed=args.seed` repeats the order.
        return any(name in epoch_loop.target_names for name in names_in(seed))

    def _trains(self, inner: Loop) -> bool:
        """The loop over the loader trains: a `.backward()` runs in it, directly or in a helper. An
        evaluation loop's order does not matter, so its sampler needs no set_epoch."""
        if any(summaries.runs_backward(self.model, c) for c in self.model.calls_within(inner, depth=MAX_CALLERS)):
            return True
        function = inner.function
        if function is None or not function.generator:
            return False
        # A generator (`def cycle(loader): while True: yield from ...`) trains where it is drawn from.
        return any(
            site.function is not None
            and any(c.attr == "backward" for c in self.model.calls_within(site.function, depth=MAX_CALLERS))
            for site in self.model.callers(function)
        )

    def _name_of(self, sampler: Call) -> str:
        return self.model.name_bound_to(sampler) or "sampler"

    def _epoch_loops(self, inner: Loop, fed: list[Call]) -> list[Loop]:
        """The loops that run `inner` over and over: loops around it in its function, else the loops
        around the call sites of its function (`train_one_epoch(loader)` called in `for epoch in ...`)
        that may hand it one of the `fed` loaders."""
        around = self.model.enclosing_loops(inner)
        if around:
            return around[-1:]  # the outermost: the epoch loop, not a retry loop inside it
        function = inner.function
        if function is None:
            return []
        out: list[Loop] = []
        for site in self._feeding_sites(inner, function, fed):
            if site.loops:
                out.append(site.loops[0])
                continue
            for loop in self.model.loops_in(site.function):
                if contains(loop, site.order):
                    out.append(loop)
                    break
            else:
                out.extend(self._epoch_loops_of_call(site, 1))
        return out

    def _feeding_sites(self, inner: Loop, function: Function, fed: list[Call]) -> list[Call]:
        """The call sites of `function` that may hand the loop `inner` one of the `fed` loaders: all of
        them, but those whose argument for the parameter the loop draws from certainly comes from
        elsewhere (`train_epoch(batch_iterator)` in a second epoch loop beside the loop that calls
        `train_epoch(train_loader)` after its `set_epoch`)."""
        sites = self.model.call_sites(function)
        if inner.iter is None:
            return sites
        named = (summaries.param_name(self.model, function, e) for e in self.model.iterated_exprs(inner.iter))
        params = {name for name in named if name is not None}
        if not params:
            return sites
        kept = []
        for site in sites:
            origins: list[Call] = []
            traced = True
            for param in params:
                found = self._argument_origins(site, function, param)
                traced = traced and bool(found)
                origins.extend(found)
            if not traced or any(origin in fed for origin in origins):
                kept.append(site)
        return kept

    def _epoch_loops_of_call(self, site: Call, depth: int) -> list[Loop]:
        function = site.function
        if function is None or depth >= MAX_CALLERS:
            return []
        out: list[Loop] = []
        for caller in self.model.call_sites(function):
            if caller.loops:
                out.append(caller.loops[0])
            else:
                out.extend(self._epoch_loops_of_call(caller, depth + 1))
        return out

    def _sets_epoch(self, call: Call, sampler: Call, fed: list[Call]) -> bool:
        """`set_epoch` on the sampler or on an object holding it: `sampler.set_epoch(epoch)`,
        `self.train_sampler.set_epoch(epoch)`, `train_loader.sampler.set_epoch(epoch)`."""
        receiver = call.receiver
        if receiver is None:
            return False
        if sampler in self.model.origin_calls(receiver, call.order, call.function):
            return True
        if isinstance(receiver, cst.Attribute) and receiver.attr.value in ("sampler", "batch_sampler"):
            holders = self.model.origin_calls(receiver.value, call.order, call.function)
            if any(h in fed for h in holders):
                return True
        return False

    def _unresolved(self, call: Call) -> bool:
        """A set_epoch whose receiver we cannot follow to any call: it may well be this sampler."""
        receiver: Optional[cst.BaseExpression] = call.receiver
        if receiver is None:
            return False
        if isinstance(receiver, cst.Attribute) and receiver.attr.value in ("sampler", "batch_sampler"):
            receiver = receiver.value
        return not self.model.origin_calls(receiver, call.order, call.function)

