"""Value-following terminates on recursive and mutually recursive helpers (it used to go
exponential: a parameter followed through every call site at every level)."""

from __future__ import annotations

import libcst as cst
import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source
from ddpdoctor.lint.analysis import ModuleModel

RECURSIVE = '''
import os
import torch
import torch.distributed as dist

def walk(state, rank, depth):
    if depth == 0:
        return torch.device("cuda", rank)
    for key in state:
        walk(state[key], rank, depth - 1)
        walk(state[key], rank + 1, depth - 1)
        ping(state, rank, depth)
    return walk(state, rank, depth - 1)

def ping(state, rank, depth):
    return pong(state, rank, depth)

def pong(state, rank, depth):
    torch.cuda.set_device(rank)
    return ping(state, rank, depth - 1) if depth else walk(state, rank, depth)

def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["RANK"])
    walk({}, rank, 10)
'''


@pytest.mark.timeout(60)
def test_recursive_helpers_terminate_with_every_rule() -> None:
    # Twenty copies of the recursive helpers in one module multiply the call sites.
    source = RECURSIVE + "".join(
        RECURSIVE.replace("def walk", f"def walk{i}").replace("walk(", f"walk{i}(") for i in range(20)
    )
    result = lint_source(source, "recursive.py", Settings(select=("ALL",)))
    assert all(f.code != "DDP999" for f in result.findings)


def test_memo_answers_unknown_on_a_cycle() -> None:
    facts = ModuleModel.build(cst.parse_module("def f(x):\n    return f(x)\n\ny = f(1)\n"))
    value = facts.assignments_to("y")[0].value
    calls = facts.origin_calls(value, 10**6, None)
    assert [c.dotted for c in calls][:1] == ["f"]
