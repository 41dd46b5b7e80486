"""DDP007 accumulation-without-no-sync: gradient accumulation on a DDP model that all-reduces every micro-batch."""

from __future__ import annotations

from typing import Optional, Union

from ddpdoctor.lint.analysis import Call, Function, Loop, summaries
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
            guard = summaries.accumulation_guard(self.model, backward, loop)
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
            found = summaries.called_accumulation(self.model, call)
            if found is None:
                continue
            other, param, guard, argument = found
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
