"""What a launcher tells each process through its environment, against what the script writes
itself. torchrun sets RANK, LOCAL_RANK and WORLD_SIZE for every process it starts (srun sets
SLURM_PROCID and SLURM_NTASKS, mpirun OMPI_COMM_WORLD_*): a script that reads its rank from there
is started by a launcher, and a world size it writes as a literal can only agree with the launch
command by chance.
"""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from ddpdoctor.lint.analysis.launch import SPAWN_CALLS, env_key, env_reads
from ddpdoctor.lint.analysis.model import Call, Guard, ModuleModel
from ddpdoctor.lint.analysis.ranks import reaches_several_processes
from ddpdoctor.lint.analysis.syntax import walk

# The per-process variables launchers set (torchrun / torch.distributed.launch --use-env, SLURM, Open MPI, MPICH).
LAUNCHER_RANK_KEYS = frozenset(
    {"RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
     "PMI_RANK"}
)
# Ways a script starts its processes itself, each told its rank by its parent.
SELF_STARTED = SPAWN_CALLS | frozenset({"multiprocessing.Process", "torch.multiprocessing.Process"})


def launcher_rank_read(model: ModuleModel) -> Optional[tuple[str, cst.CSTNode]]:
    """The first read of a launcher's per-process variable (`os.environ["LOCAL_RANK"]`), with the
    node; None when the module starts its processes itself (`mp.spawn`, `Process(...)`: it may set
    those variables for its children) or reads none."""
    if model.calls_named(*SELF_STARTED):
        return None
    reads = [(key, node) for key, node in env_reads(model) if key in LAUNCHER_RANK_KEYS]
    return min(reads, key=lambda read: model.line_of(read[1])) if reads else None


def tests_launcher_env(model: ModuleModel, guards: Sequence[Guard]) -> bool:
    """One of `guards` asks whether a launcher started the process (`if "RANK" in os.environ:`,
    `if os.environ.get("WORLD_SIZE"):`): what runs there, or in its `else:`, is the script's own
    answer for one of the two cases, not a value that contradicts the launcher."""
    keys = LAUNCHER_RANK_KEYS | {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}
    for guard in guards:
        for node in walk(guard.test):
            key = env_key(model, node) if isinstance(node, (cst.Subscript, cst.Call)) else None
            if key is None and isinstance(node, cst.Comparison) and isinstance(node.left, cst.SimpleString):
                if model.qualify(node.comparisons[0].comparator) == "os.environ":
                    key = str(node.left.evaluated_value)
            if key in keys:
                return True
    return False


def literal_world_size(model: ModuleModel, init: Call) -> Optional[tuple[int, cst.Integer]]:
    """The world size an `init_process_group(..., world_size=N)` is given, when every value that
    reaches it on a path several processes run is the same integer literal larger than 1; with
    that literal."""
    world = init.arg(3, "world_size")
    if world is None:
        return None
    found: Optional[cst.Integer] = None
    if tests_launcher_env(model, init.ctx.guards):
        return None
    for route in model.routes(world, init.order, init.function):
        if not reaches_several_processes(model, route, init):
            continue
        if any(tests_launcher_env(model, step.ctx.guards) for step in route.via):
            continue
        value = route.value
        if not isinstance(value, cst.Integer):
            return None
        if found is not None and value.evaluated_value != found.evaluated_value:
            return None
        found = value
    if found is None or int(found.evaluated_value) <= 1:
        return None
    return int(found.evaluated_value), found
