"""The rank a process group or a sampler is given, and jobs that are single-node by construction.

`init_process_group(rank=...)` and `DistributedSampler(rank=...)` want the process's global rank
(0 .. world_size-1 across every node). Given the local rank (`LOCAL_RANK`, `hvd.local_rank()`,
`args.local_rank`), the processes of the second node take the ranks the first node's already hold:
the rendezvous waits for ranks that never come, or two processes draw the same shard. On one node
the local rank is the global rank, so the same code is correct there: a job is single-node by
construction when its process group meets on the loopback interface, or when the number of
processes it is told is this node's GPU count (`world_size=torch.cuda.device_count()`) or
`LOCAL_WORLD_SIZE`, and nothing in the script reads a node count or node index; or when every launch
of it in the project's launch files (launchfiles.py) stays on one node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis.launch import (
    GPU_COUNT,
    INIT_PROCESS_GROUP,
    env_key,
    launch_file_nodes,
    multinode_evidence,
    single_node_rendezvous,
)
from ddpdoctor.lint.analysis.launchfiles import SINGLE_NODE
from ddpdoctor.lint.analysis.model import Call, ModuleModel
from ddpdoctor.lint.analysis.ranks import rank_kind
from ddpdoctor.lint.analysis.syntax import dotted_name

SAMPLERS = frozenset({"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"})
# Where each call takes the rank and the number of processes: (position, keyword) of each.
RANK_PARAMETERS = {INIT_PROCESS_GROUP: ((4, "rank"), (3, "world_size"))} | {
    name: ((2, "rank"), (1, "num_replicas")) for name in SAMPLERS
}
# The number of processes on this node, as the launcher tells it.
NODE_SIZE_ENV = frozenset({"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"})
NODE_SIZE_CALLS = frozenset({GPU_COUNT, "horovod.torch.local_size"})


@dataclass(frozen=True, eq=False)
class RankArgument:
    call: Call
    rank: cst.BaseExpression
    size: Optional[cst.BaseExpression]
    kind: str  # "local" (a local rank) or "spawn" (the mp.spawn index on a job that reads a node count)


def local_rank_arguments(model: ModuleModel) -> list[RankArgument]:
    """Every `rank=` given to `init_process_group` or a DistributedSampler that is a local rank (by
    its source, or by its name where no source can be followed: `args.local_rank`), or the
    `mp.spawn` process index in a script that reads a node count or index (so spawns one process per
    GPU on each of several nodes)."""
    out: list[RankArgument] = []
    for call in model.calls_named(*RANK_PARAMETERS):
        (rank_at, rank_word), (size_at, size_word) = RANK_PARAMETERS[call.name or ""]
        rank = call.arg(rank_at, rank_word)
        if rank is None:
            continue
        written = dotted_name(rank)
        if written is not None and any(
            a.kind == "augassign" for a in model.reaching_assignments(written, call.order, call.function)
        ):
            continue  # built up in steps (`args.rank += gpu` after the node's first rank): a global rank
        kind = rank_kind(model, rank, call.order, call.function)
        if kind == "spawn" and multinode_evidence(model) is None:
            continue  # one node: the spawn index is the rank
        if kind in ("local", "spawn"):
            out.append(RankArgument(call, rank, call.arg(size_at, size_word), kind))
    return out


def single_node_by_construction(model: ModuleModel, argument: RankArgument) -> bool:
    """The job cannot span nodes: a loopback rendezvous, or a process count that is this node's
    (`torch.cuda.device_count()`, `LOCAL_WORLD_SIZE`, `hvd.local_size()`) on every path, in a script
    that reads no node count or index; or every launch the project's launch files make of it stays
    on one node (`torchrun --nproc_per_node 2 train.py`, no --nnodes)."""
    if single_node_rendezvous(model):
        return True
    if multinode_evidence(model) is None and launch_file_nodes(model)[0] == SINGLE_NODE:
        return True
    if argument.size is None or multinode_evidence(model) is not None:
        return False
    call = argument.call
    leaves = model.leaf_values(argument.size, call.order, call.function)
    return bool(leaves) and all(_node_size(model, value) for value, _, _ in leaves)


def _node_size(model: ModuleModel, value: cst.BaseExpression) -> bool:
    if env_key(model, value) in NODE_SIZE_ENV:
        return True
    return isinstance(value, cst.Call) and model.qualify(value.func) in NODE_SIZE_CALLS
