"""DDP009 collective-under-rank-guard: a collective that only some ranks reach hangs the job."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis import Call, ModuleModel, Runs, WhoRuns, collectives, ranks, summaries, who_runs
from ddpdoctor.lint.rules.base import Rule

COMPLEMENT = {Runs.RANK0: Runs.NONZERO, Runs.NONZERO: Runs.RANK0}
DESCRIBE = {Runs.RANK0: "the main process", Runs.NONZERO: "the non-main ranks", Runs.SUBSET: "some of the ranks"}

# Where torch.distributed collectives take `group` positionally (`dist.all_reduce(t, op, group)`).
GROUP_POSITION = {
    "barrier": 0, "monitored_barrier": 0, "all_reduce": 2, "broadcast": 2, "all_gather": 2,
    "all_gather_into_tensor": 2, "reduce": 3, "gather": 3, "scatter": 3, "reduce_scatter": 3,
    "reduce_scatter_tensor": 3, "all_to_all": 2, "all_to_all_single": 4, "all_gather_object": 2,
    "gather_object": 3, "scatter_object_list": 3, "broadcast_object_list": 2,
}


def on_subgroup(model: ModuleModel, call: Call) -> bool:
    """A collective over an explicit process group / process set: rank-guarding it to the group's
    members is how subgroups are used, so such calls are left alone."""
    if call.name is not None and call.name.rpartition(".")[2] in collectives.GROUP_CREATION:
        return False
    attr = (call.name or "").rpartition(".")[2]
    position = GROUP_POSITION.get(attr) if (call.name or "").startswith("torch.distributed.") else None
    for keyword in ("group", "process_group", "process_set"):
        value = call.arg(position if keyword == "group" else None, keyword)
        if value is None:
            continue
        if isinstance(value, cst.Name) and value.value == "None":
            continue
        if (model.qualify(value) or "") in ("torch.distributed.group.WORLD", "horovod.torch.global_process_set"):
            continue
        return True
    return False


def _same_collective(name: str, other: str) -> bool:
    """Two calls that complete each other. Horovod's `hvd.join()` takes part in whatever collectives
    the other ranks still run (the uneven-data protocol: `if out_of_data: hvd.join() else:
    hvd.allreduce(...)`), so it pairs with any Horovod collective."""
    if name == other:
        return True
    module, _, attr = name.rpartition(".")
    other_module, _, other_attr = other.rpartition(".")
    horovod = collectives.HOROVOD_MODULES
    return module in horovod and other_module in horovod and "join" in (attr, other_attr)


class CollectiveUnderRankGuard(Rule):
    """
    Valid:
        if dist.get_rank() == 0:
            print(f"epoch {epoch} done")
        dist.barrier()
    Invalid:
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), "ckpt.pt")
            dist.barrier()
    """

    code = "DDP009"
    # Some collective's name, in a file that uses torch.distributed or Horovod at all.
    trigger_words = (
        "barrier", "reduce", "broadcast", "gather", "scatter", "all_to_all", "alltoall", "new_group",
        "new_subgroups", "join(",
        # or a project helper that reaches one, called under a rank check
        "rank", "is_main_process", "is_master",
    )
    context_words = ("distributed", "horovod")

    def check(self) -> None:
        guarded: list[tuple[Call, str, WhoRuns]] = []
        for call in self.model.calls:
            name = collectives.collective_name(call)
            if name is None or on_subgroup(self.model, call):
                continue
            runs = who_runs(self.model, call)
            if runs.some_ranks and not ranks.group_created_under_guard(self.model, runs, call):
                guarded.append((call, name, runs))
        reached = self._through_project_helpers()
        guarded.extend((call, name, runs) for call, name, runs, _ in reached)
        for call, name, runs, (other, inner) in reached:
            if self._matched(call, name, runs.runs, guarded):
                continue
            guard_line = self.line(runs.guard.test) if runs.guard is not None else None
            where = f" (guarded at line {guard_line})" if guard_line is not None else ""
            self.report(
                call.node,
                f"{call.dotted}() reaches the collective {name} ({other.shown_path} line "
                f"{other.line_of(inner.node)}), which every rank must call, but it is only called by "
                f"{DESCRIBE[runs.runs]}{where}: the other ranks never enter it and the job hangs until the "
                f"timeout. Call it outside the rank-specific branch.",
            )
        for call, name, runs in guarded:
            if any(call is linked for linked, _, _, _ in reached):
                continue
            if self._matched(call, name, runs.runs, guarded):
                continue
            guard_line = self.line(runs.guard.test) if runs.guard is not None else None
            via = ""
            if runs.via is not None and call.function is not None:
                via = f", around the call to {call.function.name}() at line {self.line(runs.via.node)}"
            written = f"{call.dotted or name}()"
            if call.dotted is not None and not name.endswith("." + call.dotted.rpartition(".")[2]):
                written += f" ({name})"  # an alias: say what it is
            advice = "Call it outside the rank-specific branch."
            if name.rpartition(".")[2] in collectives.GROUP_CREATION:
                advice = "Every rank must create the group, members or not: call it outside the rank-specific branch."
            where = f" (guarded at line {guard_line}{via})" if guard_line is not None else ""
            self.report(
                call.node,
                f"{written} is a collective that every rank must call, but it is only reached by {DESCRIBE[runs.runs]}"
                f"{where}: the other ranks never enter it and the job hangs until the timeout. "
                f"{advice}",
            )

    def _through_project_helpers(self) -> list[tuple[Call, str, WhoRuns, tuple[ModuleModel, Call]]]:
        """Calls, on some ranks only, of another project module's functions that reach a
        collective on whichever ranks call them: (the call, the collective, who runs the call,
        (that module, the collective call))."""
        out: list[tuple[Call, str, WhoRuns, tuple[ModuleModel, Call]]] = []
        for call in self.model.calls:
            if (call.name or "").startswith(("torch.", "horovod.")) or not self.model.may_link(call):
                continue
            runs = who_runs(self.model, call)
            if not runs.some_ranks or ranks.group_created_under_guard(self.model, runs, call):
                continue  # cheap test first: linking reads and parses the other module
            for other, inner, name in summaries.called_collectives(self.model, call):
                if not on_subgroup(other, inner):
                    out.append((call, name, runs, (other, inner)))
                    break
        return out

    def _matched(self, call: Call, name: str, kind: Runs, guarded: list[tuple[Call, str, WhoRuns]]) -> bool:
        """The same collective reached on the other side of a complementary guard: the torchvision /
        Hugging Face "let rank 0 download first" pairing (`if rank != 0: barrier()` ... `if rank == 0:
        barrier()`), or `if rank == 0: broadcast(x) else: broadcast(y)`. Every rank then calls it."""
        for other, other_name, other_runs in guarded:
            other_kind = other_runs.runs
            if other is call or not _same_collective(name, other_name):
                continue
            if Runs.SUBSET in (kind, other_kind):
                # `if rank == 1: ... else: ...` and similar: one side each; undecidable, stay silent.
                return True
            if COMPLEMENT[kind] == other_kind:
                return True
        return False
