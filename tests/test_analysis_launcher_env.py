"""What a launcher sets in each process's environment, against the literals a script writes."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import ModuleModel, build_analysis, launcher_env


def _model(body: str) -> ModuleModel:
    return build_analysis(cst.parse_module("import os, sys\nimport torch.distributed as dist\n" + textwrap.dedent(body)))


def _world(model: ModuleModel) -> Optional[int]:
    (init,) = model.calls_named("torch.distributed.init_process_group")
    found = launcher_env.literal_world_size(model, init)
    return found[0] if found else None


@pytest.mark.parametrize(
    ("body", "size"),
    [
        ('dist.init_process_group("nccl", world_size=4)', 4),
        ('N = 8\ndist.init_process_group("nccl", world_size=N)', 8),
        ('dist.init_process_group("nccl", world_size=1)', None),
        ('dist.init_process_group("nccl", world_size=int(os.environ["WORLD_SIZE"]))', None),
        ('n = 2 if sys.argv[1:] else 4\ndist.init_process_group("nccl", world_size=n)', None),
        ('dist.init_process_group("nccl")', None),
        ('if "RANK" in os.environ:\n    pass\nelse:\n    dist.init_process_group("gloo", world_size=2)', None),
        ('if os.environ.get("WORLD_SIZE"):\n    n = 1\nelse:\n    n = 2\ndist.init_process_group("gloo", world_size=n)', None),
        ('if "OMPI_COMM_WORLD_SIZE" in os.environ:\n    pass\nelse:\n    dist.init_process_group("gloo", world_size=2)', None),
    ],
)
def test_literal_world_size(body: str, size: Optional[int]) -> None:
    assert _world(_model(body)) == size


def test_launcher_rank_read_is_the_first_by_line_and_none_when_the_script_spawns() -> None:
    model = _model('a = os.environ["LOCAL_RANK"]\nb = int(os.environ["RANK"])\n')
    read = launcher_env.launcher_rank_read(model)
    assert read is not None and read[0] == "LOCAL_RANK" and model.line_of(read[1]) == 3
    spawns = _model('import torch.multiprocessing as mp\nr = os.environ["RANK"]\nmp.spawn(print, nprocs=2)\n')
    assert launcher_env.launcher_rank_read(spawns) is None
    assert launcher_env.launcher_rank_read(_model('p = os.environ["MASTER_PORT"]\n')) is None
