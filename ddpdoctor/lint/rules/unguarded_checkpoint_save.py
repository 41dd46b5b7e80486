"""DDP008 unguarded-checkpoint-save: `torch.save` in a distributed script runs on every rank."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Edit, Fix

from ddpdoctor.lint.analysis import (
    Call,
    Runs,
    WhoRuns,
    launch,
    launchfiles,
    ranks,
    sharding,
    summaries,
    who_runs,
)
from ddpdoctor.lint.rules.base import Rule

SAVE = "torch.save"


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
    # A save in a project helper is called by a name that says so (`save_checkpoint`, `write_ckpt`).
    trigger_words = ("save", "checkpoint", "ckpt")
    context_words = launch.LAUNCH_WORDS

    def check(self) -> None:
        setup_call = launch.multiprocess_evidence(self.model)
        if setup_call is None:
            return
        what = launch.describe(setup_call)
        check = "`if hvd.rank() == 0:`" if what == "hvd.init()" else "`if dist.get_rank() == 0:` or a save_on_master helper"
        self.check_saves(setup_call, what, check)
        self.check_project_helpers(setup_call, what, check)

    def check_saves(self, setup_call: Call, what: str, check: str) -> None:
        saves = self.model.calls_named(SAVE)
        for save in saves:
            path = save.arg(1, "f")
            if path is None or summaries.mentions_rank(self.model, path, save.order, save.function):
                continue  # a per-rank file (`ckpt_rank{rank}.pt`) is a deliberate sharded save
            if sharding.per_item_path(self.model, path, save.order, save.function):
                continue  # one file per item of this rank's own share of the data: no other rank writes it
            if self.model.origin_names(path, save.order, save.function) & summaries.IN_MEMORY:
                continue  # serialising into a buffer writes no file
            who = who_runs(self.model, save)
            if who.runs is not Runs.ALL:
                self._check_once_per_node(save, path, who)
                continue
            where = f" ({what} at line {self.line(setup_call.node)})"
            function = save.function
            if function is not None:
                for site in self.model.callers(function):
                    if site.function is not function and who_runs(self.model, site).runs is Runs.ALL:
                        where += f", reached through the call to {function.name}() at line {self.line(site.node)}"
                        break
            self.report(
                save.node,
                f"torch.save runs on every rank of this distributed script{where}: all processes "
                f"write the same checkpoint file at once, which can leave it truncated or corrupt. "
                f"Save only on the main process ({check}).",
                fix=self.fix(save, what),
            )

    def fix(self, save: Call, what: str) -> Optional[Fix]:
        """Put the save under the script's own main-process test (`if dist.get_rank() == 0:`,
        `if is_main_process():`...), indenting it. Left as a suggestion where the script has no such
        test (the default spelled here may not suit it), or where other ranks may need what the
        save does: a later torch.load in the same function, a collective in the saved expression,
        or FSDP / DeepSpeed, whose state_dict() is itself collective, or a later call in the same
        function given the same path (every rank would read a file only one wrote)."""
        statement = save.statement
        if not (
            isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr) and statement.body[0].value is save.node
        ):
            return None
        lines = self.model.indentable_lines(save)
        own = self.model.own_lines(save)
        if lines is None or own is None:
            return None
        first, last, indent = own
        test = ranks.main_process_test(self.model, save)
        certain = test is not None and not self._others_need(save)
        if test is None:
            rank = self.model.spelling("horovod.torch.rank" if what == "hvd.init()" else "torch.distributed.get_rank")
            if rank is None:
                return None
            test = f"{rank}() == 0"
        unit = "\t" if "\t" in indent else "    "
        text = f"{indent}if {test}:\n" + "".join(f"{unit}{line}\n" for line in lines)
        return Fix(f"save only where `{test}`", applicable=certain, edits=(Edit(first, 1, last + 1, 1, text),))

    def _others_need(self, save: Call) -> bool:
        model = self.model
        if model.uses_module("torch.distributed.fsdp") or model.uses_module("deepspeed"):
            return True
        if any(load.function is save.function and load.order > save.order for load in model.calls_named("torch.load")):
            return True
        path = save.arg(1, "f")
        written = model.code_of(path) if path is not None else None
        if written is not None and any(
            # `shutil.copyfile(filename, best)` after the save: every rank reads the file
            c.order > save.order and c.statement is not save.statement
            and any(model.code_of(a.value) == written for a in c.args)
            for c in model.scope_calls(save.function)
        ):
            return True
        return any(
            c is not save and (c.name or "").startswith("torch.distributed.")
            for c in model.calls_in_statement(save.statement)
        )

    def _check_once_per_node(self, save: Call, path: cst.BaseExpression, who: WhoRuns) -> None:
        """A save "guarded" by the node index runs on every process of node 0; one guarded by the
        local rank runs once per node, which on a multi-node job is several writers of one path."""
        if who.guard is None:
            return
        check = f"`{self.model.code_of(who.guard.test)}` at line {self.line(who.guard.test)}"
        if who.runs is Runs.NODE0:
            self.report(
                save.node,
                f"torch.save under a check of the node index ({check}): that holds on every process of "
                f"node 0, not on one, so all of that node's processes write the same checkpoint file at once, "
                f"which can leave it truncated or corrupt. Test the global rank instead "
                f"(`if dist.get_rank() == 0:`).",
            )
            return
        if who.runs is not Runs.RANK0 or not ranks.guard_rank_kinds(self.model, who.guard) <= {"local"}:
            return
        evidence = launch.multinode_evidence(self.model)
        if ranks.names_the_node(self.model, path, save.order, save.function):
            return
        if evidence is not None:
            shown = f"line {self.line(evidence)}"
        else:
            # The script itself does not say; a launch file of the project that runs it may.
            verdict, launched = launch.launch_file_nodes(self.model)
            if verdict != launchfiles.MULTI_NODE or launched is None:
                return
            shown = f"{launched.where()} launches it on {launched.nodes} nodes"
        self.report(
            save.node,
            f"torch.save under a local-rank check ({check}) in a script that runs on several nodes "
            f"({shown}): it runs once per node, so every node writes the same path, and on "
            f"shared storage the writes collide and can leave the checkpoint truncated or corrupt. Test the "
            f"global rank (`if dist.get_rank() == 0:`), or put the node in the path if each node has its own disk.",
        )


    def check_project_helpers(self, setup_call: Call, what: str, check: str) -> None:
        """A helper of another project module that saves on whichever ranks call it, called here
        on every rank (the helper's own file cannot know its callers, so it is reported here)."""
        for call in self.model.calls:
            # Cheap tests first: linking reads and parses the other module.
            if call.name is not None and call.name.startswith("torch."):
                continue
            if who_runs(self.model, call).runs is not Runs.ALL:
                continue
            found = summaries.called_unguarded_save(self.model, call)
            if found is None:
                continue
            other, helper, save, path = found
            if path is not None:
                if summaries.mentions_rank(self.model, path, call.order, call.function):
                    continue
                if sharding.per_item_path(self.model, path, call.order, call.function):
                    continue
            written = call.dotted or helper.name
            self.report(
                call.node,
                f"{written}() runs torch.save ({other.shown_path} line {other.line_of(save.node)}) and is "
                f"called here on every rank of this distributed script ({what} at line "
                f"{self.line(setup_call.node)}): all processes write the same checkpoint file at once, which "
                f"can leave it truncated or corrupt. Call it only on the main process ({check}).",
            )


