"""DDP008 unguarded-checkpoint-save: `torch.save` in a distributed script runs on every rank."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint import vocab
from ddpdoctor.lint.facts import MAX_DEPTH, Call, Function, ModuleFacts, dotted_name, walk
from ddpdoctor.lint.rules._pending_analysis import multinode_evidence, node_index
from ddpdoctor.lint.rules.base import Rule

SAVE = "torch.save"
INIT = ("torch.distributed.init_process_group",)
DDP = "torch.nn.parallel.DistributedDataParallel"
IN_MEMORY = frozenset({"io.BytesIO", "io.StringIO"})
SPAWN = ("torch.multiprocessing.spawn", "torch.multiprocessing.start_processes")
# "Main process" predicates that hold once per node (Accelerate, HF Trainer, Lightning spell them so).
LOCAL_MAIN_PROCESS_NAMES = frozenset({"is_local_master", "is_local_main_process", "is_local_process_zero", "local_master"})
HOST_NAME_CALLS = frozenset({"socket.gethostname", "platform.node", "os.uname"})


def distributed_setup(facts: ModuleFacts) -> Optional[tuple[str, Optional[Call]]]:
    """What makes this a multi-process script: (description, the call) or None."""
    for call in facts.calls_named(*INIT):
        return "init_process_group", call
    for call in facts.calls_named(DDP):
        return "DistributedDataParallel", call
    for call in facts.calls:
        if call.name is not None and call.name.startswith("horovod."):
            return "Horovod", call
    return None


def mentions_rank(
    facts: ModuleFacts, expr: Optional[cst.CSTNode], order: int, function: Optional[Function], depth: int = 0
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
            if vocab.rank_kind(facts, node, order, function) is not None:  # type: ignore[arg-type]
                return True
            if not isinstance(node, cst.Call):
                # The path through variables and helper parameters, each value in its own scope.
                for value, v_order, v_function in facts.leaf_values(node, order, function):  # type: ignore[arg-type]
                    if value is not node and mentions_rank(facts, value, v_order, v_function, depth + 1):
                        return True
                continue
        stack.extend(child for child in node.children if not isinstance(child, cst.BaseParenthesizableWhitespace))
    return False


def spawn_targets(facts: ModuleFacts) -> set[str]:
    """Names of functions handed to `mp.spawn`: each process runs them, with no call site here."""
    names: set[str] = set()
    for call in facts.calls_named(*SPAWN):
        target = call.arg(0, "fn")
        name = dotted_name(target)
        if name is not None:
            names.add(name)
    return names


def instance_call_sites(facts: ModuleFacts, function: Function) -> list[Call]:
    """`trainer.fit()` where `trainer = Trainer(...)`: call sites of a method through an instance of
    its class built in this module (facts.call_sites only knows `self.fit()` / `Trainer.fit()`)."""
    if function.klass is None:
        return []
    sites: list[Call] = []
    for call in facts.method_calls(function.name):
        receiver = call.receiver
        if receiver is None or dotted_name(receiver) in ("self", "cls", function.klass):
            continue
        for origin in facts.origin_calls(receiver, call.order, call.function):
            if origin.dotted == function.klass:
                sites.append(call)
                break
    return sites


def reached_without_guard(
    facts: ModuleFacts, node: Call, spawned: set[str], depth: int = 0
) -> Optional[bool]:
    """Whether some path from the module's entry points reaches `node` with no rank guard on it.

    True: reached unguarded; False: every path is rank-guarded; None: undecidable (a helper that is
    never called in this module), in which case the rules stay silent."""
    if facts.rank_guard_kind(node) is not None:
        return False
    if any(_looks_like_rank_test(guard.test) for guard in node.ctx.guards):
        return None  # `if self.gpu_id == 0:` — an id we cannot trace to a rank: undecidable
    function = node.function
    if function is None:
        return True
    if function.name in spawned and function.parent is None:
        return True
    if depth > 4:
        return None
    sites = [s for s in facts.call_sites(function) + instance_call_sites(facts, function) if s.function is not function]
    if not sites:
        return None
    answers = {reached_without_guard(facts, site, spawned, depth + 1) for site in sites}
    if True in answers:
        return True
    if None in answers:
        return None
    return False


# Counters that are routinely compared with zero around a save (`if epoch % 10 == 0`, `if step == 0`).
_COUNTER_WORDS = ("epoch", "step", "iter", "batch", "idx", "count", "len", "num", "size")


def _looks_like_rank_test(test: cst.BaseExpression) -> bool:
    """`<name> == 0`, `<name> in [-1, 0]` and the like on a variable that `vocab` does not know as a
    rank (an `mp.spawn` index stored as `self.gpu_id`, say). Only the rules' silence depends on it."""
    stack: list[cst.CSTNode] = [test]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.BooleanOperation,)):
            stack.extend((node.left, node.right))
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            stack.append(node.expression)
        elif isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            left, right = node.left, node.comparisons[0].comparator
            if isinstance(left, cst.Integer):
                left, right = right, left
            name = dotted_name(left)
            if name is None or any(word in name.rsplit(".", 1)[-1].lower() for word in _COUNTER_WORDS):
                continue
            if isinstance(right, cst.Integer) and right.evaluated_value == 0:
                return True
            if isinstance(right, (cst.List, cst.Tuple, cst.Set)) and any(
                isinstance(e.value, cst.Integer) and e.value.evaluated_value == 0 for e in right.elements
            ):
                return True
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
    context_words = ("init_process_group", "DistributedDataParallel", "horovod")

    def check(self) -> None:
        saves = self.facts.calls_named(SAVE)
        if not saves:
            return
        setup = distributed_setup(self.facts)
        if setup is None:
            return
        what, setup_call = setup
        spawned = spawn_targets(self.facts)
        for save in saves:
            path = save.arg(1, "f")
            if path is None or mentions_rank(self.facts, path, save.order, save.function):
                continue  # a per-rank file (`ckpt_rank{rank}.pt`) is a deliberate sharded save
            if self.facts.origin_names(path, save.order, save.function) & IN_MEMORY:
                continue  # serialising into a buffer writes no file
            if reached_without_guard(self.facts, save, spawned) is not True:
                self._check_once_per_node(save, path)
                continue
            where = f" ({what} at line {self.line(setup_call.node)})" if setup_call is not None else ""
            function = save.function
            if function is not None:
                for site in self.facts.call_sites(function) + instance_call_sites(self.facts, function):
                    if site.function not in (None, function) and reached_without_guard(self.facts, site, spawned) is True:
                        where += f", reached through the call to {function.name}() at line {self.line(site.node)}"
                        break
            check = "`if hvd.rank() == 0:`" if what == "Horovod" else "`if dist.get_rank() == 0:` or a save_on_master helper"
            self.report(
                save.node,
                f"torch.save runs on every rank of this distributed script{where}: all processes "
                f"write the same checkpoint file at once, which can leave it truncated or corrupt. "
                f"Save only on the main process ({check}).",
            )

    def _check_once_per_node(self, save: Call, path: cst.BaseExpression) -> None:
        """A save "guarded" by the node index runs on every process of node 0; one guarded by the
        local rank runs once per node, which on a multi-node job is several writers of one path."""
        found = _per_node_guard(self.facts, save, 0)
        if found is None:
            return
        kind, test = found
        check = f"`{self.facts.code_of(test)}` at line {self.line(test)}"
        if kind == "node":
            self.report(
                save.node,
                f"torch.save under a check of the node index ({check}): that holds on every process of "
                f"node 0, not on one, so all of that node's processes write the same checkpoint file at once, "
                f"which can leave it truncated or corrupt. Test the global rank instead "
                f"(`if dist.get_rank() == 0:`).",
            )
            return
        evidence = multinode_evidence(self.facts)
        if evidence is None or _names_the_node(self.facts, path, save):
            return
        self.report(
            save.node,
            f"torch.save under a local-rank check ({check}) in a script that runs on several nodes "
            f"(line {self.line(evidence)}): it runs once per node, so every node writes the same path, and on "
            f"shared storage the writes collide and can leave the checkpoint truncated or corrupt. Test the "
            f"global rank (`if dist.get_rank() == 0:`), or put the node in the path if each node has its own disk.",
        )


def _per_node_guard(facts: ModuleFacts, item: Call, depth: int) -> Optional[tuple[str, cst.BaseExpression]]:
    """("node" | "local", the test) when the condition that restricts `item` to "rank 0" tests the
    node index or the local rank; None when it tests the global rank or nothing decides. Helpers
    are followed to their call sites, which must all agree."""
    for guard in reversed(item.ctx.guards):
        if not guard.negated and _tests_node_zero(facts, guard.test, guard.order, guard.function):
            return "node", guard.test
        if vocab.classify_rank_test(facts, guard.test, guard.order, guard.function, guard.negated) == "rank0":
            kinds = _tested_rank_kinds(facts, guard.test, guard.order, guard.function, 0)
            if kinds and kinds <= {"local", "spawn"}:
                return "local", guard.test
            return None
    function = item.function
    if function is None or depth > 3:
        return None
    sites = [s for s in facts.call_sites(function) if s.function is not function]
    answers = {_per_node_guard(facts, site, depth + 1) for site in sites}
    if len(answers) == 1:
        return answers.pop()
    return None


def _tests_node_zero(facts: ModuleFacts, test: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    """`args.nr == 0`, `node_rank == 0 and step % k == 0`: the node index compared with zero."""
    if isinstance(test, cst.BooleanOperation):
        return isinstance(test.operator, cst.And) and (
            _tests_node_zero(facts, test.left, order, function) or _tests_node_zero(facts, test.right, order, function)
        )
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    left, right = test.left, target.comparator
    if isinstance(left, cst.Integer):
        left, right = right, left
    zero = (isinstance(right, cst.Integer) and right.evaluated_value == 0 and isinstance(target.operator, cst.Equal)) or (
        isinstance(target.operator, cst.In) and isinstance(right, (cst.List, cst.Tuple))
        and [e.value.evaluated_value for e in right.elements if isinstance(e.value, cst.Integer)] == [0]
    )
    return zero and node_index(facts, left, order, function)


def _tested_rank_kinds(
    facts: ModuleFacts, test: cst.BaseExpression, order: int, function: Optional[Function], depth: int
) -> set[str]:
    """The kinds of rank a rank-0 condition compares ("global", "local", "spawn"), leaving out the
    single-process operands (`local_rank == -1`, `not args.distributed`)."""
    if depth > MAX_DEPTH:
        return {"unknown"}
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _tested_rank_kinds(facts, test.expression, order, function, depth + 1)
    if isinstance(test, cst.BooleanOperation):
        out: set[str] = set()
        for side in (test.left, test.right):
            if vocab.is_not_distributed_test(facts, side) or vocab.is_not_distributed_test(facts, side, True):
                continue
            out |= _tested_rank_kinds(facts, side, order, function, depth + 1)
        return out
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        left = test.left if not isinstance(test.left, cst.Integer) else test.comparisons[0].comparator
        if isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Modulo):
            return {"local"}  # `args.rank % ngpus_per_node == 0`: the first process of each node
        kind = vocab.rank_kind(facts, left, order, function)
        return {kind} if kind is not None else set()
    name = dotted_name(test.func if isinstance(test, cst.Call) else test)
    if name is not None and name.rsplit(".", 1)[-1] in LOCAL_MAIN_PROCESS_NAMES:
        return {"local"}
    if vocab.is_main_process_predicate(facts, test, order, function):
        return {"global"}
    if name is not None:
        out = set()
        for value in facts.reaching_values(test, order, function):
            if value is not test and isinstance(value, (cst.Comparison, cst.BooleanOperation, cst.UnaryOperation)):
                out |= _tested_rank_kinds(facts, value, order, function, depth + 1)
        return out
    return {"unknown"}


def _names_the_node(facts: ModuleFacts, path: cst.BaseExpression, save: Call) -> bool:
    """The path holds the node index or the host name: deliberate per-node copies."""
    for node in walk(path):
        if isinstance(node, (cst.Name, cst.Attribute)) and node_index(facts, node, save.order, save.function):  # type: ignore[arg-type]
            return True
        if isinstance(node, cst.Call) and (facts.qualify(node.func) or "") in HOST_NAME_CALLS:
            return True
    if isinstance(path, (cst.Name, cst.Attribute)):
        for value, v_order, v_function in facts.leaf_values(path, save.order, save.function):
            if value is not path and any(
                isinstance(n, (cst.Name, cst.Attribute)) and node_index(facts, n, v_order, v_function)  # type: ignore[arg-type]
                for n in walk(value)
            ):
                return True
    return False
