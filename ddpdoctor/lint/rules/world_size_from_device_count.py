"""DDP005 world-size-from-device-count: `world_size=torch.cuda.device_count()` in a multi-node job."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis import launch
from ddpdoctor.lint.rules.base import Rule

DEVICE_COUNT = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})
# Environment a launcher that spans nodes sets (torchrun, SLURM, Open MPI); MASTER_ADDR is left
# out on purpose: single-node mp.spawn scripts set and read it too.
LAUNCHER_ENV = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK",
     "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NNODES", "SLURM_NODEID", "SLURM_LOCALID",
     "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE"}
)
# Command-line options that say the job spans nodes (`--nnodes`, `--node-rank`, the `-nr` of the
# classic multi-node mp.spawn tutorial).
# `--local_rank` is what torch.distributed.launch passes, a launcher that spans nodes too.
NODE_OPTIONS = frozenset({"nnodes", "nodes", "num_nodes", "n_nodes", "node_rank", "nr", "node_id", "num_machines",
                          "machine_rank", "local_rank"})


class WorldSizeFromDeviceCount(Rule):
    """
    Valid:
        # single node: one process per local GPU
        world_size = torch.cuda.device_count()
        mp.spawn(worker, args=(world_size,), nprocs=world_size)
    Invalid:
        # torchrun --nnodes=2 --nproc-per-node=8 train.py
        rank = int(os.environ["RANK"])
        dist.init_process_group("nccl", rank=rank, world_size=torch.cuda.device_count())
    """

    code = "DDP005"
    trigger_words = ("device_count",)
    context_words = ("init_process_group",)

    def check(self) -> None:
        model = self.model
        for call in model.calls_named(launch.INIT_PROCESS_GROUP):
            world = call.arg(3, "world_size")
            if world is None:
                continue
            leaves = model.leaf_values(world, call.order, call.function)
            counts = [
                leaf for leaf, _, _ in leaves
                if isinstance(leaf, cst.Call) and model.qualify(leaf.func) in DEVICE_COUNT
            ]
            if not counts or len(counts) != len(leaves):
                continue
            if launch.is_loopback_rendezvous(model, call):
                continue  # `init_method="tcp://127.0.0.1:..."`: the job cannot span nodes
            reason = self.multi_node_reason()
            if reason is None:
                continue
            origin = ""
            if self.line(counts[0]) != self.line(world):
                origin = f" (line {self.line(counts[0])})"
            self.report(
                world,
                f"world_size is torch.cuda.device_count(){origin}, the GPU count of one node, but this "
                f"script is launched in a way that can span nodes ({reason}): with a second node the "
                f"ranks do not fit and init_process_group fails or hangs. Pass the total number of "
                f"processes: int(os.environ[\"WORLD_SIZE\"]) under a launcher, or GPUs per node times "
                f"the number of nodes.",
            )

    def multi_node_reason(self) -> Optional[str]:
        """Why the script is launched by torchrun/SLURM/MPI or across nodes, or None."""
        model = self.model
        for key, node in launch.env_reads(model):
            if key in LAUNCHER_ENV:
                return f"it reads {key} at line {self.line(node)}"
        for call in model.method_calls("add_argument"):
            for arg in call.args:
                flag = arg.value
                if arg.keyword is not None and arg.keyword.value != "dest":
                    continue
                if isinstance(flag, cst.SimpleString):
                    option = str(flag.evaluated_value).lstrip("-").replace("-", "_")
                    if option in NODE_OPTIONS:
                        return f"option {flag.evaluated_value!s} at line {self.line(call.node)}"
        spawns = model.calls_named(*launch.SPAWN_CALLS)
        if not spawns:
            for call in model.calls_named(launch.INIT_PROCESS_GROUP):
                method = call.arg(1, "init_method")
                if method is not None and model.const_value(method, call.order, call.function) == "env://":
                    return f"init_method=\"env://\" at line {self.line(call.node)}"
        for assignment in model.assignments:
            last = assignment.target.rsplit(".", 1)[-1]
            if last in ("node_rank", "nnodes", "num_nodes"):
                return f"{assignment.target} at line {self.line(assignment.node)}"
        return None
