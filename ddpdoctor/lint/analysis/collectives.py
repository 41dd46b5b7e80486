"""Which calls are collectives: every rank of the (default) group must enter them, in the same
order, or the job hangs until the timeout.
"""

from __future__ import annotations

from typing import Optional

from ddpdoctor.lint.analysis.model import Call

# Every rank of the (default) group must enter these; send/recv/isend/irecv are point-to-point
# and rank-specific by design, so they are not here.
TORCH_COLLECTIVES = frozenset(
    {
        "barrier", "monitored_barrier", "all_reduce", "all_reduce_coalesced", "broadcast", "all_gather",
        "all_gather_into_tensor", "all_gather_coalesced", "reduce", "gather", "scatter", "reduce_scatter",
        "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "all_gather_object", "gather_object",
        "scatter_object_list", "broadcast_object_list", "new_group", "new_subgroups",
    }
)
HOROVOD_COLLECTIVES = frozenset(
    {
        "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
        "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "broadcast",
        "broadcast_", "broadcast_async", "broadcast_async_", "allgather", "allgather_async",
        "grouped_allgather", "allgather_object", "broadcast_object", "broadcast_parameters",
        "broadcast_optimizer_state", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
        "grouped_reducescatter", "join", "barrier",
    }
)
HOROVOD_MODULES = ("horovod.torch", "horovod.tensorflow", "horovod.keras", "horovod.tensorflow.keras")
# Creating a group is collective over the whole world even for ranks not in it.
GROUP_CREATION = frozenset({"new_group", "new_subgroups"})


def collective_name(call: Call) -> Optional[str]:
    """`torch.distributed.barrier` / `horovod.torch.allreduce` for a collective call, else None."""
    name = call.name
    if name is None:
        return None
    module, _, attr = name.rpartition(".")
    if module == "torch.distributed" and attr in TORCH_COLLECTIVES:
        return name
    if module in HOROVOD_MODULES and attr in HOROVOD_COLLECTIVES:
        return name
    return None
