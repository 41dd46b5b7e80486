"""The facts a finding's message states for the user to act on: the sizes to pick, the line of the
guard, where the world size comes from. The fixtures pin where findings are; these pin what they say."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_paths, lint_source


def messages(source: str, code: str) -> list[str]:
    findings = lint_source(textwrap.dedent(source), "train.py", Settings(select=(code,))).findings
    assert {f.code for f in findings} <= {code}
    return [f.message for f in findings]


@pytest.mark.parametrize(
    "batch, chunks, suggestion",
    [
        (10, "3, 3, 3, 1", "8 or 12"),
        (3, "1, 1, 1", "4"),  # smaller than the GPU count: no smaller size to suggest
        (33, "9, 9, 9, 6", "32 or 36"),
    ],
)
def test_dataparallel_uneven_batch_names_the_chunks_and_a_divisible_size(batch: int, chunks: str, suggestion: str) -> None:
    (message,) = messages(
        f"""
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(dataset, batch_size={batch})
        model = torch.nn.DataParallel(net, device_ids=[0, 1, 2, 3]).cuda()
        for x, y in loader:
            model(x.cuda()).sum().backward()
        """,
        "DP001",
    )
    assert f"each batch of {batch} (DataLoader at line 4) over 4 GPUs (device_ids at line 5)" in message
    assert f"into chunks of {chunks}:" in message
    assert message.endswith(f"(e.g. {suggestion}).")


@pytest.mark.parametrize(
    "world_size, described",
    [
        ("", "comes from the launcher (WORLD_SIZE)"),
        (", world_size=-1", "comes from the launcher (WORLD_SIZE)"),
        (", world_size=4", "is 4"),
        (', world_size=int(os.environ["WORLD_SIZE"])', 'is int(os.environ["WORLD_SIZE"])'),
        (", world_size=torch.cuda.device_count()", "is torch.cuda.device_count()"),
    ],
)
def test_literal_rank_message_says_where_the_world_size_comes_from(world_size: str, described: str) -> None:
    (message,) = messages(
        f"""
        import os
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl", rank=0{world_size})
        """,
        "DDP003",
    )
    assert message.startswith(f"init_process_group is given the literal rank=0 while the world size {described}:")


def test_literal_rank_is_not_reported_when_the_world_may_be_one_process() -> None:
    source = """
    import sys
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=0, world_size=int(sys.argv[1]))
    dist.init_process_group("gloo", rank=0, world_size=1)
    """
    assert messages(source, "DDP003") == []


def test_collective_in_a_helper_module_names_the_guard_line(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "sync.py").write_text(
        "import torch.distributed as dist\n\n\ndef wait_for_everyone():\n    dist.barrier()\n"
    )
    (tmp_path / "train.py").write_text(
        textwrap.dedent(
            """\
            import torch.distributed as dist
            from sync import wait_for_everyone
            dist.init_process_group("nccl")
            if dist.get_rank() == 0:
                wait_for_everyone()
            """
        )
    )
    run, _ = lint_paths([str(tmp_path / "train.py")], Settings(select=("DDP009",)), use_cache=False)
    (finding,) = run.findings
    assert finding.line == 5
    assert "reaches the collective torch.distributed.barrier (" in finding.message
    assert "sync.py line 5)" in finding.message
    assert "only called by the main process (guarded at line 4)" in finding.message


def test_world_size_message_names_the_option_that_spans_nodes() -> None:
    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "DDP005" / "multinode_spawn_nodes_flag.py"
    (message,) = messages(fixture.read_text(), "DDP005")
    assert "world_size is torch.cuda.device_count() (line 16)" in message
    assert "launched in a way that can span nodes (option --nodes at line 39)" in message


def test_hard_coded_device_message_names_the_argument() -> None:
    (message,) = messages(
        """
        import os
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        model = DDP(net.cuda(), device_ids=[local_rank], output_device=0)
        """,
        "DDP003",
    )
    assert message.startswith(
        "output_device is given the hard-coded device 0 in a multi-process script (init_process_group at line 6)"
    )


def test_unpinned_nccl_message_lists_what_would_pin_the_gpu() -> None:
    (message,) = messages(
        """
        import torch.distributed as dist
        dist.init_process_group("nccl")
        model = net.cuda()
        """,
        "DDP011",
    )
    assert message.startswith(
        "NCCL process group initialised but this script never pins its GPU (no torch.cuda.set_device, "
        "torch.cuda.device or device_id=), and it uses the current CUDA device (line 4: bare .cuda())"
    )


def test_dataparallel_uneven_batch_through_variables() -> None:
    (message,) = messages(
        """
        import argparse
        import torch
        from torch.utils.data import DataLoader
        args = argparse.Namespace()
        args.batch_size = 10
        gpus = list(range(3))
        loader = DataLoader(dataset, batch_size=args.batch_size)
        model = torch.nn.DataParallel(net, device_ids=gpus).cuda()
        for x, y in loader:
            model(x.cuda()).sum().backward()
        """,
        "DP001",
    )
    assert "each batch of 10 (DataLoader at line 8) over 3 GPUs (device_ids at line 9) into chunks of 4, 4, 2:" in message


def test_clip_after_the_scaler_step_names_the_step() -> None:
    (message,) = messages(
        """
        import torch
        scalers = [torch.amp.GradScaler("cuda")]
        for x in loader:
            scalers[0].scale(model(x).sum()).backward()
            scalers[0].step(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scalers[0].update()
        """,
        "AMP002",
    )
    assert message.startswith(
        "torch.nn.utils.clip_grad_norm_() runs after `scalers[0].step(optimizer)` at line 6: the optimizer already "
        "stepped with unclipped gradients"
    )


@pytest.mark.parametrize(
    "setup, evidence",
    [
        ("import horovod.torch as hvd\nhvd.init()\n", "hvd.init() at line 3"),
        ("import torch.multiprocessing as mp\nmp.spawn(worker, nprocs=2)\n", "mp.spawn at line 3"),
    ],
)
def test_unsharded_loader_message_names_what_makes_the_script_distributed(setup: str, evidence: str) -> None:
    source = "def worker(i):\n    loader = DataLoader(dataset, batch_size=32, shuffle=True)\n    return loader\n"
    (message,) = messages("from torch.utils.data import DataLoader\n" + setup + source, "DDP006")
    assert f"in a distributed script ({evidence}):" in message


def test_world_size_message_names_the_node_count_assignment() -> None:
    (message,) = messages(
        """
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        def train(gpu, cfg):
            world_size = torch.cuda.device_count()
            dist.init_process_group("nccl", world_size=world_size, rank=cfg.nnodes * gpu)
        def main(cfg):
            cfg.nnodes = 2
            mp.spawn(train, nprocs=torch.cuda.device_count(), args=(cfg,))
        """,
        "DDP005",
    )
    assert "launched in a way that can span nodes (cfg.nnodes at line 9)" in message


def test_collective_under_rank_guard_message_says_where_to_call_it() -> None:
    (message,) = messages(
        """
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        t = torch.zeros(1)
        if dist.get_rank() == 0:
            dist.all_reduce(t)
        """,
        "DDP009",
    )
    assert message.startswith("dist.all_reduce() is a collective that every rank must call")
    assert message.endswith("(guarded at line 6): the other ranks never enter it and the job hangs until the "
                            "timeout. Call it outside the rank-specific branch.")


def test_dataparallel_message_says_what_to_use_instead() -> None:
    (message,) = messages("import torch\nmodel = torch.nn.DataParallel(net)\n", "DP002")
    assert message.endswith("Use DistributedDataParallel with one process per GPU (torchrun).")


def test_unpinned_nccl_message_shows_three_uses_and_counts_the_rest() -> None:
    (message,) = messages(
        """
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        a = net.cuda()
        b = net.cuda()
        dist.barrier()
        torch.cuda.synchronize()
        c = net.cuda()
        """,
        "DDP011",
    )
    assert (
        "(line 5: bare .cuda(); line 6: bare .cuda(); line 7: dist.barrier() without device_ids; and 2 more)"
        in message
    )
    assert message.endswith(
        "can hang NCCL. Call torch.cuda.set_device(local_rank) before init_process_group, or pass "
        'device_id=torch.device("cuda", local_rank).'
    )


def test_clip_through_an_alias_names_both_spellings() -> None:
    (message,) = messages(
        """
        import torch
        from torch.nn.utils import clip_grad_norm_ as clip
        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            scaler.scale(model(x).sum()).backward()
            clip(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        """,
        "AMP002",
    )
    assert message.startswith("clip() (torch.nn.utils.clip_grad_norm_) clips gradients that are still multiplied")


@pytest.mark.parametrize(
    "use, what",
    [("torch.cuda.set_device(rank)", "torch.cuda.set_device()"), ('net.to(f"cuda:{rank}")', ".to()")],
)
def test_global_rank_device_message_names_where_the_rank_is_read(use: str, what: str) -> None:
    (message,) = messages(
        f"""
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        {use}
        """,
        "DDP004",
    )
    assert message.startswith(f"{what} uses the global rank `dist.get_rank()` (line 5) as a CUDA device index")


def test_hard_coded_output_device_given_by_position() -> None:
    # DistributedDataParallel(module, device_ids, output_device, ...)
    (message,) = messages(
        """
        import os
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        model = DDP(net.cuda(), [local_rank], 0)
        """,
        "DDP003",
    )
    assert message.startswith("output_device is given the hard-coded device 0 in a multi-process script")


@pytest.mark.parametrize(
    "setup, named",
    [
        ('import torch.distributed as dist\ndist.init_process_group("nccl")', "init_process_group"),
        ("import horovod.torch as hvd\nhvd.init()", "hvd.init()"),
        ("import deepspeed\ndeepspeed.init_distributed()", "DeepSpeed"),
    ],
)
def test_dataparallel_inside_a_rank_names_the_process_group_setup(setup: str, named: str) -> None:
    source = f"import torch\n{setup}\nmodel = torch.nn.DataParallel(net).cuda()\n"
    (message,) = messages(source, "DP003")
    assert f"starts a process group ({named} at line 3)" in message


def test_unscaled_horovod_lr_says_where_the_variable_came_from() -> None:
    (message,) = messages(
        """
        import argparse
        import horovod.torch as hvd
        import torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--base-lr", type=float, default=0.1)
        args = parser.parse_args()
        hvd.init()
        lr = args.base_lr
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        """,
        "HVD001",
    )
    assert message.startswith(
        "The optimizer wrapped by hvd.DistributedOptimizer at line 11 uses lr=lr (args.base_lr), not scaled by hvd.size()"
    )


def test_ddp001_names_the_helper_that_built_the_loader() -> None:
    project = Path(__file__).parent.parent / "fixtures" / "projects" / "loader_and_sampler_from_a_data_helper"
    result, _ = lint_paths([str(project / "train.py")], Settings(), jobs=1, use_cache=False)
    (finding,) = [f for r in result.files for f in r.findings]
    assert finding.code == "DDP001"
    assert "comes from build_loaders() (" in finding.message
    assert "data.py line 13 builds it on a shuffling DistributedSampler" in finding.message
    assert "epoch loop (line 25)" in finding.message
    assert "Call `train_loader.sampler.set_epoch(epoch)`" in finding.message
