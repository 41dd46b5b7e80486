"""Cases found on real trainers (issue 10), each a pair: the false positive now silent and the
bug it resembles still found. Line numbers count from the first line of each snippet."""

from __future__ import annotations

import textwrap

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source


def lines(source: str, code: str, path: str = "train.py") -> list[int]:
    result = lint_source(textwrap.dedent(source).lstrip("\n"), path, Settings(select=(code,)))
    return [f.line for f in result.findings if f.code == code]


BARRIER_PINS = """
import os
import torch.distributed as dist
local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl")
dist.barrier(device_ids=[local_rank])
"""


def test_ddp011_barrier_with_device_ids_pins_the_device() -> None:
    assert lines(BARRIER_PINS, "DDP011") == []
    assert lines(BARRIER_PINS.replace("device_ids=[local_rank]", ""), "DDP011") == [4]


UNCALLED_HELPER = """
import os
import torch
import torch.distributed as dist
def pin():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
dist.barrier()
"""


def test_ddp011_a_set_device_helper_nobody_calls_does_not_pin() -> None:
    assert lines(UNCALLED_HELPER, "DDP011") == [6]
    assert lines(UNCALLED_HELPER + "pin()\n", "DDP011") == []


DATAPARALLEL_TEST = """
import torch
def test_loads_a_dataparallel_checkpoint(tmp_path):
    model = torch.nn.DataParallel(torch.nn.Linear(2, 2))
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
"""


def test_dp002_silent_in_unit_tests() -> None:
    assert lines(DATAPARALLEL_TEST, "DP002", path="tests/test_checkpoint.py") == []
    assert lines(DATAPARALLEL_TEST, "DP002", path="train.py") == [3]


ACCUMULATION = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
import torch.distributed as dist
dist.init_process_group("nccl")
model = DDP(torch.nn.Linear(2, 2).cuda())
for i, (x, y) in enumerate(loader):
    loss = model(x).sum()
    if accumulation_steps > 1:
        (loss / accumulation_steps).backward()
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
    else:
        loss.backward()
        optimizer.step()
"""


def test_ddp007_backward_in_the_else_of_accumulation_is_not_accumulating() -> None:
    # The accumulating branch is still reported; the plain backward in `else:` is not.
    assert lines(ACCUMULATION, "DDP007") == [9]


@pytest.mark.parametrize("test", ["accumulation_steps == 1", "accumulation_steps <= 1"])
def test_ddp007_single_step_branch_by_equality(test: str) -> None:
    source = ACCUMULATION.replace("accumulation_steps > 1", test.replace("==", "!=").replace("<=", ">"))
    assert lines(source, "DDP007") == [9]


DEEPSPEED_SAVE = """
import deepspeed
import torch
deepspeed.init_distributed()
torch.save(model.state_dict(), "ckpt.pt")
"""


def test_deepspeed_scripts_are_multi_process() -> None:
    assert lines(DEEPSPEED_SAVE, "DDP008") == [4]
    assert lines(DEEPSPEED_SAVE.replace("deepspeed.init_distributed()", "pass"), "DDP008") == []


FAKE_BACKEND = """
import torch.distributed as dist
dist.init_process_group("fake", rank=0, world_size=8, store=store)
torch.save(model.state_dict(), "ckpt.pt")
"""


def test_fake_backend_is_one_process() -> None:
    assert lines("import torch\n" + FAKE_BACKEND, "DDP008") == []
    assert lines("import torch\n" + FAKE_BACKEND.replace('"fake"', '"nccl"'), "DDP008") == [5]


SINGLE_NODE_ELSE = """
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
def worker(gpu, args):
    dist.init_process_group("nccl", rank=gpu, world_size=args.world_size)
    torch.cuda.set_device(gpu)
def main(args):
    if args.distributed:
        mp.spawn(worker, nprocs=4, args=(args,))
    else:
        worker(0, args)
main(args)
"""


def test_ddp003_literal_only_on_the_single_process_path() -> None:
    assert lines(SINGLE_NODE_ELSE, "DDP003") == []
    # The same literal on the distributed path is the bug.
    assert lines(SINGLE_NODE_ELSE.replace("        worker(0, args)", "        pass").replace(
        "mp.spawn(worker, nprocs=4, args=(args,))", "worker(0, args)"), "DDP003") == [7]


DEFAULT_RANK = """
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
def worker(index, rank=0):
    dist.init_process_group("nccl", rank=rank, world_size=4)
def main():
    mp.spawn(run, nprocs=4)
def run(index):
    worker(index, rank=index)
main()
"""


def test_ddp003_default_counts_only_where_a_caller_omits_it() -> None:
    assert lines(DEFAULT_RANK, "DDP003") == []
    assert lines(DEFAULT_RANK.replace("worker(index, rank=index)", "worker(index)"), "DDP003") == [5]


BACKEND_IFEXP = """
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo" if args.cpu else "nccl")
dist.barrier()
"""


def test_ddp011_conditional_backend_followed_on_both_arms() -> None:
    # One arm is NCCL: that run needs its device pinned (its barrier uses the current device).
    assert lines(BACKEND_IFEXP, "DDP011") == [4]


def test_ddp008_project_helper_serialising_into_a_buffer_is_no_save(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # deit's `_load_checkpoint_for_ema`: torch.save into io.BytesIO() to reload it; no file is written.
    from ddpdoctor.config import Settings as S
    from ddpdoctor.lint.engine import lint_paths

    (tmp_path / "utils.py").write_text(
        "import io\nimport torch\ndef reload(obj):\n    buffer = io.BytesIO()\n    torch.save(obj, buffer)\n"
        "def save_state(obj):\n    torch.save(obj, 'ckpt.pt')\n"
    )
    (tmp_path / "main.py").write_text(
        "import torch.distributed as dist\nimport utils\ndist.init_process_group('nccl')\n"
        "utils.reload(state)\nutils.save_state(state)\n"
    )
    result, _ = lint_paths([str(tmp_path / "main.py")], S(select=("DDP008",)), jobs=1, use_cache=False)
    assert [(f.line, f.code) for f in result.findings] == [(5, "DDP008")]


def test_ddp011_project_helper_that_sets_cuda_visible_devices_pins(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # guided-diffusion's setup_dist(): one visible GPU per process, then init_process_group("nccl").
    from ddpdoctor.config import Settings as S
    from ddpdoctor.lint.engine import lint_paths

    helper = (
        "import os\nimport torch.distributed as dist\ndef setup_dist(rank):\n"
        "    os.environ['CUDA_VISIBLE_DEVICES'] = str(rank % 8)\n    dist.init_process_group('nccl')\n"
    )
    (tmp_path / "dist_util.py").write_text(helper)
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel\nimport dist_util\n"
        "dist_util.setup_dist(rank)\nmodel = DistributedDataParallel(torch.nn.Linear(2, 2).cuda())\n"
    )
    settings = S(select=("DDP011",))
    result, _ = lint_paths([str(tmp_path / "train.py")], settings, jobs=1, use_cache=False)
    assert result.findings == []
    (tmp_path / "dist_util.py").write_text(helper.replace("    os.environ['CUDA_VISIBLE_DEVICES'] = str(rank % 8)\n", ""))
    result, _ = lint_paths([str(tmp_path / "train.py")], settings, jobs=1, use_cache=False)
    assert [(f.line, f.code) for f in result.findings] == [(4, "DDP011")]


def test_ddp009_project_helper_reaching_a_collective_under_a_rank_guard(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ddpdoctor.config import Settings as S
    from ddpdoctor.lint.engine import lint_paths

    (tmp_path / "metrics.py").write_text(
        "import torch.distributed as dist\ndef average(t):\n    dist.all_reduce(t)\n    return t / dist.get_world_size()\n"
        "def log(t):\n    print(t)\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\nimport metrics\ndist.init_process_group('nccl')\n"
        "if dist.get_rank() == 0:\n    metrics.average(loss)\n    metrics.log(loss)\nmetrics.average(acc)\n"
    )
    result, _ = lint_paths([str(tmp_path / "train.py")], S(select=("DDP009",)), jobs=1, use_cache=False)
    assert [(f.line, f.code) for f in result.findings] == [(5, "DDP009")]
    assert "metrics.py line 3" in result.findings[0].message
