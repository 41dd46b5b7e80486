"""DDP014 rank-divergent-exit: a `break` / `continue` / `return` / `sys.exit()` taken on some ranks
only, while the others go on into a collective and wait there until the timeout."""

from __future__ import annotations

from ddpdoctor.lint.analysis import Runs, divergence, launch, summaries
from ddpdoctor.lint.rules.base import Rule

# What makes a backward a collective: DDP all-reduces in it, Horovod's optimizer starts its all-reduces.
SYNCHRONISING_WRAPS = (
    "torch.nn.parallel.DistributedDataParallel", "torch.distributed.fsdp.FullyShardedDataParallel",
    "horovod.torch.DistributedOptimizer",
)
WHO = {Runs.RANK0: "only on the main process", Runs.NONZERO: "only on the non-main ranks", Runs.SUBSET: "only on some ranks"}
SHOWN = {"break": "break", "continue": "continue", "return": "return", "exit": "exit"}


class RankDivergentExit(Rule):
    """
    Valid:
        for epoch in range(epochs):
            for x in loader:
                optimizer.zero_grad()
                loss = model(x).mean()
                loss.backward()
                optimizer.step()
            if epoch >= max_epochs:
                break
    Invalid:
        model = DDP(model, device_ids=[local_rank])
        for x in loader:
            optimizer.zero_grad()
            loss = model(x).mean()
            if not torch.isfinite(loss):
                continue
            loss.backward()
            optimizer.step()
    """

    code = "DDP014"
    checks_test_suites = False
    # An exit in this file, or a wrapped model handed to another module's loop.
    trigger_words = ("break", "continue", "return", "exit", "DataParallel", "DistributedOptimizer")
    context_words = launch.LAUNCH_WORDS

    def check(self) -> None:
        if launch.multiprocess_evidence(self.model) is None:
            return
        synchronising = bool(self.model.calls_named(*SYNCHRONISING_WRAPS))
        if synchronising:
            self.check_project_helpers()
        for exit in divergence.exits(self.model):
            after = divergence.reaches_collective_after(self.model, exit)
            if after is None or (after.attr == "backward" and not synchronising):
                continue
            why = divergence.divergent_condition(self.model, exit)
            if why is None:
                continue
            if not exit.loops and why.runs is not None and after.attr != "backward":
                continue  # `if rank != 0: return` before a collective: DDP009 reports that collective
            next_step = (
                f"the backward at line {self.line(after.node)} (DDP all-reduces the gradients in it)"
                if after.attr == "backward" else f"{after.dotted}() at line {self.line(after.node)}"
            )
            what = SHOWN[exit.kind]
            if why.runs is not None:
                self.report(
                    exit.node,
                    f"This {what} is taken {WHO[why.runs]} (condition at line {self.line(why.guard.test)}), while "
                    f"the other ranks go on to {next_step}: they wait there for a rank that has left, until the "
                    f"collective timeout. Decide on every rank: compute the condition on all ranks, or broadcast "
                    f"rank 0's decision (`dist.broadcast(flag, src=0)`) and exit on all of them.",
                )
            else:
                shown = self.model.code_of(why.measured) if why.measured is not None else "a value"
                self.report(
                    exit.node,
                    f"This {what} depends on `{shown}` (condition at line {self.line(why.guard.test)}), a value each "
                    f"rank measures on its own data and that is not reduced across ranks: ranks that do not take "
                    f"it go on to {next_step} and wait there for the ones that left, until the collective timeout. "
                    f"All-reduce the value first (`dist.all_reduce(t, op=dist.ReduceOp.AVG)` or MAX for a "
                    f"non-finite check) so that every rank decides the same way.",
                )

    def check_project_helpers(self) -> None:
        """A DDP-wrapped model handed to another project module's training function
        (`train_one_epoch(args, model=ddp_model, ...)`) whose loop leaves on some ranks only before
        the backward: reported at the call, where the wrap is known (the helper alone cannot tell
        that its backward is a collective)."""
        for call in self.model.calls:
            if not self.model.may_link(call):
                continue
            wrapped = any(
                o.name in SYNCHRONISING_WRAPS
                for a in call.args for o in self.model.origin_calls(a.value, call.order, call.function)
            )
            if not wrapped:
                continue
            for other, exit, after, why in summaries.called_divergent_exits(self.model, call):
                if not exit.loops and why.runs is not None and after.attr != "backward":
                    continue  # DDP009's, at the collective
                reason = (
                    WHO[why.runs] if why.runs is not None
                    else f"when `{other.code_of(why.measured or why.guard.test)}` holds (a value each rank measures on "
                    f"its own data and does not reduce)"
                )
                self.report(
                    call.node,
                    f"{call.dotted}() runs a DDP-wrapped model through code whose {SHOWN[exit.kind]} at "
                    f"{other.shown_path} line {other.line_of(exit.node)} is taken {reason}, while the other ranks go "
                    f"on to the backward or collective at line {other.line_of(after.node)} and wait there until the "
                    f"collective timeout. Make every rank take the same decision (all-reduce the value, or "
                    f"broadcast rank 0's decision) before leaving.",
                )
                break
