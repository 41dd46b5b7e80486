"""A 2-rank gloo job that leaves Flight Recorder dumps, for tests/guard/test_flight_runs.py.

    python fixtures/guard/forklaunch.py 2 tests/guard/fr_job.py SCENARIO

with TORCH_FR_BUFFER_SIZE and TORCH_FR_DUMP_TEMP_FILE set. torch 2.13 records gloo's collectives (DDP's own
included) but writes no dump on a gloo timeout (only NCCL's watchdog does), so every rank writes its own, as
the watchdog would: `torch._C._distributed_c10d._dump_fr_trace()` to TORCH_FR_DUMP_TEMP_FILE + rank, after the
job ends or fails. Lines the tests expect in a finding are marked `# expect: SCENARIO`.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, skip_b: bool) -> torch.Tensor:
        h = self.a(x)
        return h[:, :2] if skip_b else self.b(h)


def shape(rank: int) -> None:
    dist.all_reduce(torch.ones(2))
    dist.all_reduce(torch.ones(3 if rank == 0 else 4))  # expect: shape


def ddp_unused(rank: int) -> None:
    model = DDP(Net())  # find_unused_parameters=False, the default
    for step in range(3):
        out = model(torch.ones(3, 4), skip_b=rank == 1 and step == 1)  # expect: ddp_unused_forward
        out.sum().backward()  # expect: ddp_unused


def skip_barrier(rank: int) -> None:
    dist.all_reduce(torch.ones(2))
    if rank == 0:
        dist.barrier()  # expect: skip_barrier


def clean(rank: int) -> None:
    model = DDP(Net())
    for _ in range(2):
        model(torch.ones(3, 4), skip_b=False).sum().backward()
    dist.all_reduce(torch.ones(2))
    dist.barrier()


def main() -> int:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    failed = 0
    try:
        {"shape": shape, "ddp_unused": ddp_unused, "skip_barrier": skip_barrier, "clean": clean}[sys.argv[1]](rank)
    except RuntimeError as error:  # gloo's timeout or "connection closed by peer": the dump is what matters
        sys.stderr.write(f"rank {rank}: {str(error).splitlines()[0][:200]}\n")
        failed = 1
    with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as dump:
        dump.write(torch._C._distributed_c10d._dump_fr_trace())
    # No destroy_process_group: after a failed collective it can block on the peer; the launcher reaps us.
    return failed


if __name__ == "__main__":
    sys.exit(main())
