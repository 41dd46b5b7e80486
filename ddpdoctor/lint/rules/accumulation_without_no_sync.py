"""DDP007 accumulation-without-no-sync: gradient accumulation on a DDP model that all-reduces every micro-batch."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis import Call, Guard, Loop, dotted_name, names_in
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
        for backward in self.model.method_calls("backward"):
            if not backward.loops:
                continue
            loop = backward.loops[-1]
            step, guard = self._conditional_step(backward, loop)
            if step is None or guard is None:
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

    def _conditional_step(self, backward: Call, loop: Loop) -> tuple[Optional[Call], Optional[Guard]]:
        """An `optimizer.step()` / `scaler.step(optimizer)` in the same loop iteration that runs only under
        an accumulation condition (`(i + 1) % accum_steps == 0`) which does not also guard the backward."""
        for call in self.model.method_calls("step"):
            if call.function is not backward.function or not (loop.order < call.order < loop.end_order):
                continue
            if not self._is_optimizer_step(call):
                continue
            for guard in call.ctx.guards:
                if guard.order < loop.order or guard in backward.ctx.guards:
                    continue
                if self._is_accumulation_test(guard, call):
                    return call, guard
        return None, None

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
        stack: list[cst.CSTNode] = [guard.test]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
                divisor = self.model.const_value(node.right, step.order, step.function)
                if divisor != 1:
                    return True
            for child in node.children:
                stack.append(child)
        return any("accum" in name.lower() for name in names_in(guard.test))

    def _ddp_forward(self, loop: Loop) -> Optional[tuple[Call, Call]]:
        """A model called in the loop body (`model(x)`, `self.model(x)`, also in a helper called from
        the loop) and the DDP wrap it comes from."""
        for call in self.model.calls_within(loop, depth=1):
            if call.name is not None or call.dotted is None:
                continue
            for origin in self.model.origin_calls(call.node.func, call.order, call.function):
                if origin.name == DDP:
                    return call, origin
        return None
