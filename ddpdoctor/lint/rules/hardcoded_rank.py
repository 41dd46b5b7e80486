"""DDP003 hardcoded-rank: a literal rank or GPU index in a script that runs as several processes."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Fix
from ddpdoctor.lint.analysis import devices, launch, launcher_env, ranks, summaries
from ddpdoctor.lint.analysis import Call, Context, ModuleModel, Runs, reaches_several_processes, who_runs
from ddpdoctor.lint.rules.base import Rule

# Device strings that name no GPU: a literal GPU index on one arm of `"cuda:0" if ok else "cpu"`
# is still hard-coded for every process that has a GPU.
NON_CUDA_DEVICES = frozenset({"cpu", "mps", "meta", "xla"})
ENV_WORLD_KEYS = frozenset({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
WORLD_SIZE_CALLS = frozenset(
    {"torch.distributed.get_world_size", "horovod.torch.size", "torch.cuda.device_count",
     "torch.accelerator.device_count"}
)


class HardcodedRank(Rule):
    """
    Valid:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        model = DDP(model.cuda(), device_ids=[local_rank])
    Invalid:
        dist.init_process_group("nccl")
        torch.cuda.set_device(0)
        model = DDP(model.to("cuda:0"), device_ids=[0])
    """

    code = "DDP003"
    checks_test_suites = False
    trigger_words = launch.LAUNCH_WORDS

    def check(self) -> None:
        evidence = launch.multiprocess_evidence(self.model)
        if evidence is None:
            return
        self.check_init_ranks()
        self.check_init_world_size()
        if devices.visible_devices_writes(self.model) or devices.visible_devices_set_by_project_helper(self.model):
            # Each process is shown only its own GPU, which it then finds at index 0.
            return
        self.check_devices(evidence)

    # ---- init_process_group(rank=0)

    def check_init_ranks(self) -> None:
        model = self.model
        for call in model.calls_named(launch.INIT_PROCESS_GROUP):
            if launch.is_fake_backend(model, call):
                continue  # torch's FakeProcessGroup: one process simulates the whole world by design
            rank_expr = call.arg(4, "rank")
            if rank_expr is None or who_runs(model, call).runs in (Runs.RANK0, Runs.SINGLE):
                continue  # `if is_master: init_process_group(..., rank=0)` is right
            literals: set[int] = set()
            for route in model.routes(rank_expr, call.order, call.function):
                if not reaches_several_processes(model, route, call):
                    continue  # `rank=0` passed only on the single-process path
                if not isinstance(route.value, cst.Integer):
                    break
                literals.add(int(route.value.evaluated_value))
            else:
                if len(literals) != 1:
                    continue
                rank = literals.pop()
                world = self.world_size_description(call)
                if world is None:
                    continue
                written = call.written_arg(4, "rank") is not None
                self.report(
                    rank_expr if written else call.node,
                    f"init_process_group is given the literal rank={rank} while the world size {world}: "
                    f"every process claims rank {rank}, so the rendezvous hangs or fails. Pass each "
                    f"process's own rank (int(os.environ[\"RANK\"]) under torchrun, or the mp.spawn index).",
                )

    def check_init_world_size(self) -> None:
        """`init_process_group(..., world_size=4)` in a script whose processes a launcher starts
        (it reads RANK / LOCAL_RANK / SLURM_PROCID from the environment): the launcher's WORLD_SIZE
        is the truth, and any other process count hangs at the rendezvous."""
        read = None
        for call in self.model.calls_named(launch.INIT_PROCESS_GROUP):
            if launch.is_fake_backend(self.model, call) or who_runs(self.model, call).runs in (Runs.RANK0, Runs.SINGLE):
                continue
            found = launcher_env.literal_world_size(self.model, call)
            if found is None:
                continue
            read = read or launcher_env.launcher_rank_read(self.model)
            if read is None:
                return
            size, literal = found
            key, node = read
            written = call.written_arg(3, "world_size")
            at = written if written is not None else call.node
            where = "" if written is literal else f" (set at line {self.line(literal)})"
            self.report(
                at,
                f"init_process_group is given the literal world_size={size}{where}, but the processes are started by a "
                f"launcher (this script reads {key} from the environment at line {self.line(node)}), which sets "
                f"WORLD_SIZE: launched with any other process count, the rendezvous waits for ranks that never "
                f"come (or rejects a rank >= {size}). Leave world_size out (init_method=\"env://\" reads "
                f"WORLD_SIZE) or pass int(os.environ[\"WORLD_SIZE\"]).",
            )

    def world_size_description(self, call: Call) -> Optional[str]:
        """How the message describes a world size that is not 1, or None when it may be 1."""
        model = self.model
        world = call.arg(3, "world_size")
        if world is None:
            return "comes from the launcher (WORLD_SIZE)"
        value = model.const_value(world, call.order, call.function)
        if isinstance(value, int) and not isinstance(value, bool):
            if value == -1:
                return "comes from the launcher (WORLD_SIZE)"
            return f"is {value}" if value > 1 else None
        if model.world_size is not None and model.world_size > 1:
            return f"is {model.world_size}"
        leaves = model.leaf_values(world, call.order, call.function)
        for leaf, _, _ in leaves:
            key = launch.env_key(model, leaf)
            if key in ENV_WORLD_KEYS:
                continue
            if isinstance(leaf, cst.Call) and model.qualify(leaf.func) in WORLD_SIZE_CALLS:
                continue
            return None
        return f"is {model.code_of(world)}" if leaves else None

    # ---- set_device(0), device_ids=[0], .to("cuda:0"), torch.device("cuda", 0)

    def check_devices(self, evidence: Call) -> None:
        model = self.model
        # One report per hard-coded literal: `device = "cuda:0"` used by five `.to(device)` calls is
        # one fix, at the literal (the message names its line). Literals written at each use are
        # each their own fix, and each is reported.
        reported: set[int] = set()
        for argument in devices.device_arguments(model):
            call = argument.call
            indices = devices.device_indices(model, argument.expr, call.order, call.function, argument.ints)
            # Only the values that reach this call on a path where several processes run it: `gpu = 0`
            # in the single-process `else:` (or a call site under rank 0) is not a multi-process bug.
            # `main(0, args)` in the `else:` of `if args.nodes > 1:` never reaches a `set_device(gpu)`
            # that `main` runs only under `if args.nodes > 1:` either.
            live = [i for i in indices if reaches_several_processes(model, i.via, call)]
            # GPU 0 under `if torch.cuda.device_count() == 1:` is the only device: sharing it is the point.
            live = [i for i in live if not devices.names_the_only_gpu(model, i, call)]
            literals = [i for i in live if i.kind == "literal"]
            if not literals or any(id(i.node) in reported for i in literals):
                continue
            if any(i.kind != "literal" and not _names_no_gpu(i.node) for i in live):
                continue  # some value is computed (or unknown): the literal may be the single-GPU case
            reported.update(id(i.node) for i in literals)
            literal = literals[0]
            shown = model.code_of(literal.node)
            origin = ""
            if not _contains(model, argument.expr, literal.node):
                origin = f" (set at line {self.line(literal.node)})"
            self.report(
                argument.expr,
                f"{argument.where} is given the hard-coded device {shown}{origin} in a multi-process script "
                f"({launch.describe(evidence)} at line {self.line(evidence.node)}): every process uses GPU "
                f"{literal.index} instead of its own. Derive the device from the local rank "
                f"(int(os.environ[\"LOCAL_RANK\"]), hvd.local_rank() or the mp.spawn index).",
                fix=self.fix(argument, literals),
            )

    def fix(self, argument: devices.DeviceArgument, literals: list[devices.DeviceIndex]) -> Optional[Fix]:
        """Replace the one hard-coded index with the local rank the script holds where the literal
        is written: in the argument itself (`set_device(0)`, `.to("cuda:0")`), or as the whole value
        of an assignment (`device = "cuda:0"`). No fix where no local rank is certain there."""
        if len(literals) != 1:
            return None
        node = literals[0].node
        where: Optional[tuple[int, Context]] = None
        if devices.written_index(self.model, argument) is node or argument.expr is node:
            where = (argument.call.order, argument.call.ctx)
        elif isinstance(node, cst.SimpleString):
            for assignment in self.model.assignments:
                if assignment.value is node and assignment.kind == "assign":
                    where = (assignment.order, assignment.ctx)
        if where is None:
            return None
        order, ctx = where
        local_rank = ranks.local_rank_expression(self.model, order, ctx)
        text = devices.index_replacement(node, local_rank) if local_rank is not None else None
        if local_rank is None or text is None:
            return None
        # Certain only when nothing between its binding and here may rebind what it reads
        # (`adopt_slot(args)` in another module rewriting `args.gpu`): else a suggestion.
        certain = summaries.rewritten_before(self.model, local_rank, order, ctx.function) is None
        return Fix(f"use the local rank: `{text}`", applicable=certain, edits=(self.replace(node, text),))


def _names_no_gpu(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.SimpleString) and str(node.evaluated_value) in NON_CUDA_DEVICES


def _contains(model: ModuleModel, outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
    a, b = model.position(outer), model.position(inner)
    return (a.start.line, a.start.column) <= (b.start.line, b.start.column) and (
        b.end.line, b.end.column) <= (a.end.line, a.end.column)
