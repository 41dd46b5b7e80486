"""Findings whose fix is withheld: the edit would need a fact the script does not give for certain
(an import in scope everywhere, a local rank on that path, the optimizer a clip belongs to...).
The finding must stay, with no fix at all, so `--fix` changes nothing and says it remains."""

from __future__ import annotations

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source

CASES = {
    "HVD001 horovod imported inside the function": (
        "HVD001",
        """
import torch

def main():
    import horovod.torch as hvd
    hvd.init()
    model = torch.nn.Linear(2, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
""",
    ),
    "HVD003 hvd.init() on the line of an if": (
        "HVD003",
        """
import horovod.torch as hvd
import torch

if True: hvd.init()
model = torch.nn.Linear(2, 2).cuda()
""",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_finding_without_fix(name: str) -> None:
    code, source = CASES[name]
    result = lint_source(source.lstrip(), "train.py", Settings(select=(code,)))
    assert [f.code for f in result.findings] == [code]
    assert result.findings[0].fix is None
    fixed = lint_source(source.lstrip(), "train.py", Settings(select=(code,)), fix=True)
    assert fixed.fixed == 0 and fixed.fixed_source is None
