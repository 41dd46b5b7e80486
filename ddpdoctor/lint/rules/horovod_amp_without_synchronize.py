"""HVD004 horovod-amp-without-synchronize: a GradScaler unscales or steps a Horovod
DistributedOptimizer without Horovod's AMP pattern (`optimizer.synchronize()` first, the step under
`optimizer.skip_synchronize()`)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Edit, Fix
from ddpdoctor.lint.analysis import Call, conditions, contains, dotted_name, stepping
from ddpdoctor.lint.rules.base import Rule

SCALERS = frozenset({"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"})


class HorovodAmpWithoutSynchronize(Rule):
    """
    Valid:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            optimizer.zero_grad()
            scaler.scale(model(x).mean()).backward()
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
            scaler.update()
    Invalid:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            optimizer.zero_grad()
            scaler.scale(model(x).mean()).backward()
            scaler.step(optimizer)
            scaler.update()
    """

    code = "HVD004"
    trigger_words = ("DistributedOptimizer",)
    context_words = ("scale",)

    def check(self) -> None:
        for call in self.model.method_calls("unscale_", "step"):
            found = self._horovod_optimizer(call)
            if found is None:
                continue
            optimizer, wrap = found
            synchronized = stepping.synchronized_before(self.model, optimizer, call)
            wrapped = f"hvd.DistributedOptimizer at line {self.line(wrap.node)}"
            if synchronized is None:
                if call.attr == "step" and self._unscaled_before(call, optimizer):
                    continue  # reported at that unscale_
                if stepping.under_skip_synchronize(optimizer, call):
                    continue  # whoever wrote skip_synchronize() synchronized somewhere we do not see
                what = "unscales" if call.attr == "unscale_" else "unscales, checks for inf/NaN and steps"
                fix = self.fix(call, optimizer, synchronize=True) if call.attr == "step" else None
                self.report(
                    call.node,
                    f"{call.dotted}({optimizer}) {what} the gradients of a Horovod optimizer ({wrapped}) "
                    f"before its all-reduce has finished: each rank unscales and checks its own, unreduced "
                    f"gradients, so the ranks can skip different steps and drift apart. Call "
                    f"`{optimizer}.synchronize()` before `scaler.unscale_({optimizer})`, and step under "
                    f"`with {optimizer}.skip_synchronize(): scaler.step({optimizer})`.",
                    fix=fix,
                )
            elif call.attr == "step" and not stepping.under_skip_synchronize(optimizer, call):
                self.report(
                    call.node,
                    f"{call.dotted}({optimizer}) steps a Horovod optimizer ({wrapped}) that was already "
                    f"synchronized at line {self.line(synchronized.node)}: without `skip_synchronize()` its "
                    f"step() all-reduces the gradients a second time. Step under "
                    f"`with {optimizer}.skip_synchronize():`.",
                    fix=self.fix(call, optimizer, synchronize=False),
                )

    def fix(self, step: Call, optimizer: str, *, synchronize: bool) -> Optional[Fix]:
        """Horovod's documented order around a `scaler.step(optimizer)` that is a statement of its own
        line: `optimizer.synchronize()` before it (when nothing synchronized), and the step under
        `with optimizer.skip_synchronize():`. Nothing else changes, so the edit is certain."""
        lines = self.model.own_lines(step)
        statement = step.statement
        if lines is None or not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        if statement.trailing_whitespace.comment is not None:
            return None  # the rewritten lines would lose it
        small = statement.body[0]
        if not isinstance(small, cst.Expr) or small.value is not step.node:
            return None
        first, last, indent = lines
        if first != last:
            return None
        text = f"{indent}{optimizer}.synchronize()\n" if synchronize else ""
        text += f"{indent}with {optimizer}.skip_synchronize():\n{indent}    {self.model.code_of(step.node)}\n"
        what = "synchronize first and step under skip_synchronize()" if synchronize else "step under skip_synchronize()"
        return Fix(what, applicable=True, edits=(Edit(first, 1, last + 1, 1, text),))

    def _horovod_optimizer(self, call: Call) -> Optional[tuple[str, Call]]:
        """The optimizer (as written) a GradScaler's `unscale_(opt)` / `step(opt)` call is given, when
        it is a Horovod DistributedOptimizer on the path the call runs on; with the wrap."""
        if call.receiver is None or not self._is_scaler(call):
            return None
        argument = call.arg(0, "optimizer")
        optimizer = dotted_name(argument)
        if optimizer is None:
            return None
        wraps = [
            w for w in stepping.horovod_optimizer_wraps(self.model, argument, call)
            if not conditions.exclusive(self.model, w, call)
        ]
        return (optimizer, wraps[0]) if wraps else None

    def _is_scaler(self, call: Call) -> bool:
        origins = self.model.origin_names(call.receiver, call.order, call.function)
        if origins & SCALERS:
            return True
        written = dotted_name(call.receiver) or ""
        return not origins and "scaler" in written.rsplit(".", 1)[-1].lower()

    def _unscaled_before(self, step: Call, optimizer: str) -> bool:
        return any(
            c.function is step.function and c.order < step.order and dotted_name(c.arg(0, "optimizer")) == optimizer
            and all(contains(loop, c.order) for loop in step.loops)
            for c in self.model.method_calls("unscale_")
        )
