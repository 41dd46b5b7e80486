"""The cheap pre-filter: every rule names the API words it needs, and a file that mentions none of
them is never parsed (that is what keeps the linter fast on ordinary code)."""

from __future__ import annotations

from unittest import mock

import libcst

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import interested_rules, lint_source
from ddpdoctor.lint.rules.base import all_rules

PLAIN = "import torch\nimport torch.nn as nn\n\nclass Net(nn.Module):\n    def forward(self, x):\n        return x.cuda(0)\n"


def test_every_rule_declares_specific_trigger_words() -> None:
    for code, rule in all_rules().items():
        assert rule.trigger_words, f"{code} has no trigger words: every file would be parsed for it"
        assert "torch" not in rule.trigger_words, f"{code}: 'torch' appears in nearly every file"


def test_a_file_without_distributed_apis_is_not_parsed() -> None:
    assert interested_rules(PLAIN.encode(), list(all_rules().values())) == []
    with mock.patch.object(libcst, "parse_module", side_effect=AssertionError("parsed")) as parse:
        result = lint_source(PLAIN, "net.py", Settings(select=("ALL",)))
    assert result.findings == [] and not parse.called


def test_context_words_keep_multi_process_rules_off_single_process_files() -> None:
    loader_only = b"from torch.utils.data import DataLoader\nloader = DataLoader(ds, shuffle=True)\n"
    codes = {rule.code for rule in interested_rules(loader_only, list(all_rules().values()))}
    assert "DDP006" not in codes  # needs init_process_group / DDP / horovod as well
    distributed = loader_only + b"import torch.distributed as dist\ndist.init_process_group('nccl')\n"
    codes = {rule.code for rule in interested_rules(distributed, list(all_rules().values()))}
    assert "DDP006" in codes
