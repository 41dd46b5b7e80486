"""The cheap pre-filter: every rule names the API words it needs, and a file that mentions none of
them is never parsed (that is what keeps the linter fast on ordinary code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional
from unittest import mock

import libcst
import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.analysis.imports import ProjectSources, _import_statements
from ddpdoctor.lint.engine import interested_rules, lint_source, project_interested_rules
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


# ---- the project-aware pre-filter: a file's own bytes or those of its import closure

DATA = (
    "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n\n\n"
    "def loaders(ds):\n    return DataLoader(ds, sampler=DistributedSampler(ds))\n"
)
TRAIN = (
    "import torch.distributed as dist\nfrom {module} import loaders\n\n\n"
    "def main(ds, step):\n    dist.init_process_group('nccl')\n    loader = loaders(ds)\n"
    "    for epoch in range(10):\n        for batch in loader:\n            step(batch).backward()\n"
)


def _project_codes(root: Path, name: str, data: Optional[bytes] = None) -> set[str]:
    project = ProjectSources.for_paths([root])
    path = root / name
    own = path.read_bytes() if data is None else data
    return {r.code for r in project_interested_rules(own, str(path), list(all_rules().values()), project)}


def test_a_rule_whose_api_lives_in_an_imported_module_is_interested(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(DATA)
    (tmp_path / "train.py").write_text(TRAIN.format(module="data"))
    own = (tmp_path / "train.py").read_bytes()
    assert "DDP001" not in {r.code for r in interested_rules(own, list(all_rules().values()))}
    assert "DDP001" in _project_codes(tmp_path, "train.py")
    # Through a chain of imports (the analysis follows re-exports and helpers' own imports too).
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("from .inner import loaders\n")
    (tmp_path / "pkg/inner.py").write_text("from data import loaders\n")
    (tmp_path / "chain.py").write_text(TRAIN.format(module="pkg"))
    assert "DDP001" in _project_codes(tmp_path, "chain.py")


def test_modules_outside_the_closure_and_torch_names_do_not_interest(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(DATA)
    (tmp_path / "other.py").write_text("import data\n")
    (tmp_path / "train.py").write_text(TRAIN.format(module="other_helpers").replace("import loaders", "import x"))
    assert "DDP001" not in _project_codes(tmp_path, "train.py")
    # `from torch.utils.data import ...` in a copy of torch's tree is never followed by the analysis.
    (tmp_path / "torch/utils/data").mkdir(parents=True)
    (tmp_path / "torch/__init__.py").write_text("")
    (tmp_path / "torch/utils/__init__.py").write_text("")
    (tmp_path / "torch/utils/data/__init__.py").write_text("class DistributedSampler: ...\n")
    (tmp_path / "job.py").write_text(TRAIN.format(module="torch.utils.data"))
    assert "DDP001" not in _project_codes(tmp_path, "job.py")


def test_each_module_of_the_closure_is_read_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data.py").write_text(DATA.replace("DistributedSampler", "Sampler"))
    for i in range(5):
        (tmp_path / f"train{i}.py").write_text(TRAIN.format(module="data"))
    project = ProjectSources.for_paths([tmp_path])
    opened: list[str] = []
    real_open = open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    for i in range(5):
        path = tmp_path / f"train{i}.py"
        with project.scope():
            project_interested_rules(path.read_bytes(), str(path), list(all_rules().values()), project)
            # The module read is this file's dependency (its cached result must follow data.py's edits).
            assert project.dependencies()[tmp_path / "data.py"]
    assert opened.count(str(tmp_path / "data.py")) == 1


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import a.b as c, d\n", [(0, "a.b", ()), (0, "d", ())]),
        ("from . import x, y as z\n", [(1, "", ("x", "y"))]),
        ("from ..pkg.mod import (\n    one,\n    two as three,\n)\n", [(2, "pkg.mod", ("one", "two"))]),
        ("def f():\n    from utils import helper  # a comment\n", [(0, "utils", ("helper",))]),
        ("from .data import *\n", [(1, "data", ())]),
        ("x = 1  # not an import\nimportant = 2\n", []),
    ],
)
def test_import_statements_are_read_from_bytes(source: str, expected: list[Any]) -> None:
    assert list(_import_statements(source.encode())) == expected


def test_only_a_file_that_trains_or_launches_reads_its_closure(tmp_path: Path) -> None:
    """Library code (no process group, launcher, rank or epoch in its bytes) is judged by its own
    bytes: most of a large tree, where walking every closure would cost more than the parse it
    saves."""
    (tmp_path / "data.py").write_text(DATA)
    (tmp_path / "layers.py").write_text("import torch\nfrom data import loaders\n\n\ndef width(x):\n    return x.shape[-1]\n")
    project = ProjectSources.for_paths([tmp_path])
    path = tmp_path / "layers.py"
    with project.scope():
        codes = {r.code for r in project_interested_rules(path.read_bytes(), str(path), list(all_rules().values()), project)}
        assert tmp_path / "data.py" not in project.dependencies()
    assert "DDP001" not in codes
    (tmp_path / "layers.py").write_text(
        path.read_text() + "\n\ndef fit(model, ds):\n    for epoch in range(3):\n        model(ds).sum().backward()\n"
    )
    assert "DDP001" in _project_codes(tmp_path, "layers.py")


@pytest.mark.parametrize(
    ("source", "interested"),
    [
        (b"from torch.nn.parallel import DistributedDataParallel as DDP\nnet = DDP(net)\n", True),
        (b"import torch\nself.model = torch.nn.parallel.DistributedDataParallel(self.model)\n", True),
        (b"from torch.nn.parallel import DistributedDataParallel\nself.model = DistributedDataParallel(m)\n", True),
        # Only the class's name (an import, a docstring): no wrap here, so no holder built before one.
        (b"from torch.nn.parallel import DistributedDataParallel\nprint(DistributedDataParallel)\n", False),
    ],
)
def test_ddp010_is_interested_in_a_file_that_rebinds_a_name_to_the_wrapper(source: bytes, interested: bool) -> None:
    codes = {rule.code for rule in interested_rules(source, list(all_rules().values()))}
    assert ("DDP010" in codes) is interested
