"""Rank-guard spellings the guard rules (DDP008, DDP009) depend on, checked on `classify_rank_test`
directly, plus the end-to-end behaviours that the fixtures only show indirectly."""

from __future__ import annotations

from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.analysis import ranks
from ddpdoctor.lint.engine import lint_source
from ddpdoctor.lint.analysis import ModuleModel

PRELUDE = """\
import os
import torch.distributed as dist
RANK = int(os.getenv("RANK", "-1"))
LOCAL_RANK = int(os.getenv("LOCAL_RANK", "-1"))
"""


def classify(test: str, negated: bool = False) -> Optional[str]:
    module = cst.parse_module(PRELUDE + f"if {test}:\n    pass\n")
    facts = ModuleModel.build(module)
    statement = module.body[-1]
    assert isinstance(statement, cst.If)
    return ranks.classify_rank_test(facts, statement.test, 10_000, None, negated)


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        # -1 is a unary minus in the tree, not an Integer: it means "is (not) distributed".
        ("RANK != -1", None),
        ("RANK == -1", None),
        ("LOCAL_RANK != -1", None),
        ("RANK in {-1, 0}", "rank0"),
        ("LOCAL_RANK not in [-1, 0]", "nonzero"),
        ("RANK == 0", "rank0"),
        ("RANK != 0", "nonzero"),
        ("RANK == 1", "subset"),
        ("dist.get_rank() == 0", "rank0"),
    ],
)
def test_rank_test_spellings(test: str, expected: Optional[str]) -> None:
    assert classify(test) == expected


def test_minus_one_check_stays_unclassified_in_else() -> None:
    assert classify("RANK != -1", negated=True) is None


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        ("not RANK != 0", "nonzero"),  # the else of `if not rank != 0:`
        ("RANK == 0 or RANK == 1", "nonzero"),  # De Morgan: neither 0 nor 1, so never rank 0
        ("RANK != 0 and dist.get_rank() != 0", "rank0"),
    ],
)
def test_else_side_of_combined_tests(test: str, expected: str) -> None:
    assert classify(test, negated=True) == expected


YOLO_STYLE_EARLY_STOP = PRELUDE + """\
import torch.distributed as dist
dist.init_process_group("nccl")
stop = False
for epoch in range(10):
    if RANK != -1:  # if DDP training
        broadcast_list = [stop if RANK == 0 else None]
        dist.broadcast_object_list(broadcast_list, 0)
        if RANK != 0:
            stop = broadcast_list[0]
    if stop:
        break
"""


def test_collective_under_is_distributed_check_is_not_rank_guarded() -> None:
    findings = lint_source(YOLO_STYLE_EARLY_STOP, "train.py", Settings(select=("DDP009",))).findings
    assert findings == []


def test_collective_under_rank_zero_is_reported_with_guard_line() -> None:
    source = PRELUDE + "dist.init_process_group('nccl')\nif RANK == 0:\n    dist.barrier()\n"
    findings = lint_source(source, "train.py", Settings(select=("DDP009",))).findings
    assert [f.code for f in findings] == ["DDP009"]
    assert "guarded at line 6" in findings[0].message


@pytest.mark.parametrize(
    ("group", "reported"),
    [
        ("", True),
        (", group=dist.group.WORLD", True),  # the default group spelled out is every rank's
        (", group=None", True),
        (", group=evens", False),  # a subgroup: guarding it to its members is how it is used
    ],
)
def test_collective_on_the_world_group_under_rank_zero_is_reported(group: str, reported: bool) -> None:
    source = PRELUDE + f"dist.init_process_group('nccl')\nevens = dist.new_group([0, 2])\nif RANK == 0:\n    dist.barrier({group.lstrip(', ')})\n"
    findings = lint_source(source, "train.py", Settings(select=("DDP009",))).findings
    assert [(f.code, f.line) for f in findings] == ([("DDP009", 8)] if reported else [])


def test_save_under_untraceable_zero_check_is_undecidable() -> None:
    # `self.gpu_id` is an mp.spawn index we cannot trace to a rank: stay silent.
    source = """\
import torch
import torch.distributed as dist
dist.init_process_group("nccl")
class Trainer:
    def __init__(self, gpu_id):
        self.gpu_id = gpu_id
    def _save(self):
        torch.save({}, "checkpoint.pt")
    def train(self):
        for epoch in range(3):
            if self.gpu_id == 0 and epoch % 2 == 0:
                self._save()
Trainer(0).train()
"""
    assert lint_source(source, "t.py", Settings(select=("DDP008",))).findings == []


def test_save_to_in_memory_buffer_is_not_a_checkpoint_write() -> None:
    source = """\
import io
import torch
import torch.distributed as dist
dist.init_process_group("nccl")
buffer = io.BytesIO()
torch.save({"step": 1}, buffer)
"""
    assert lint_source(source, "t.py", Settings(select=("DDP008",))).findings == []
