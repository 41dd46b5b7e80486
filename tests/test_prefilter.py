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


def _interests(source: str, code: str) -> bool:
    return code in {rule.code for rule in interested_rules(source.encode(), list(all_rules().values()))}


def test_every_spelling_of_torch_cuda_amp_is_parsed_for_amp001() -> None:
    spellings = [
        "import torch\nscaler = torch.cuda.amp.GradScaler()\n",
        "from torch.cuda.amp import autocast as ac\nwith ac():\n    pass\n",
        "import torch.cuda.amp as amp\nscaler = amp.GradScaler()\n",
        "from torch.cuda import amp\nscaler = amp.GradScaler()\n",
        "from torch.cuda import (\n    amp,\n)\nwith amp.autocast():\n    pass\n",
        "from torch import cuda\nwith cuda.amp.autocast():\n    pass\n",
    ]
    for source in spellings:
        assert _interests(source, "AMP001"), source
        assert [f.code for f in lint_source(source, "train.py", Settings(select=("AMP001",))).findings] == ["AMP001"], source


def test_the_device_generic_amp_is_not_parsed_for_amp001() -> None:
    # torch.nn's modules mention autocast in every other file; none of them uses torch.cuda.amp.
    assert not _interests("import torch\nwith torch.autocast('cuda'):\n    pass\nscaler = torch.amp.GradScaler()\n", "AMP001")


def test_a_file_that_only_names_nccl_is_not_parsed_for_ddp011() -> None:
    table = 'MAPPINGS = {"ncclAllReduce": "rcclAllReduce", "NCCL_VERSION": "RCCL_VERSION"}\n'
    assert not _interests(table, "DDP011")
    assert _interests(table + "import torch.distributed as dist\ndist.init_process_group('nccl')\n", "DDP011")
    assert _interests("from torch.nn.parallel import DistributedDataParallel\nbackend = 'nccl'\n", "DDP011")


def test_launcher_rank_variables_are_read_by_their_quoted_names_for_ddp004() -> None:
    # A CUDA attribute table is full of `..._RANK` names that are no rank at all.
    assert not _interests('ATTRS = {"CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK": 1}\n', "DDP004")
    for read in ('os.environ["RANK"]', "os.getenv('RANK')", 'os.environ["SLURM_PROCID"]', "os.environ['PMI_RANK']",
                 'os.environ["OMPI_COMM_WORLD_RANK"]', 'os.environ.get("GLOBAL_RANK")'):
        source = f"import os\nimport torch\ntorch.cuda.set_device(int({read}))\n"
        assert _interests(source, "DDP004"), read
        assert [f.code for f in lint_source(source, "train.py").findings] == ["DDP004"], read
