"""Edges no other test stated, found by a mutation sample (issue 10): how a test file is named, a
value unpacked on the second of two paths, the local rank after an augmented assignment, what a
message calls a device argument or a sampler, the cache's key, a worker given up in a parallel run,
an ordinary syntax error in a file that only looks deep, and suppression comments in any case."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.analysis import ModuleModel, build_analysis, harness, ranks
from ddpdoctor.lint import engine
from ddpdoctor.lint.engine import FileResult, lint_paths, lint_source


def model_of(source: str, path: str = "train.py") -> ModuleModel:
    return build_analysis(cst.parse_module(textwrap.dedent(source)), path)


def messages(source: str, code: str) -> list[str]:
    findings = lint_source(textwrap.dedent(source), "train.py", Settings(select=(code,))).findings
    assert {f.code for f in findings} <= {code}
    return [f.message for f in findings]


# ------------------------------------------------------------------------------ analysis facts


@pytest.mark.parametrize(
    "name, expected",
    [
        ("test_allreduce.py", True),
        ("allreduce_test.py", True),
        ("allreduce_tests.py", True),
        ("conftest.py", True),
        ("train.py", False),
        ("latest.py", False),  # ends in "test" but not in "_test.py"
        ("contest.py", False),
    ],
)
def test_a_test_module_is_known_by_its_file_name(name: str, expected: bool) -> None:
    # no test harness imported: only the name can tell
    assert harness.is_test_module(model_of("import torch\n", f"pkg/{name}")) is expected


@pytest.mark.parametrize(
    "first, second",
    [("ds, loader = build(ds)", "ds, loader = cached"), ("ds, loader = cached", "ds, loader = build(ds)")],
)
def test_an_unpacked_return_is_followed_beside_a_path_that_unpacks_no_call(first: str, second: str) -> None:
    """`ds, loader = cached` tells nothing about the loader; the other path's `build()` still does,
    whichever of the two is written first."""
    model = model_of(
        f"""
        from torch.utils.data import DataLoader
        def build(ds):
            return ds, DataLoader(ds, shuffle=True)
        def main(fresh, cached, ds):
            if fresh:
                {first}
            else:
                {second}
            picked = loader
        """
    )
    picked = model.assignments_to("picked")[0]
    origins = model.origin_calls(picked.value, picked.order, picked.function)
    assert [c.name for c in origins] == ["torch.utils.data.DataLoader"]


def test_the_local_rank_is_found_after_an_augmented_assignment() -> None:
    model = model_of(
        """
        import os
        def main(args):
            args.batch_size //= 2
            local_rank = int(os.environ["LOCAL_RANK"])
            X()
        """
    )
    point = next(c for c in model.calls if c.dotted == "X")
    assert ranks.local_rank_expression(model, point.order, point.ctx) == "local_rank"


# ------------------------------------------------------------------------------------ messages

TORCHRUN = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
"""


@pytest.mark.parametrize(
    "use, where",
    [
        ("model = DDP(net.cuda(local_rank), device_ids=[0])", "device_ids"),
        ("model = DDP(net.cuda(device=0), device_ids=[local_rank])", ".cuda()"),
        ("model = DDP(net.to(device=0), device_ids=[local_rank])", ".to()"),
        # the index inside torch.device(...) reached from the .to() that uses it: named by that use
        ("model = DDP(net.to(torch.device(0)), device_ids=[local_rank])", ".to()"),
    ],
)
def test_hard_coded_device_message_names_the_argument_it_is_given_to(use: str, where: str) -> None:
    (message,) = messages(TORCHRUN + f"    {use}\n", "DDP003")
    assert message.startswith(f"{where} is given the hard-coded device 0 in a multi-process script")


@pytest.mark.parametrize(
    "rank, shown",
    [
        # 40 characters: shown whole
        ("torch.distributed.get_rank(group=worlds)", "torch.distributed.get_rank(group=worlds)"),
        # longer: cut to 37 characters and an ellipsis
        (
            "torch.distributed.get_rank(group=torch.distributed.group.WORLD)",
            "torch.distributed.get_rank(group=torc...",
        ),
    ],
)
def test_global_rank_device_message_cuts_a_long_rank_expression(rank: str, shown: str) -> None:
    (message,) = messages(
        f"""
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        worlds = None
        torch.cuda.set_device({rank})
        """,
        "DDP004",
    )
    assert message.startswith(f"torch.cuda.set_device() uses the global rank `{shown}` as a CUDA device index")


def test_unused_sampler_without_a_name_is_called_sampler_in_the_message() -> None:
    (message,) = messages(
        """
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler
        def main(train_set):
            dist.init_process_group("nccl")
            DistributedSampler(train_set)
            return DataLoader(train_set, batch_size=32)
        """,
        "DDP006",
    )
    assert "although the DistributedSampler `sampler` (line 6) is built for its dataset and never used" in message
    assert message.endswith("Pass `sampler=sampler` and call `sampler.set_epoch(epoch)` every epoch.")


# ---------------------------------------------------------------------------- cache and engine

DATAPARALLEL = """\
import torch
from torch import nn
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=30, shuffle=True)
model = nn.DataParallel(nn.Linear(16, 2), device_ids=None).cuda()
for x, y in loader:
    model(x.cuda()).sum().backward()
"""


def test_a_cached_result_is_not_reused_for_another_world_size(tmp_path: Path) -> None:
    """A batch of 30 splits unevenly over 4 GPUs and evenly over 3: the same file, two answers."""
    (tmp_path / "t.py").write_text(DATAPARALLEL)

    def lint(world_size: int) -> list[str]:
        settings = Settings(select=("DP001",), world_size=world_size)
        run, _ = lint_paths([str(tmp_path / "t.py")], settings, cache_root=tmp_path)
        return [f"{f.code} {f.line}" + (" cached" if run.files[0].cached else "") for f in run.findings]

    assert lint(4) == ["DP001 6"]
    assert lint(3) == []
    assert lint(4) == ["DP001 6 cached"]


def test_a_file_a_parallel_worker_fails_on_gets_ddp999_and_the_others_their_findings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Enough files for the worker pool (forked, so they run the patched task); the analysis of
    one file raises inside its worker, and the parent gives that file up with the file's own
    codes: a DDP999 where DDP999 is selected, nothing where it is not."""
    real = engine._lint_file_task

    def fails_on_boom(task: engine.Task) -> FileResult:
        if task[0].endswith("boom.py"):
            raise ZeroDivisionError
        return real(task)

    monkeypatch.setattr(engine, "_lint_file_task", fails_on_boom)
    header = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    for name in ["boom.py", *(f"ok{number:02d}.py" for number in range(engine.PARALLEL_THRESHOLD))]:
        (tmp_path / name).write_text(header)
    for select, lost in ((("AMP001", "DDP999"), ["DDP999 1"]), (("AMP001",), [])):
        run, _ = lint_paths([str(tmp_path)], Settings(select=select), jobs=2, use_cache=False)
        by_file = {Path(r.path).name: [f"{f.code} {f.line}" for f in r.findings] for r in run.files}
        assert by_file.pop("boom.py") == lost
        assert by_file == {f"ok{number:02d}.py": ["AMP001 2"] for number in range(engine.PARALLEL_THRESHOLD)}


def test_an_ordinary_syntax_error_in_a_file_that_looks_deep_is_reported_as_such() -> None:
    """150 nested brackets make the file worth the exact depth check, which Python passes; the
    error is the bad `def` on line 4."""
    source = "import torch\nx = " + "[" * 150 + "]" * 150 + "\nscaler = torch.cuda.amp.GradScaler()\ndef f(:\n    pass\n"
    (finding,) = lint_source(source, "t.py", Settings(select=("ALL",))).findings
    assert (finding.code, finding.line) == ("DDP999", 4)
    assert finding.message.startswith("cannot parse: ")
    assert "too deeply nested" not in finding.message


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
