"""DDP013 gradients-discarded-before-step: `zero_grad()` before every backward while the optimizer
steps only every few iterations: the iterations that do not step are computed and thrown away."""

from __future__ import annotations

from typing import Union

from ddpdoctor.lint.analysis import Call, Function, Loop, dotted_name, stepping
from ddpdoctor.lint.rules.base import Rule


class GradientsDiscardedBeforeStep(Rule):
    """
    Valid:
        for step, batch in enumerate(loader):
            (model(batch).mean() / accum_steps).backward()
            if step % accum_steps == accum_steps - 1:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    Invalid:
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
    """

    code = "DDP013"
    trigger_words = ("zero_grad",)
    # The rule starts from each `x.backward(...)` call of the module (method_calls("backward")): a
    # file without one (torch's own nn/modules/module.py defines zero_grad) has nothing to report.
    context_words = (".backward(",)

    def check(self) -> None:
        for backward in self.model.method_calls("backward"):
            loop = self.model.iteration(backward)
            if loop is None:
                continue
            step, guard = stepping.conditional_step(self.model, backward, loop)
            if step is None or guard is None:
                self.check_helper_step(backward, loop)
                continue
            if stepping.alternating_schedule(self.model, step, loop):
                continue
            clears = [
                c for c in stepping.clears_before(self.model, backward, loop)
                if stepping.clears_stepped_gradients(self.model, c, step, loop)
            ]
            if clears:
                self.report_clear(clears[-1], backward, f"the condition at line {self.line(guard.test)}")

    def check_helper_step(self, backward: Call, loop: Union[Loop, Function]) -> None:
        """The step is in a helper called from the loop (`scaler_step(optimizer, i)`), which steps
        only under an accumulation condition of its own; the loop clears that optimizer first."""
        found = stepping.helper_conditional_step(self.model, backward, loop)
        if found is None:
            return
        call, _, guard, optimizer = found
        clears = [c for c in stepping.clears_before(self.model, backward, loop) if dotted_name(c.receiver) == optimizer]
        if clears:
            where = f"the condition at line {self.line(guard.test)} inside {call.dotted}() (called at line {self.line(call.node)})"
            self.report_clear(clears[-1], backward, where)

    def report_clear(self, clear: Call, backward: Call, condition: str) -> None:
        self.report(
            clear.node,
            f"{clear.dotted}() runs before every backward (line {self.line(backward.node)}), but the optimizer "
            f"steps only under {condition}: the gradients of every iteration that does not step are computed and "
            f"thrown away (and under DDP still all-reduced). For gradient accumulation, clear the gradients after "
            f"the step, under the same condition, and run the backward of the iterations that do not step under "
            f"`with model.no_sync():` when the model is DDP-wrapped; to step every iteration, drop the condition.",
        )
