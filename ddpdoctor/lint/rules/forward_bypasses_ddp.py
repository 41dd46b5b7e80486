"""DDP010 forward-bypasses-ddp: the training forward pass calls `ddp_model.module(x)` instead of `ddp_model(x)`."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Fix
from ddpdoctor.lint.analysis import Call, Function, summaries
from ddpdoctor.lint.rules.base import Rule

DDP = "torch.nn.parallel.DistributedDataParallel"
# Context managers and decorators under which no gradient is recorded, so no all-reduce is missed.
NO_GRAD = frozenset(
    {"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad",
     "torch.autograd.inference_mode", "torch.autograd.grad_mode.inference_mode"}
)
# Functions that evaluate rather than train: their forward passes produce no gradients to sync.
EVAL_WORDS = ("eval", "valid", "test", "infer", "predict", "generate", "sample")
# How many levels of callers to inspect for "is this a training forward / is it under no_grad".
MAX_CALLERS = 3


class ForwardBypassesDDP(Rule):
    """
    Valid:
        model = DDP(model, device_ids=[local_rank])
        loss = criterion(model(images), target)
        loss.backward()
        torch.save(model.module.state_dict(), "checkpoint.pt")
    Invalid:
        model = DDP(model, device_ids=[local_rank])
        loss = criterion(model.module(images), target)
        loss.backward()
    """

    code = "DDP010"
    # A holder built before the wrap (`self.objective.loss(x)` names no `.module`) needs the model's
    # name rebound to the wrapper here: `model = DDP(model)` as written. Not the bare class name, which
    # the modules a library imports mention everywhere (each file it lets through is parsed).
    trigger_words = (
        ".module(", ".module.forward(", ").module", "= DistributedDataParallel(", "= DDP(",
        "= nn.parallel.DistributedDataParallel(", "= torch.nn.parallel.DistributedDataParallel(",
    )
    context_words = ("DistributedDataParallel",)

    def check(self) -> None:
        if not self.model.calls_named(DDP):
            return
        self.check_discarded_wrappers()
        self.check_stale_holders()
        for call in self.model.calls:
            wrapped = self._wrapped_receiver(call)
            if wrapped is None:
                continue
            if self._without_grad(call, 0) or not self._trains(call.function, 0):
                continue
            wraps = [c for c in self.model.origin_calls(wrapped, call.order, call.function) if c.name == DDP]
            if not wraps:
                continue  # `.module` of something not known to be DDP (a DataParallel, a plain nn.Module)
            wrap = min(wraps, key=lambda c: c.order)
            receiver = self.model.code_of(wrapped)
            callee = self.model.code_of(call.node.func)
            self.report(
                call.node,
                f"`{callee}(...)` runs the forward pass on the module inside DistributedDataParallel (wrapped at "
                f"line {self.line(wrap.node)}), bypassing DDP, so its gradients are never all-reduced and the "
                f"replicas drift apart. Call `{receiver}(...)` instead.",
                fix=Fix(
                    f"Call `{receiver}(...)` instead of `{callee}(...)`",
                    # Not applied by --fix: the DDP forward also broadcasts buffers and expects a backward
                    # through every forward; a forward whose output is not used for the loss (or that runs
                    # several times per step) can then fail, so a human should confirm.
                    applicable=False,
                    edits=(self.replace(call.node.func, receiver),),
                ),
            )

    def check_discarded_wrappers(self) -> None:
        """`model = DDP(model, ...).module` in a module that trains: the DDP object is thrown away where
        it is built, so every forward bypasses it."""
        if not any(c.attr == "backward" for c in self.model.calls):
            return  # an evaluation or export script: no gradients to all-reduce
        for assignment, wrap in self.model.unwrapped_at_construction(DDP):
            self.report(
                wrap.node,
                f"`{assignment.target} = DistributedDataParallel(...).module` keeps only the inner module: the DDP "
                f"object is dropped where it is built, so no forward pass goes through it, the gradients are never "
                f"all-reduced and the replicas drift apart. Keep the DDP object for training "
                f"(`{assignment.target} = DistributedDataParallel(...)`) and use `.module` only to save or load "
                f"its state.",
            )

    def check_stale_holders(self) -> None:
        """A training forward run through a holder object (a loss or diffusion wrapper, any project
        module's class) that was handed the raw module before its name was rebound to the DDP
        wrapper: `self.objective = Objective(self.model)` then `self.model = DDP(self.model)`, then
        `self.objective.loss(x)` in the training step."""
        for stale in summaries.stale_holders(self.model, (DDP,)):
            use = stale.use
            if self._without_grad(use, 0) or not self._trains(use.function, 0):
                continue
            if use.attr is not None and any(part.startswith(EVAL_WORDS) for part in use.attr.lower().split("_")):
                continue  # `self.evaluator.validate(loader)`: the holder evaluates, whatever calls it
            callee = self.model.code_of(use.node.func)
            self.report(
                use.node,
                f"`{callee}(...)` runs the forward pass through `{stale.holder}`, built at line "
                f"{self.line(stale.built.node)} from `{stale.wrapped}` before line {self.line(stale.wrap.node)} "
                f"rebound `{stale.wrapped}` to the DistributedDataParallel wrapper: it still holds the raw module "
                f"(in `.{stale.attribute}`), so this training step bypasses DDP, its gradients are never "
                f"all-reduced and the replicas drift apart. Build `{stale.holder}` after wrapping, or hand it the "
                f"wrapper (`{stale.holder}.{stale.attribute} = {stale.wrapped}`).",
            )

    @staticmethod
    def _wrapped_receiver(call: Call) -> Optional[cst.BaseExpression]:
        """`X` for `X.module(...)` and `X.module.forward(...)`, else None."""
        func = call.node.func
        if not isinstance(func, cst.Attribute):
            return None
        if func.attr.value == "forward":
            func = func.value
            if not isinstance(func, cst.Attribute):
                return None
        if func.attr.value != "module":
            return None
        return func.value

    def _without_grad(self, call: Call, depth: int) -> bool:
        """True when the call runs with gradients off: inside `with torch.no_grad():` (or inference_mode),
        in a function decorated with them, or in a helper whose every call site is."""
        for context in call.ctx.withs:
            target = context.func if isinstance(context, cst.Call) else context
            if self.model.qualify(target) in NO_GRAD:
                return True
            if isinstance(context, cst.Call) and self.model.qualify(context.func) == "torch.set_grad_enabled":
                flag = context.args[0].value if context.args else None
                if isinstance(flag, cst.Name) and flag.value == "False":
                    return True
        for function in self._functions_around(call.function):
            if self._decorated_no_grad(function):
                return True
        if call.function is not None and depth < MAX_CALLERS:
            sites = self.model.call_sites(call.function)
            if sites and all(self._without_grad(site, depth + 1) for site in sites):
                return True
        return False

    def _decorated_no_grad(self, function: Function) -> bool:
        node = function.node
        if not isinstance(node, cst.FunctionDef):
            return False
        for decorator in node.decorators:
            target = decorator.decorator
            if isinstance(target, cst.Call):
                target = target.func
            if self.model.qualify(target) in NO_GRAD:
                return True
        return False

    @staticmethod
    def _functions_around(function: Optional[Function]) -> list[Function]:
        out = []
        while function is not None:
            out.append(function)
            function = function.parent
        return out

    def _trains(self, function: Optional[Function], depth: int) -> bool:
        """True when the forward pass belongs to training: a `.backward(...)` runs in the same function, or
        in a function that (transitively) calls it, and that function is not an evaluation function."""
        if function is not None and any(part.startswith(EVAL_WORDS) for part in function.name.lower().split("_")):
            return False  # `evaluate`, `run_validation`, `test_step`, `sample_images`; not `train_resampled`
        calls = function.calls if function is not None else [c for c in self.model.calls if c.function is None]
        if any(c.attr == "backward" for c in calls):
            return True
        if function is None or depth >= MAX_CALLERS:
            return False
        return any(self._trains(site.function, depth + 1) for site in self.model.call_sites(function))
