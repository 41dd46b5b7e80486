"""What the guard leaves on the training step between its replica checks: nothing that makes torch take
a slower path. The check before the forward is a module pre-hook (a module with a hook takes torch's
slower call path on every call), so it is put on only when a check is due and takes itself off when it
has run. A real DDP model in a world of one (gloo), with the in-code guard."""

from __future__ import annotations

import socket
import subprocess
import sys

from guard_helpers import REPO, guard_env

JOB = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from ddpdoctor import guard
from ddpdoctor.guard import rank

guard.install(every=3)
dist.init_process_group("gloo", rank=0, world_size=1)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.ones(2, 4)
for step in range(1, 9):
    armed = len(model.module._forward_pre_hooks)
    due = rank.current.hash_due
    optimizer.zero_grad()
    model(x).sum().backward()
    print(step, armed, due, rank.current.hash_due, flush=True)
    optimizer.step()
dist.destroy_process_group()
"""


def test_the_check_before_the_forward_hooks_only_the_forward_it_checks() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**guard_env("step-cost"), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    result = subprocess.run([sys.executable, "-c", JOB], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines()]
    # step, hooks on the module before its forward, the check due then, and after the forward.
    assert rows == [["1", "0", "None", "None"], ["2", "0", "None", "None"], ["3", "0", "None", "None"],
                    ["4", "1", "3", "None"], ["5", "0", "None", "None"], ["6", "0", "None", "None"],
                    ["7", "1", "6", "None"], ["8", "0", "None", "None"]]
