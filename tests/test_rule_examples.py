"""Each rule class's docstring `Valid:` / `Invalid:` examples are executable (as in Fixit): every
Valid example lints clean for that rule and every Invalid one gets its code. The examples are
fragments, so a fixed prelude of the usual imports goes before each (and a `# world-size: N`
comment sets --world-size)."""

from __future__ import annotations

import inspect
import re
import textwrap

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source
from ddpdoctor.lint.rules.base import Rule, all_rules

PRELUDE = """\
import contextlib
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
import horovod.torch as hvd
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
"""


def examples(rule: type[Rule]) -> list[tuple[str, str]]:
    """[("valid" | "invalid", code), ...] from the class docstring."""
    doc = inspect.getdoc(rule) or ""
    out: list[tuple[str, str]] = []
    for kind, body in re.findall(r"^(Valid|Invalid):\n((?:(?:    .*)?\n?)+)", doc, flags=re.M):
        out.append((kind.lower(), textwrap.dedent(body)))
    return out


CASES = [
    pytest.param(code, kind, source, id=f"{code}-{kind}-{index}")
    for code, rule in all_rules().items()
    for index, (kind, source) in enumerate(examples(rule))
]


def test_every_rule_has_both_kinds_of_example() -> None:
    for code, rule in all_rules().items():
        kinds = {kind for kind, _ in examples(rule)}
        assert kinds == {"valid", "invalid"}, f"{code}: docstring examples {sorted(kinds)}"


@pytest.mark.parametrize(("code", "kind", "source"), CASES)
def test_docstring_example(code: str, kind: str, source: str) -> None:
    match = re.search(r"# world-size: (\d+)", source)
    settings = Settings(select=(code,), world_size=int(match.group(1)) if match else None)
    result = lint_source(PRELUDE + source, "example.py", settings)
    found = [f for f in result.findings if f.code == code]
    if kind == "valid":
        assert found == [], f"{code} fires on its Valid example:\n{source}"
    else:
        assert found, f"{code} is silent on its Invalid example:\n{source}"
