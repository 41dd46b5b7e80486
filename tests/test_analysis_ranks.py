"""The "who runs this" service on small snippets: each branch kind and each single-process idiom,
asked directly rather than through a rule. The statement asked about is the call `target()`."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import Runs, build_analysis, ranks, route_runs, who_runs
from ddpdoctor.lint.analysis.ranks import group_created_under_guard

PRELUDE = """\
import os
import sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
"""


def runs(source: str) -> Runs:
    model = build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)))
    targets = [c for c in model.calls if c.dotted == "target"]
    assert len(targets) == 1, "the snippet must call target() exactly once"
    return who_runs(model, targets[0]).runs


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("target()\n", Runs.ALL),
        ("if dist.get_rank() == 0:\n    target()\n", Runs.RANK0),
        ("if dist.get_rank() != 0:\n    target()\n", Runs.NONZERO),
        ("if dist.get_rank() == 0:\n    pass\nelse:\n    target()\n", Runs.NONZERO),
        ("if dist.get_rank() == 2:\n    target()\n", Runs.SUBSET),
        # elif: the second test, under the negation of the first
        ("rank = dist.get_rank()\nif rank == 1:\n    pass\nelif rank == 0:\n    target()\n", Runs.RANK0),
        # the branch of an unrelated test decides nothing
        ("if torch.cuda.is_available():\n    target()\n", Runs.ALL),
        ("for epoch in range(3):\n    if epoch == 0:\n        target()\n", Runs.ALL),
        # a rank held in a local variable whose name says nothing, tested with another condition
        ("def main(verbose):\n    me = dist.get_rank()\n    if me == 0 and verbose:\n        target()\nmain(True)\n",
         Runs.RANK0),
        # get_global_rank(group, r) is this process's rank only when r is its own group rank; with a
        # constant it names one member of the group, the same on every rank
        ("group = dist.new_group([0, 1])\nif dist.get_global_rank(group, 0) == 0:\n    target()\n", Runs.ALL),
        ("group = dist.new_group([0, 1])\nif dist.get_global_rank(group, dist.get_rank(group)) == 0:\n"
         "    target()\n", Runs.RANK0),
        ("group = dist.new_group([0, 1])\nme = dist.get_rank(group)\n"
         "if dist.get_global_rank(group=group, group_rank=me) == 0:\n    target()\n", Runs.RANK0),
        # the project's own helper of that name answers for this process
        ("def get_global_rank():\n    return int(os.environ['RANK'])\nif get_global_rank() == 0:\n    target()\n",
         Runs.RANK0),
    ],
)
def test_branches(source: str, expected: Runs) -> None:
    assert runs(source) is expected


@pytest.mark.parametrize(
    "exit_statement",
    ["return", "raise SystemExit(0)", "sys.exit(0)", "exit(0)", "quit()", "os._exit(0)"],
)
def test_early_exit_guards_the_rest_of_the_block(exit_statement: str) -> None:
    source = f"""
    def main():
        if dist.get_rank() != 0:
            {exit_statement}
        target()
    main()
    """
    assert runs(source) is Runs.RANK0


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        # a hook that refuses to run in a job: what follows runs only in a one-process run
        ("dist.get_world_size() != 1", Runs.SINGLE),
        ("dist.get_world_size() > 1", Runs.SINGLE),
        # it leaves only when the job is larger than two processes: two still get here
        ("dist.get_world_size() > 2", Runs.ALL),
    ],
)
def test_an_exit_unless_the_world_is_one_process(test: str, expected: Runs) -> None:
    source = f"""
    def dump():
        if {test}:
            raise RuntimeError("one process only")
        target()
    dump()
    """
    assert runs(source) is expected


def test_continue_guards_the_rest_of_the_loop_body() -> None:
    source = """
    for batch in range(3):
        if int(os.environ["RANK"]) > 0:
            continue
        target()
    """
    assert runs(source) is Runs.RANK0


@pytest.mark.parametrize(
    "test",
    [
        "world_size == 1",
        "args.world_size <= 1",
        "not args.distributed",
        "args.local_rank == -1",
        "'RANK' not in os.environ",
        "not dist.is_initialized()",
        "not (args.distributed or dist.is_initialized())",
        "dist.get_world_size() == 1",
        "utils.get_world_size() < 2",
    ],
)
def test_single_process_idioms(test: str) -> None:
    assert runs(f"if {test}:\n    target()\n") is Runs.SINGLE


@pytest.mark.parametrize(
    "test",
    ["args.world_size > 1", "args.local_rank != -1", "'RANK' in os.environ", "args.distributed", "dist.is_initialized()",
     "dist.get_world_size() != 1"],
)
def test_the_else_of_a_distributed_check_is_single_process(test: str) -> None:
    assert runs(f"if {test}:\n    pass\nelse:\n    target()\n") is Runs.SINGLE


def test_elif_rank_not_in_environ_is_single_process() -> None:
    source = """
    if 'SLURM_PROCID' in os.environ:
        pass
    elif 'RANK' not in os.environ:
        target()
    """
    assert runs(source) is Runs.SINGLE


@pytest.mark.parametrize(
    "test",
    # true in distributed runs too: they decide nothing
    ["args.gpu is not None", "'RANK' in os.environ", "world_size == 2", "args.distributed",
     "dist.get_world_size() == 2", "dist.get_world_size(group) == 1", "len(devices()) == 1"],
)
def test_conditions_that_are_not_single_process(test: str) -> None:
    assert runs(f"if {test}:\n    target()\n") is Runs.ALL


def test_helper_only_called_under_a_guard() -> None:
    source = """
    def save():
        target()
    def main():
        if dist.get_rank() == 0:
            save()
    main()
    """
    assert runs(source) is Runs.RANK0


def test_helper_called_on_rank_0_or_in_a_single_process_run_is_rank_0_work() -> None:
    source = """
    def save():
        target()
    if not dist.is_initialized():
        save()
    elif dist.get_rank() == 0:
        save()
    """
    assert runs(source) is Runs.RANK0


def test_helper_called_guarded_and_unguarded_runs_everywhere() -> None:
    source = """
    def save():
        target()
    if dist.get_rank() == 0:
        save()
    save()
    """
    assert runs(source) is Runs.ALL


def test_method_called_through_an_instance_built_here() -> None:
    source = """
    class Trainer:
        def fit(self):
            target()
    trainer = Trainer()
    if dist.get_rank() == 0:
        trainer.fit()
    """
    assert runs(source) is Runs.RANK0


def test_spawn_target_runs_on_every_rank_even_if_also_called_single_process() -> None:
    source = """
    def worker(index):
        target()
    if __name__ == "__main__":
        if 'RANK' not in os.environ:
            worker(0)
        mp.spawn(worker, nprocs=2)
    """
    assert runs(source) is Runs.ALL


def test_helper_nobody_calls_is_unknown() -> None:
    assert runs("def helper():\n    target()\n") is Runs.UNKNOWN


def test_mutually_recursive_helpers_still_find_the_guard() -> None:
    source = """
    def ping(n):
        target()
        if n:
            pong(n - 1)
    def pong(n):
        ping(n)
    if dist.get_rank() == 0:
        ping(3)
    """
    assert runs(source) is Runs.RANK0


def test_a_check_on_an_untraceable_id_is_unknown() -> None:
    assert runs("if self.gpu_id == 0:\n    target()\n") is Runs.UNKNOWN


def test_a_single_process_check_outside_a_rank_check_wins() -> None:
    source = "if not args.distributed:\n    if dist.get_rank() == 0:\n        target()\n"
    assert runs(source) is Runs.SINGLE


def test_route_runs_narrows_by_the_path_a_value_takes() -> None:
    # `gpu = 0` only on the single-node path: the literal reaches set_device there only.
    source = PRELUDE + textwrap.dedent(
        """
        def worker(gpu):
            torch.cuda.set_device(gpu)
        def main():
            if args.distributed:
                mp.spawn(worker, nprocs=4)
            else:
                worker(0)
        main()
        """
    )
    model = build_analysis(cst.parse_module(source))
    sink = model.calls_named("torch.cuda.set_device")[0]
    routes = model.routes(sink.arg(0), sink.order, sink.function)
    assert [model.code_of(r.value) for r in routes] == ["0"]
    assert who_runs(model, sink).runs is Runs.ALL
    assert route_runs(model, routes[0], sink) is Runs.SINGLE


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        ("args.local_rank == -1 or args.no_cuda", Runs.SINGLE),
        ("args.local_rank == -1 or not torch.cuda.is_available()", Runs.SINGLE),
        # an operand that is neither single-process nor GPU-less: any run may take the branch
        ("args.local_rank == -1 or args.debug", Runs.ALL),
        ("args.no_cuda or args.fp16", Runs.ALL),
    ],
)
def test_single_process_or_no_gpu(test: str, expected: Runs) -> None:
    assert runs(f"if {test}:\n    target()\n") is expected


HOROVOD_ONLY = "import horovod.torch as hvd\nhvd.init()\n"


def group_created(source: str) -> bool:
    """`group_created_under_guard` for the `target()` call of a snippet."""
    model = build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)))
    (call,) = [c for c in model.calls if c.dotted == "target"]
    return group_created_under_guard(model, who_runs(model, call), call)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # A config dict's flag is a flag like an attribute (field evaluation 2026-11c).
        ('if not cfg["distributed"]:\n    target()\n', Runs.SINGLE),
        ('if cfg["distributed"]:\n    pass\nelse:\n    target()\n', Runs.SINGLE),
        ('if not cfg.get("ddp"):\n    target()\n', Runs.SINGLE),
        ('if cfg["distributed"]:\n    target()\n', Runs.ALL),
        # Other keys and other calls named get decide nothing.
        ('if not cfg["pretrained"]:\n    target()\n', Runs.ALL),
        ('if not cfg[key]:\n    target()\n', Runs.ALL),
        # The else of a Horovod flag is the one-process run where Horovod alone launches ...
        (HOROVOD_ONLY + 'if cfg["horovod"]:\n    pass\nelse:\n    target()\n', Runs.SINGLE),
        (HOROVOD_ONLY + "if not args.use_horovod:\n    target()\n", Runs.SINGLE),
        # ... but not where DDP is the other way of running several processes, nor without hvd.init().
        (HOROVOD_ONLY + 'dist.init_process_group("nccl")\nif cfg["horovod"]:\n    pass\nelse:\n    target()\n',
         Runs.ALL),
        ('if cfg["horovod"]:\n    pass\nelse:\n    target()\n', Runs.ALL),
    ],
)
def test_single_process_flags(source: str, expected: Runs) -> None:
    assert runs(source) is expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # the leaders of MPI sub-communicators create the group in their branch: all its members are there
        ("if sub_rank == 0:\n    dist.init_process_group('gloo')\n    target()\n", True),
        ("def main():\n    if sub_rank != 0:\n        return\n    dist.init_process_group('gloo')\n    target()\nmain()\n", True),
        # the group created by every rank before the branch
        ("dist.init_process_group('gloo')\nif dist.get_rank() == 0:\n    target()\n", False),
        # created in the branch, but a nested rank test decides who runs the call
        ("if sub_rank == 0:\n    dist.init_process_group('gloo')\n    if dist.get_rank() == 0:\n        target()\n", False),
        # created after the call, or in another branch
        ("if sub_rank == 0:\n    target()\n    dist.init_process_group('gloo')\n", False),
        ("if sub_rank == 0:\n    dist.init_process_group('gloo')\nif sub_rank == 0:\n    target()\n", False),
        ("if sub_rank == 0:\n    dist.init_process_group('gloo')\nelse:\n    target()\n", False),
    ],
)
def test_group_created_under_the_guard(source: str, expected: bool) -> None:
    assert group_created(source) is expected


# A flag that starts False and is raised only where the process is the main one (field evaluation
# 2026-11e, the ViLBERT family's `default_gpu`).
RAISED_FLAG = """
flag = False
if dist.is_available() and args.local_rank != -1:
    if dist.get_rank() == 0:
        flag = True
else:
    flag = True
"""


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (RAISED_FLAG + "if flag:\n    target()\n", Runs.RANK0),
        # the other side of the flag decides nothing: rank 0 might not have raised it
        (RAISED_FLAG + "if not flag:\n    target()\n", Runs.ALL),
        (RAISED_FLAG + "if flag:\n    pass\nelse:\n    target()\n", Runs.ALL),
        # raised on every rank of the distributed run
        ("flag = False\nif args.local_rank != -1:\n    flag = True\nif flag:\n    target()\n", Runs.ALL),
        # raised only where the job is one process: not a rank-0 flag (no rank test raised it)
        ("flag = False\nif args.local_rank == -1:\n    flag = True\nif flag:\n    target()\n", Runs.ALL),
        # a value that is not a literal, or a parameter, is not such a flag
        ("flag = check()\nif dist.get_rank() == 0:\n    flag = True\nif flag:\n    target()\n", Runs.ALL),
        ("def f(flag):\n    if dist.get_rank() == 0:\n        flag = True\n    if flag:\n        target()\nf(True)\n",
         Runs.ALL),
    ],
)
def test_flag_raised_only_on_the_main_process(source: str, expected: Runs) -> None:
    assert runs(source) is expected


def test_rank_kinds_of_a_raised_flag_are_those_of_its_rank_test() -> None:
    from ddpdoctor.lint.analysis.ranks import flag_raising_guards, guard_rank_kinds

    source = "flag = False\nif int(os.environ['LOCAL_RANK']) == 0:\n    flag = True\nif flag:\n    target()\n"
    model = build_analysis(cst.parse_module(PRELUDE + source))
    (call,) = [c for c in model.calls if c.dotted == "target"]
    answer = who_runs(model, call)
    assert answer.runs is Runs.RANK0 and answer.guard is not None
    assert len(flag_raising_guards(model, answer.guard.test, answer.guard.order, None)) == 1
    assert guard_rank_kinds(model, answer.guard) == {"local"}


@pytest.mark.parametrize(
    "test",
    # the else of `a and b` is `not a or not b`: one process when each negation is
    ["dist.is_available() and args.distributed", "dist.is_initialized() and args.local_rank != -1"],
)
def test_else_of_a_conjunction_of_distributed_checks_is_single_process(test: str) -> None:
    assert runs(f"if {test}:\n    pass\nelse:\n    target()\n") is Runs.SINGLE


@pytest.mark.parametrize(
    "test",
    [
        # one operand's negation says nothing about the number of processes
        "args.distributed and dist.get_rank() == 0",
        # no GPU is not one process (CPU jobs run over gloo)
        "torch.cuda.is_available() and args.distributed",
    ],
)
def test_else_of_a_conjunction_that_is_not_single_process(test: str) -> None:
    assert runs(f"if {test}:\n    pass\nelse:\n    target()\n") is not Runs.SINGLE


def test_no_gpu_is_not_a_single_process_test() -> None:
    assert runs("if not torch.cuda.is_available():\n    target()\n") is Runs.ALL


HELPER_WITH_FLAG = """
def write(final=False):
    if final:
        pass
    elif not quiet:
        target()
"""


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        # the unguarded call passes final=True: it cannot reach the elif; the guarded one can
        ("if dist.get_rank() == 0:\n    write()\nwrite(final=True)\n", Runs.RANK0),
        ("if dist.get_rank() == 0:\n    write(False)\nwrite(True)\n", Runs.RANK0),
        # the default (False) reaches it from every rank
        ("if dist.get_rank() == 0:\n    write()\nwrite()\n", Runs.ALL),
        # a value that is not a literal may be anything
        ("if dist.get_rank() == 0:\n    write()\nwrite(final=args.final)\n", Runs.ALL),
        ("if dist.get_rank() == 0:\n    write()\nwrite(**options)\n", Runs.ALL),
    ],
)
def test_a_literal_argument_decides_which_branch_a_call_site_reaches(calls: str, expected: Runs) -> None:
    assert runs(HELPER_WITH_FLAG + calls) is expected


def test_a_rebound_parameter_is_not_the_argument() -> None:
    source = """
    def write(final=False):
        final = check()
        if not final:
            target()
    if dist.get_rank() == 0:
        write()
    write(final=True)
    """
    assert runs(source) is Runs.ALL


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # FSDP is the only way this module runs several processes: the flag's other side is one process
        ("if cfg.enable_fsdp:\n    pass\nelse:\n    target()\n", Runs.SINGLE),
        ("if not args.fsdp:\n    target()\n", Runs.SINGLE),
        # the group is created only under the flag
        ("if cfg.enable_fsdp:\n    dist.init_process_group('nccl')\nif not cfg.enable_fsdp:\n    target()\n",
         Runs.SINGLE),
        # ... but not where the group is created on every path, nor where DDP is the alternative
        ("dist.init_process_group('nccl')\nif not cfg.enable_fsdp:\n    target()\n", Runs.ALL),
        ("from torch.nn.parallel import DistributedDataParallel as DDP\nif cfg.use_fsdp:\n    pass\n"
         "else:\n    m = DDP(m)\n    target()\n", Runs.ALL),
        ("if cfg.enable_fsdp:\n    target()\n", Runs.ALL),
    ],
)
def test_the_other_side_of_an_fsdp_flag(source: str, expected: Runs) -> None:
    assert runs(source) is expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # A distributed switch compared with a literal (field evaluation 2026-11d): string options
        # such as `--dist ON|OFF`, booleans written out, and mmcv's `--launcher none|pytorch|slurm`.
        ('if args.dist == "OFF":\n    target()\n', Runs.SINGLE),
        ('if args.dist == "ON":\n    pass\nelse:\n    target()\n', Runs.SINGLE),
        ('if args.dist != "ON":\n    target()\n', Runs.SINGLE),
        ("if args.distributed is False:\n    target()\n", Runs.SINGLE),
        ("if args.use_ddp == 0:\n    target()\n", Runs.SINGLE),
        ('if cfg["distributed"] == "false":\n    target()\n', Runs.SINGLE),
        ('if args.launcher == "none":\n    target()\n', Runs.SINGLE),
        ('if args.launcher == "pytorch":\n    pass\nelse:\n    target()\n', Runs.ALL),  # the else may be SLURM
        ('if args.dist == "ON":\n    target()\n', Runs.ALL),
        ('if args.dist == "OFF":\n    pass\nelse:\n    target()\n', Runs.ALL),
        ('if args.dist_backend == "none":\n    target()\n', Runs.ALL),  # not a switch
        ('if args.mode == "off":\n    target()\n', Runs.ALL),
        ('if args.dist < "OFF":\n    target()\n', Runs.ALL),
    ],
)
def test_distributed_switch_compared_with_a_literal(source: str, expected: Runs) -> None:
    assert runs(source) is expected


HELPERS = """
def get_rank():
    if not dist.is_initialized():
        return 0
    return dist.get_rank()
"""


@pytest.mark.parametrize(
    ("helper", "expected"),
    [
        # Named freely, answering "am I the main process" (field evaluation 2026-11d).
        ("def primary():\n    if not dist.is_available():\n        return True\n"
         "    if not dist.is_initialized():\n        return True\n    return get_rank() == 0\n", Runs.RANK0),
        ('def primary():\n    """Docstring."""\n    return not dist.is_initialized() or dist.get_rank() == 0\n', Runs.RANK0),
        ("def primary():\n    return dist.get_rank() == 0\n", Runs.RANK0),
        # Not such a helper: another early return, another statement, a parameter, another rank.
        ("def primary():\n    if not dist.is_initialized():\n        return False\n    return get_rank() == 0\n",
         Runs.ALL),
        ("def primary():\n    log()\n    return get_rank() == 0\n", Runs.ALL),
        ("def primary(rank):\n    return rank == 0\n", Runs.ALL),
        ("def primary():\n    return get_rank() == 1\n", Runs.ALL),  # only rank-0 answers are followed
        ("def primary():\n    return ready\n", Runs.ALL),
    ],
)
def test_a_helper_answering_am_i_the_main_process(helper: str, expected: Runs) -> None:
    call = "primary(0)" if "(rank)" in helper else "primary()"
    assert runs(HELPERS + helper + f"if {call}:\n    target()\n") is expected
def kinds_of_argument(source: str) -> tuple[Optional[str], Optional[str]]:
    """(rank_kind, rank_source) of the argument of `target(...)`."""
    model = build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)))
    (call,) = [c for c in model.calls if c.dotted == "target"]
    value = call.arg(0)
    return (
        ranks.rank_kind(model, value, call.order, call.function),
        ranks.rank_source(model, value, call.order, call.function),
    )


@pytest.mark.parametrize(
    ("source", "kind", "source_kind"),
    [
        ('gpu = int(os.environ["LOCAL_RANK"])\ntarget(gpu)\n', "local", "local"),
        ("target(dist.get_rank())\n", "global", "global"),
        # what a variable is called counts for rank_kind, never for rank_source
        ("target(args.localrank)\n", "local", None),
        ("target(args.local_rank)\n", "local", None),
        ("target(args.rank)\n", "global", None),
        ("gpu = cfg.local_rank\ntarget(gpu)\n", "local", None),
        ("target(args.node_rank)\n", None, None),
        # a rank helper's name (`get_local_rank()`) is trusted by both, unlike a variable's
        ("target(get_local_rank())\n", "local", "local"),
        # `rank, local = setup()`: the position of the setup helper's returned tuple, followed
        # into the helper's own variables
        ('def setup():\n    rank = dist.get_rank()\n    return rank, int(os.environ["LOCAL_RANK"])\n\n'
         "rank, local = setup()\ntarget(rank)\n", "global", "global"),
    ],
)
def test_rank_kind_and_rank_source(source: str, kind: Optional[str], source_kind: Optional[str]) -> None:
    assert kinds_of_argument(source) == (kind, source_kind)


def test_rank_source_follows_a_setup_helpers_tuple_into_its_variables() -> None:
    """`gpu, _ = setup()` where setup returns its local `local = int(os.environ["LOCAL_RANK"])`:
    the device index is this process's local rank, although nothing is named like a rank.
    (rank_kind does not follow the unpacking yet: it answers None here.)"""
    source = (
        'def setup():\n    local = int(os.environ["LOCAL_RANK"])\n    world = dist.get_world_size()\n'
        "    return local, world\n\ngpu, _ = setup()\ntarget(gpu)\n"
    )
    assert kinds_of_argument(source)[1] == "local"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # A helper called on both sides of one test reaches every rank (field evaluation 2026-11g) ...
        ("def helper():\n    target()\n\ndef share(src):\n    if dist.get_rank() == src:\n        helper()\n"
         "    else:\n        helper()\n\nshare(1)\n", Runs.ALL),
        ("def helper():\n    target()\n\ndef share(src):\n    if dist.get_rank() == src:\n        helper()\n"
         "        return\n    helper()\n\nshare(1)\n", Runs.ALL),
        # ... but not when it is called on one side only, or on sides of two different tests.
        ("def helper():\n    target()\n\ndef share(src):\n    if dist.get_rank() == src:\n        helper()\n\nshare(1)\n",
         Runs.SUBSET),
        ("def helper():\n    target()\n\ndef share(src, dst):\n    if dist.get_rank() == src:\n        helper()\n"
         "    if dist.get_rank() != dst:\n        helper()\n\nshare(1, 2)\n", Runs.SUBSET),
    ],
)
def test_a_helper_called_on_both_sides_of_one_test_runs_everywhere(source: str, expected: Runs) -> None:
    assert runs(source) is expected


@pytest.mark.parametrize(
    ("condition", "kinds"),
    [
        ("rank == 0", {"global"}),
        # a counter beside the rank test says nothing about which rank
        ("rank == 0 and epoch % save_every == 0", {"global"}),
        ("epoch % save_every == 0 and rank == 0", {"global"}),
        ("local_rank == 0 and epoch % save_every == 0", {"local"}),
        # the rank reduced modulo the GPU count is the first process of each node
        ("rank % ngpus_per_node == 0", {"local"}),
    ],
)
def test_rank_kinds_read_only_the_rank_part_of_a_condition(condition: str, kinds: set[str]) -> None:
    from ddpdoctor.lint.analysis.ranks import guard_rank_kinds

    source = (
        "rank = dist.get_rank()\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
        f"if {condition}:\n    target()\n"
    )
    model = build_analysis(cst.parse_module(PRELUDE + source))
    (call,) = [c for c in model.calls if c.dotted == "target"]
    answer = who_runs(model, call)
    assert answer.runs is Runs.RANK0 and answer.guard is not None
    assert guard_rank_kinds(model, answer.guard) == kinds


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("if dist.get_rank() == 0:\n    target()\n", True),
        # a helper called only there
        ("def evaluate():\n    target()\nrank = dist.get_rank()\nif rank == 0 and step % 10 == 0:\n    evaluate()\n", True),
        # once per node, not once per job
        ("if int(os.environ['LOCAL_RANK']) == 0:\n    target()\n", False),
        ("if dist.get_rank() % 8 == 0:\n    target()\n", False),
        ("target()\n", False),
        ("if dist.get_rank() != 0:\n    target()\n", False),
    ],
)
def test_runs_on_global_rank0_only(source: str, expected: bool) -> None:
    model = build_analysis(cst.parse_module(PRELUDE + source))
    (call,) = [c for c in model.calls if c.dotted == "target"]
    assert ranks.runs_on_global_rank0_only(model, call) is expected
