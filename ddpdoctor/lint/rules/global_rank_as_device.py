"""DDP004 global-rank-as-device: the global rank used as a CUDA device index."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Fix
from ddpdoctor.lint.analysis import devices, launch, launchfiles, ranks, summaries
from ddpdoctor.lint.rules.base import Rule

class GlobalRankAsDevice(Rule):
    """
    Valid:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        model = DDP(model.cuda(), device_ids=[local_rank])
    Invalid:
        rank = int(os.environ["RANK"])
        torch.cuda.set_device(rank)
        model = DDP(model.cuda(), device_ids=[rank])
    """

    code = "DDP004"
    checks_test_suites = False
    # Every global-rank source the vocabulary knows spells one of these.
    # "rank, ": a project helper may hand the rank over (`rank, world_size = setup()`).
    # The launcher's variables are read by their quoted names (ranks.GLOBAL_RANK_ENV); a bare "RANK"
    # would match every `..._RANK` constant (CUDA attribute tables are full of them).
    trigger_words = (
        "get_rank", "rank()", "process_index", "global_rank", "world_rank", "rank, ",
        *(quote + name + quote for name in sorted(ranks.GLOBAL_RANK_ENV) for quote in "\"'"),
    )

    def check(self) -> None:
        model = self.model
        if launch.single_node_rendezvous(model):
            return  # a loopback rendezvous: one node, where the global rank is the local rank
        reported: set[int] = set()
        for argument in devices.device_arguments(model):
            call = argument.call
            if launch.dead_in_script(model, call.function):
                continue  # a helper the script no longer calls
            if ranks.runs_on_global_rank0_only(model, call):
                continue  # global rank 0 is local rank 0 of the first node: the index is its own GPU
            indices = devices.device_indices(model, argument.expr, call.order, call.function, argument.ints)
            computed = [i for i in indices if i.kind == "expr"]
            if not computed:
                continue
            # Every use of the rank itself as a device is reported (`set_device(rank)`,
            # `device_ids=[rank]`, each `.to(rank)`): each must change. A later use of a device
            # object built from it and already reported (`.to(device)`, `set_device(self.device)`)
            # is fixed where the object is built, and is not reported again.
            leaves = {id(value) for value, _, _ in model.leaf_values(argument.expr, call.order, call.function)}
            direct = any(id(i.node) in leaves for i in computed)
            if not direct and any(id(i.node) in reported for i in computed):
                continue
            # Every computed value must trace to the global rank: a value that may also be the
            # local rank, the spawn index or something unknown is not reported.
            kinds = {ranks.rank_source(model, i.node, i.order, i.function) for i in computed}
            if kinds != {"global"}:
                continue
            # Last, as it reads the project's launch files: a job every launch of which stays on
            # one node has global ranks that are local ranks.
            nodes, launched = launch.launch_file_nodes(model)
            if nodes == launchfiles.SINGLE_NODE:
                continue
            spans = f" ({launched.where()} launches it on {launched.nodes} nodes)" if launched is not None else ""
            reported.update(id(i.node) for i in computed)
            source = self.origin(computed[0])
            shown = model.code_of(source)
            if len(shown) > 40:
                shown = shown[:37] + "..."
            origin = ""
            if self.line(source) != self.line(argument.expr):
                origin = f" (line {self.line(source)})"
            self.report(
                argument.expr,
                f"{argument.where} uses the global rank `{shown}`{origin} as a CUDA device index: it only "
                f"matches the GPU on the first node; on the next node{spans} ranks start past its GPU count "
                f"(invalid device ordinal). Use the local rank: int(os.environ[\"LOCAL_RANK\"]), "
                f"hvd.local_rank() or rank % torch.cuda.device_count().",
                fix=self.fix(argument),
            )

    def fix(self, argument: devices.DeviceArgument) -> Optional[Fix]:
        """Replace the global rank written in the argument (`set_device(rank)`, `f"cuda:{rank}"`)
        with the local rank the script holds there; a device built elsewhere is not touched here
        (that variable may serve other purposes), nor is anything where no local rank is certain."""
        call = argument.call
        written = devices.written_index(self.model, argument)
        if written is None or ranks.rank_source(self.model, written, call.order, call.function) != "global":
            return None
        local_rank = ranks.local_rank_expression(self.model, call.order, call.ctx)
        text = devices.index_replacement(written, local_rank) if local_rank is not None else None
        if local_rank is None or text is None:
            return None
        # Certain only when nothing between its binding and here may rebind what it reads
        # (`adopt_slot(args)` in another module rewriting `args.gpu`): else a suggestion.
        certain = summaries.rewritten_before(self.model, local_rank, call.order, call.function) is None
        return Fix(f"use the local rank: `{text}`", applicable=certain, edits=(self.replace(written, text),))

    def origin(self, index: devices.DeviceIndex) -> cst.BaseExpression:
        """Where the global rank is read (`int(os.environ["RANK"])`, `dist.get_rank()`), for the
        message; the index expression itself when that is already the source."""
        model = self.model
        for value, order, function in model.leaf_values(index.node, index.order, index.function):
            if value is not index.node and ranks.rank_source(model, value, order, function) == "global":
                return value
        return index.node
