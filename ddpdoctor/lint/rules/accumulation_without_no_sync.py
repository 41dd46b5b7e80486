"""DDP007 accumulation-without-no-sync: gradient accumulation on a DDP model that all-reduces every micro-batch."""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst

from ddpdoctor.lint.analysis import Call, Function, Guard, Loop, dotted_name, names_in, summaries, syntax
from ddpdoctor.lint.rules.base import Rule

DDP = "torch.nn.parallel.DistributedDataParallel"


class AccumulationWithoutNoSync(Rule):
    """
    Valid:
        model = DDP(model, device_ids=[local_rank])
        for i, (x, y) in enumerate(loader):
            sync = (i + 1) % accum_steps == 0
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = criterion(model(x), y) / accum_steps
                loss.backward()
            if sync:
                optimizer.step()
                optimizer.zero_grad()
    Invalid:
        model = DDP(model, device_ids=[local_rank])
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """

    code = "DDP007"
    trigger_words = ("DistributedDataParallel",)

    def check(self) -> None:
        if not self.model.calls_named(DDP):
            return
        # Any use of no_sync, or nanoGPT's `model.require_backward_grad_sync = ...`, means the script
        # already controls when DDP synchronises.
        if self.model.method_calls("no_sync"):
            return
        if any(a.target.endswith("require_backward_grad_sync") for a in self.model.assignments):
            return
        self.check_project_helpers()
        for backward in self.model.method_calls("backward"):
            loop = self.model.iteration(backward)
            if loop is None:
                continue
            guard = self._accumulation(backward, loop)
            if guard is None:
                continue
            found = self._ddp_forward(loop)
            if found is None:
                continue
            forward, wrap = found
            self.report(
                backward.node,
                f"Gradients are accumulated over micro-batches (optimizer step only under the condition at line "
                f"{self.line(guard.test)}), but this backward on a DDP model (wrapped at line "
                f"{self.line(wrap.node)}) all-reduces the gradients on every micro-batch. Run the backward of the "
                f"micro-batches that do not step under `with {forward.dotted}.no_sync():`.",
            )

    def _accumulation(self, backward: Call, loop: Union[Loop, Function]) -> Optional[Guard]:
        """The accumulation condition the optimizer step of `backward`'s iteration runs under, when
        gradients do accumulate across iterations of `loop`: not in the `else:` of `if
        accumulation_steps > 1:` (one backward per step), and no `zero_grad()` before every backward
        (nothing carries over)."""
        if any(self._without_accumulation(guard) for guard in backward.ctx.guards):
            return None
        if summaries.gradients_cleared_before(self.model, backward, loop):
            return None
        step, guard = self._conditional_step(backward, loop)
        return guard if step is not None else None

    def _conditional_step(self, backward: Call, loop: Union[Loop, Function]) -> tuple[Optional[Call], Optional[Guard]]:
        """An `optimizer.step()` / `scaler.step(optimizer)` in the same loop iteration that runs only under
        an accumulation condition (`(i + 1) % accum_steps == 0`) which does not also guard the backward."""
        for call in self.model.calls_inside(loop):
            if call.attr != "step" or not isinstance(call.node.func, cst.Attribute) or call.function is not backward.function:
                continue
            if not self._is_optimizer_step(call):
                continue
            for guard in call.ctx.guards:
                if guard.order < loop.order or guard in backward.ctx.guards:
                    continue
                if self._is_accumulation_test(guard, call):
                    return call, guard
        return None, None

    def check_project_helpers(self) -> None:
        """A DDP model handed to another project module's function whose loop accumulates
        (`train_one_epoch(model, loader, optimizer, accum_steps=8)`): reported at the call, where
        both halves are known."""
        for call in self.model.calls:
            # Cheap test first (linking reads and parses the other module): a DDP model is passed.
            if not any(
                o.name == DDP for a in call.args for o in self.model.origin_calls(a.value, call.order, call.function)
            ):
                continue
            linked = self.model.linked_function(call)
            if linked is None:
                continue
            other, function = linked
            judge = type(self)(other)
            found = judge.accumulating_param(function)
            if found is None:
                continue
            param, guard = found
            argument = summaries.argument_for(call, function, param)
            if argument is None:
                continue
            wraps = [o for o in self.model.origin_calls(argument, call.order, call.function) if o.name == DDP]
            if not wraps:
                continue
            self.report(
                call.node,
                f"{call.dotted}() accumulates gradients over micro-batches (optimizer step only under the "
                f"condition at {other.shown_path} line {other.line_of(guard.test)}), but the model passed as "
                f"`{param}` is wrapped in DDP (line {self.line(wraps[0].node)}) and all-reduces the gradients on "
                f"every micro-batch. Run the backward of the micro-batches that do not step under "
                f"`with model.no_sync():`.",
            )

    def accumulating_param(self, function: Function) -> Optional[tuple[str, Guard]]:
        """The parameter of `function` whose model a loop of it runs forward and backward on, with
        the optimizer stepping only under an accumulation condition; and that condition."""
        if self.model.method_calls("no_sync"):
            return None
        for backward in self.model.method_calls("backward"):
            if backward.function is not function or not backward.loops:
                continue
            loop = backward.loops[-1]
            guard = self._accumulation(backward, loop)
            if guard is None:
                continue
            for call in self.model.calls_within(loop, depth=0):
                param = summaries.param_name(self.model, function, call.node.func)
                if param is not None:
                    return param, guard
        return None

    @staticmethod
    def _without_accumulation(guard: Guard) -> bool:
        """A branch that runs only when the accumulation count is 1: `if accum_steps == 1:`,
        `if grad_accum <= 1:`, or the `else:` of `if accumulation_steps > 1:`."""
        test = guard.test
        if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
            return False
        name = dotted_name(test.left) or ""
        if "accum" not in name.rsplit(".", 1)[-1].lower():
            return False
        target = test.comparisons[0]
        if not (isinstance(target.comparator, cst.Integer) and target.comparator.evaluated_value == 1):
            return False
        operator = type(target.operator)
        if guard.negated:
            return operator in (cst.GreaterThan, cst.NotEqual)
        return operator in (cst.Equal, cst.LessThanEqual)

    @staticmethod
    def _is_optimizer_step(call: Call) -> bool:
        """`optimizer.step()`, `self.optimizer.step()`, `scaler.step(optimizer)`; not `scheduler.step()`."""
        receiver = dotted_name(call.receiver) or ""
        last = receiver.rsplit(".", 1)[-1].lower()
        if "sched" in last or "lr" == last:
            return False
        if "optim" in last or last in ("opt", "solver"):
            return True
        if "scaler" in last and call.args:
            argument = dotted_name(call.args[0].value) or ""
            return "optim" in argument.rsplit(".", 1)[-1].lower()
        return False

    def _is_accumulation_test(self, guard: Guard, step: Call) -> bool:
        """`(i + 1) % accum_steps == 0` (a modulo by something other than 1), or a test that reads an
        accumulation counter (`if step_in_accum == grad_accum_steps - 1:`)."""
        for divisor in syntax.modulo_divisors(guard.test):
            if self.model.const_value(divisor, step.order, step.function) != 1:
                return True
        return any("accum" in name.lower() for name in names_in(guard.test))

    def _ddp_forward(self, loop: Union[Loop, Function]) -> Optional[tuple[Call, Call]]:
        """A model called in the loop body (`model(x)`, `self.model(x)`, also in a helper called from
        the loop) and the DDP wrap it comes from."""
        for call in self.model.calls_within(loop, depth=1):
            if call.name is not None or call.dotted is None:
                continue
            for origin in self.model.origin_calls(call.node.func, call.order, call.function):
                if origin.name == DDP:
                    return call, origin
        return None
