"""What the devices layer answers directly: the text that makes a hard-coded or global-rank device
index name the local rank (the edit DDP007 and DDP008 propose)."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import ModuleModel, build_analysis, devices


@pytest.mark.parametrize(
    "index, replacement",
    [
        ("0", "local_rank"),  # an int index: the local rank itself
        ("rank % 8", "local_rank"),  # a computed index
        ('"cuda:1"', 'f"cuda:{local_rank}"'),
        ("'cuda:1'", "f'cuda:{local_rank}'"),  # the string keeps its quotes
        ('u"cuda:0"', 'f"cuda:{local_rank}"'),
        ('U"cuda:0"', 'f"cuda:{local_rank}"'),
        ('r"cuda:0"', None),  # a raw or byte string is not rewritten into an f-string
        ('b"cuda:0"', None),
        ('"cuda"', None),  # no index to replace
        ('"cpu"', None),
    ],
)
def test_index_replacement_names_the_local_rank(index: str, replacement: Optional[str]) -> None:
    assert devices.index_replacement(cst.parse_expression(index), "local_rank") == replacement


def test_index_replacement_refuses_a_quote_the_local_rank_expression_uses() -> None:
    node = cst.parse_expression('"cuda:0"')
    assert devices.index_replacement(node, 'int(os.environ["LOCAL_RANK"])') is None
    assert devices.index_replacement(node, "int(os.environ['LOCAL_RANK'])") == (
        "f\"cuda:{int(os.environ['LOCAL_RANK'])}\""
    )


def model_of(source: str) -> ModuleModel:
    return build_analysis(cst.parse_module(textwrap.dedent(source)))


def test_written_index_reads_the_index_as_written_in_each_spelling() -> None:
    model = model_of(
        """
        import torch
        model.to(f"cuda:{rank}")
        model.to(torch.device("cuda", rank))
        model.to("cuda:{}".format(rank))
        model.cuda(rank)
        model.to(torch.device("cpu", rank))
        model.to(f"cuda:{rank}:0")
        torch.load(path, map_location="cuda:{}".format(rank))
        torch.load(path, map_location=rank)  # a bare int names a GPU only where the API says so
        """
    )
    arguments = [a for a in devices.device_arguments(model) if a.where != "torch.device()"]
    written = [devices.written_index(model, argument) for argument in arguments]
    assert [None if w is None else model.code_of(w) for w in written] == [
        "rank", "rank", "rank", "rank", None, None, "rank", None,
    ]


@pytest.mark.parametrize(
    "body, expected",
    [
        # bound before the call, on every path, to the local rank's device
        ('device = torch.device("cuda", local_rank)\ntorch.load(path)', "device"),
        ('device = f"cuda:{local_rank}"\ntorch.load(path)', "device"),
        # bound after the call, or under a condition the call does not share: not certain
        ('torch.load(path)\ndevice = torch.device("cuda", local_rank)', None),
        ('if local_rank:\n    device = torch.device("cuda", local_rank)\ntorch.load(path)', None),
        # the device a set_device call pinned earlier
        ("torch.cuda.set_device(local_rank)\ntorch.load(path)", 'f"cuda:{local_rank}"'),
        ("torch.load(path)\ntorch.cuda.set_device(local_rank)", None),
        ("if local_rank:\n    torch.cuda.set_device(local_rank)\ntorch.load(path)", None),
        ("torch.cuda.set_device(rank)\ntorch.load(path)", None),  # a global rank is not this GPU
    ],
)
def test_local_device_expression_names_this_process_gpu_only_when_certain(body: str, expected: Optional[str]) -> None:
    model = model_of(
        "import os\nimport torch\nimport torch.distributed as dist\n"
        "def main(path):\n"
        '    local_rank = int(os.environ["LOCAL_RANK"])\n'
        "    rank = dist.get_rank()\n" + textwrap.indent(body, "    ") + "\n"
    )
    (load,) = model.calls_named("torch.load")
    assert devices.local_device_expression(model, load) == expected


def test_visible_devices_writes_in_each_spelling() -> None:
    model = model_of(
        """
        import os
        os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)
        os.environ.setdefault("HIP_VISIBLE_DEVICES", "0")
        os.putenv("NVIDIA_VISIBLE_DEVICES", "0")
        os.environ.update({"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "1"})
        env.update(CUDA_VISIBLE_DEVICES="1")
        os.environ["OMP_NUM_THREADS"] = "4"
        os.environ.update({"OMP_NUM_THREADS": "1"})
        def child_env(gpu):
            os.environ.update(CUDA_VISIBLE_DEVICES=str(gpu))
        """
    )
    assert [model.line_of(node) for node in devices.visible_devices_writes(model)] == [3, 4, 5, 6, 7, 11]
    (helper,) = model.functions
    assert [model.line_of(node) for node in devices.visible_devices_writes(model, within=helper)] == [11]
