"""DDP013 gradients-discarded-before-step: `zero_grad()` before every backward while the optimizer
steps only every few iterations: the iterations that do not step are computed and thrown away."""

from __future__ import annotations

from ddpdoctor.lint.analysis import stepping
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

    def check(self) -> None:
        for backward in self.model.method_calls("backward"):
            loop = self.model.iteration(backward)
            if loop is None:
                continue
            step, guard = stepping.conditional_step(self.model, backward, loop)
            if step is None or guard is None or stepping.alternating_schedule(self.model, step, loop):
                continue
            clears = [
                c for c in stepping.clears_before(self.model, backward, loop)
                if stepping.clears_stepped_gradients(self.model, c, step, loop)
            ]
            if not clears:
                continue
            clear = clears[-1]
            self.report(
                clear.node,
                f"{clear.dotted}() runs before every backward (line {self.line(backward.node)}), but the optimizer "
                f"steps only under the condition at line {self.line(guard.test)}: the gradients of every iteration "
                f"that does not step are computed and thrown away (and under DDP still all-reduced). For gradient "
                f"accumulation, clear the gradients after the step, under the same condition, and run the "
                f"backward of the iterations that do not step under `with model.no_sync():` when the model is "
                f"DDP-wrapped; to step every iteration, drop the condition.",
            )
