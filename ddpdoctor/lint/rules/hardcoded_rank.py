"""DDP003 hardcoded-rank: a literal rank or GPU index in a script that runs as several processes."""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst

from ddpdoctor.lint import vocab
from ddpdoctor.lint.facts import Assignment, Call, Function, ModuleFacts
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
    trigger_words = ("init_process_group", "DistributedDataParallel", "horovod", "spawn", "start_processes")

    def check(self) -> None:
        evidence = vocab.multiprocess_evidence(self.facts)
        if evidence is None:
            return
        self.check_init_ranks()
        if vocab.visible_devices_writes(self.facts):
            # Each process is shown only its own GPU, which it then finds at index 0.
            return
        self.check_devices(evidence)

    # ---- init_process_group(rank=0)

    def check_init_ranks(self) -> None:
        facts = self.facts
        for call in facts.calls_named(vocab.INIT_PROCESS_GROUP):
            rank_expr = call.arg(4, "rank")
            if rank_expr is None or self.runs_on_one_process(call) or facts.rank_guard_kind(call) == "rank0":
                continue  # `if is_master: init_process_group(..., rank=0)` is right
            backend = facts.const_value(call.arg(0, "backend"), call.order, call.function)
            if isinstance(backend, str) and backend.lower() == "fake":
                continue  # torch's FakeProcessGroup: one process simulates the whole world by design
            ranks: set[int] = set()
            for value, _, _ in facts.leaf_values(rank_expr, call.order, call.function):
                if not isinstance(value, cst.Integer):
                    break
                ranks.add(int(value.evaluated_value))
            else:
                if len(ranks) != 1:
                    continue
                rank = ranks.pop()
                world = self.world_size_description(call)
                if world is None:
                    continue
                self.report(
                    rank_expr,
                    f"init_process_group is given the literal rank={rank} while the world size {world}: "
                    f"every process claims rank {rank}, so the rendezvous hangs or fails. Pass each "
                    f"process's own rank (int(os.environ[\"RANK\"]) under torchrun, or the mp.spawn index).",
                )

    def world_size_description(self, call: Call) -> Optional[str]:
        """How the message describes a world size that is not 1, or None when it may be 1."""
        facts = self.facts
        world = call.arg(3, "world_size")
        if world is None:
            return "comes from the launcher (WORLD_SIZE)"
        value = facts.const_value(world, call.order, call.function)
        if isinstance(value, int) and not isinstance(value, bool):
            if value == -1:
                return "comes from the launcher (WORLD_SIZE)"
            return f"is {value}" if value > 1 else None
        if facts.world_size is not None and facts.world_size > 1:
            return f"is {facts.world_size}"
        leaves = facts.leaf_values(world, call.order, call.function)
        for leaf, _, _ in leaves:
            key = vocab.env_key(facts, leaf)
            if key in ENV_WORLD_KEYS:
                continue
            if isinstance(leaf, cst.Call) and facts.qualify(leaf.func) in WORLD_SIZE_CALLS:
                continue
            return None
        return f"is {facts.code_of(world)}" if leaves else None

    # ---- set_device(0), device_ids=[0], .to("cuda:0"), torch.device("cuda", 0)

    def check_devices(self, evidence: Call) -> None:
        facts = self.facts
        reported: set[int] = set()
        for argument in vocab.device_arguments(facts):
            call = argument.call
            indices = vocab.device_indices(facts, argument.expr, call.order, call.function, argument.ints)
            literals = [i for i in indices if i.kind == "literal"]
            if not literals or any(id(i.node) in reported for i in literals):
                continue
            if any(i.kind != "literal" and not _names_no_gpu(i.node) for i in indices):
                continue  # some value is computed (or unknown): the literal may be the single-GPU case
            if self.runs_on_one_process(call) or facts.rank_guard_kind(call) == "rank0":
                continue
            reported.update(id(i.node) for i in literals)
            literal = literals[0]
            shown = facts.code_of(literal.node)
            origin = ""
            if not _contains(facts, argument.expr, literal.node):
                origin = f" (set at line {self.line(literal.node)})"
            self.report(
                argument.expr,
                f"{argument.where} is given the hard-coded device {shown}{origin} in a multi-process script "
                f"({_describe(evidence)} at line {self.line(evidence.node)}): every process uses GPU "
                f"{literal.index} instead of its own. Derive the device from the local rank "
                f"(int(os.environ[\"LOCAL_RANK\"]), hvd.local_rank() or the mp.spawn index).",
            )

    # ---- context

    def runs_on_one_process(self, call: Union[Call, Assignment], depth: int = 0) -> bool:
        """True when the statement only runs in a single-process (non-distributed) run: under
        `if not args.distributed:`, in the `else` of `if args.distributed:`, or in a helper that is
        only called there."""
        for guard in call.ctx.guards:
            if _single_process_test(self.facts, guard.test, guard.negated):
                return True
        function: Optional[Function] = call.function
        if function is not None and depth < 3:
            sites = self.facts.call_sites(function)
            if sites and all(self.runs_on_one_process(site, depth + 1) for site in sites):
                return True
        return False


def _single_process_test(facts: ModuleFacts, test: cst.BaseExpression, negated: bool) -> bool:
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _single_process_test(facts, test.expression, not negated)
    if isinstance(test, cst.BooleanOperation):
        # `a and b` holds only if both do; `not (a or b)` only if neither does.
        if isinstance(test.operator, cst.And) and not negated:
            return any(_single_process_test(facts, side, False) for side in (test.left, test.right))
        if isinstance(test.operator, cst.Or) and negated:
            return any(_single_process_test(facts, side, True) for side in (test.left, test.right))
        return False
    if negated and isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        # The `else` of `if world_size > 1:` / `if args.local_rank != -1:` is the single-process side.
        target = test.comparisons[0]
        flipped = _NEGATED_OPERATORS.get(type(target.operator))
        if flipped is not None:
            inverse = test.with_changes(comparisons=[target.with_changes(operator=flipped())])
            return vocab.is_not_distributed_test(facts, inverse, False)
        return False
    return vocab.is_not_distributed_test(facts, test, negated)


_NEGATED_OPERATORS: dict[type, type] = {
    cst.GreaterThan: cst.LessThanEqual,
    cst.GreaterThanEqual: cst.LessThan,
    cst.NotEqual: cst.Equal,
}


def _names_no_gpu(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.SimpleString) and str(node.evaluated_value) in NON_CUDA_DEVICES


def _contains(facts: ModuleFacts, outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
    a, b = facts.position(outer), facts.position(inner)
    return (a.start.line, a.start.column) <= (b.start.line, b.start.column) and (
        b.end.line, b.end.column) <= (a.end.line, a.end.column)


def _describe(call: Call) -> str:
    name = call.name or ""
    if name == vocab.INIT_PROCESS_GROUP:
        return "init_process_group"
    if name == vocab.DDP_CLASS:
        return "DistributedDataParallel"
    if name in vocab.HOROVOD_INIT_CALLS:
        return "hvd.init()"
    return "mp.spawn"
