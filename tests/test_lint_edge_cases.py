"""Edges no other test stated, found by a mutation sample (issue 10): suppression comments in any case."""

from __future__ import annotations

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source


# --------------------------------------------------------------------------------- suppression


@pytest.mark.parametrize(
    "comment",
    ["# NOQA: DDP002", "# NoQA: ddp002", "# DDPDoctor: ignore[DDP002]", "# DDPDOCTOR: IGNORE"],
)
def test_suppression_comments_are_read_in_any_case(comment: str) -> None:
    source = (
        "import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(net, device_ids=[0])\n"
        f"model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  {comment}\n"
    )
    assert lint_source(source, "t.py", Settings(select=("DDP002",))).findings == []
    unsuppressed = source.replace(comment, "")
    assert [f.code for f in lint_source(unsuppressed, "t.py", Settings(select=("DDP002",))).findings] == ["DDP002"]
