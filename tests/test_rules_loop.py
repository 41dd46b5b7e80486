"""The loop helpers of the analysis layer (`iterated_exprs`, `loop_sources`, `enclosing_loops`,
`calls_within`, parameters followed to the caller's scope) and DP001's model of DataParallel's scatter."""

from __future__ import annotations

import textwrap

import libcst as cst

from ddpdoctor.lint.analysis import ModuleModel
from ddpdoctor.lint.rules.dataparallel_uneven_batch import chunk_sizes

SOURCE = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    def train_one_epoch(model, data_loader, sampler, epoch):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(tqdm(data_loader)):
            model(x).sum().backward()

    def main():
        train_loader = DataLoader(ds, batch_size=8)
        aux = DataLoader(ds2, batch_size=8)
        for epoch in range(3):
            train_one_epoch(model, train_loader, sampler, epoch)
            for a, b in zip(train_loader, aux):
                pass
    """
)


def build() -> ModuleModel:
    return ModuleModel.build(cst.parse_module(SOURCE))


def loop_in(facts: ModuleModel, function: str, index: int = 0):
    return [loop for loop in facts.loops if loop.function and loop.function.name == function][index]


def test_loop_sources_see_through_enumerate_tqdm_and_a_parameter() -> None:
    facts = build()
    inner = loop_in(facts, "train_one_epoch")
    sources = facts.loop_sources(inner)
    assert [facts.line_of(c.node) for c in sources] == [12]  # the train_loader DataLoader(...) in main


def test_zip_iterates_every_argument() -> None:
    facts = build()
    zipped = [loop for loop in facts.loops if loop.iter is not None and facts.code_of(loop.iter).startswith("zip")][0]
    assert sorted(facts.line_of(c.node) for c in facts.loop_sources(zipped)) == [12, 13]


def test_enclosing_loops_and_calls_within_follow_helpers() -> None:
    facts = build()
    epoch_loop = [loop for loop in facts.loops if loop.iter is not None and facts.code_of(loop.iter) == "range(3)"][0]
    zipped = [loop for loop in facts.loops if loop.iter is not None and facts.code_of(loop.iter).startswith("zip")][0]
    assert facts.enclosing_loops(zipped) == [epoch_loop]
    assert facts.enclosing_loops(epoch_loop) == []
    attrs = {c.attr for c in facts.calls_within(epoch_loop)}
    assert {"train_one_epoch", "set_epoch", "backward"} <= attrs
    assert "set_epoch" not in {c.attr for c in facts.calls_within(epoch_loop, depth=0)}


def test_chunk_sizes_match_tensor_chunk() -> None:
    import torch

    for batch, devices in [(64, 3), (10, 4), (2, 3), (256, 4), (7, 7), (33, 8)]:
        expected = [len(c) for c in torch.arange(batch).chunk(devices)]
        assert chunk_sizes(batch, devices) == expected
