"""DDP008 unguarded-checkpoint-save: `torch.save` in a distributed script runs on every rank."""

from __future__ import annotations

from ddpdoctor.lint.analysis import Call, Runs, launch, summaries, who_runs
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
            if self.model.origin_names(path, save.order, save.function) & summaries.IN_MEMORY:
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
            self.report(
                save.node,
                f"torch.save runs on every rank of this distributed script{where}: all processes "
                f"write the same checkpoint file at once, which can leave it truncated or corrupt. "
                f"Save only on the main process ({check}).",
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
            linked = self.model.linked_function(call)
            if linked is None:
                continue
            other, helper = linked
            found = summaries.unguarded_save(other, helper)
            if found is None:
                continue
            save, path_param = found
            if path_param is not None:
                path = summaries.argument_for(call, helper, path_param)
                if path is None or summaries.mentions_rank(self.model, path, call.order, call.function):
                    continue
            written = call.dotted or helper.name
            self.report(
                call.node,
                f"{written}() runs torch.save ({other.shown_path} line {other.line_of(save.node)}) and is "
                f"called here on every rank of this distributed script ({what} at line "
                f"{self.line(setup_call.node)}): all processes write the same checkpoint file at once, which "
                f"can leave it truncated or corrupt. Call it only on the main process ({check}).",
            )

