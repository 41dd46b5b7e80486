"""DDP008 unguarded-checkpoint-save: `torch.save` in a distributed script runs on every rank."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis import MAX_DEPTH, Call, Function, ModuleModel, Runs, dotted_name, launch, ranks, who_runs
from ddpdoctor.lint.rules.base import Rule

SAVE = "torch.save"
IN_MEMORY = frozenset({"io.BytesIO", "io.StringIO"})


def mentions_rank(
    model: ModuleModel, expr: Optional[cst.CSTNode], order: int, function: Optional[Function], depth: int = 0
) -> bool:
    """True when an expression (a path) is built from a rank, following variables: per-rank files."""
    if expr is None or depth > MAX_DEPTH:
        return False
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute, cst.Call)) and (
            isinstance(node, cst.Call) or dotted_name(node) is not None
        ):
            if ranks.rank_kind(model, node, order, function) is not None:  # type: ignore[arg-type]
                return True
            if not isinstance(node, cst.Call):
                # The path through variables and helper parameters, each value in its own scope.
                for value, v_order, v_function in model.leaf_values(node, order, function):  # type: ignore[arg-type]
                    if value is not node and mentions_rank(model, value, v_order, v_function, depth + 1):
                        return True
                continue
        stack.extend(child for child in node.children if not isinstance(child, cst.BaseParenthesizableWhitespace))
    return False


class UnguardedCheckpointSave(Rule):
    """
    Valid:
        dist.init_process_group("nccl")
        ...
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "checkpoint.pt")
    Invalid:
        dist.init_process_group("nccl")
        ...
        torch.save(model.module.state_dict(), "checkpoint.pt")
    """

    code = "DDP008"
    trigger_words = (".save(", "import save")
    context_words = launch.LAUNCH_WORDS

    def check(self) -> None:
        saves = self.model.calls_named(SAVE)
        if not saves:
            return
        setup_call = launch.multiprocess_evidence(self.model)
        if setup_call is None:
            return
        what = launch.describe(setup_call)
        for save in saves:
            path = save.arg(1, "f")
            if path is None or mentions_rank(self.model, path, save.order, save.function):
                continue  # a per-rank file (`ckpt_rank{rank}.pt`) is a deliberate sharded save
            if self.model.origin_names(path, save.order, save.function) & IN_MEMORY:
                continue  # serialising into a buffer writes no file
            if who_runs(self.model, save).runs is not Runs.ALL:
                continue
            where = f" ({what} at line {self.line(setup_call.node)})"
            function = save.function
            if function is not None:
                for site in self.model.callers(function):
                    if site.function is not function and who_runs(self.model, site).runs is Runs.ALL:
                        where += f", reached through the call to {function.name}() at line {self.line(site.node)}"
                        break
            check = "`if hvd.rank() == 0:`" if what == "hvd.init()" else "`if dist.get_rank() == 0:` or a save_on_master helper"
            self.report(
                save.node,
                f"torch.save runs on every rank of this distributed script{where}: all processes "
                f"write the same checkpoint file at once, which can leave it truncated or corrupt. "
                f"Save only on the main process ({check}).",
            )
