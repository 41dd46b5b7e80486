"""Lazy layers a module value holds, and whether something gave them their shapes before a call."""

from __future__ import annotations

import textwrap

import libcst as cst

from ddpdoctor.lint.analysis import Call, ModuleModel, build_analysis, lazy

HEAD = """\
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
"""


def _model(body: str) -> ModuleModel:
    return build_analysis(cst.parse_module(HEAD + textwrap.dedent(body)))


def _wrap(model: ModuleModel) -> Call:
    (wrap,) = model.calls_named("torch.nn.parallel.DistributedDataParallel")
    return wrap


def _lazy_lines(model: ModuleModel) -> list[int]:
    wrap = _wrap(model)
    return sorted(m.line_of(c.node) for m, c in lazy.lazy_layers(model, wrap.arg(0), wrap.order, wrap.function))


def test_layers_are_found_through_helpers_containers_and_transforms() -> None:
    model = _model(
        """
        def build():
            layers = [nn.Linear(4, 4), nn.LazyLinear(8)]
            return nn.Sequential(nn.ModuleList(layers), nn.LazyConv1d(3, 1))
        net = nn.SyncBatchNorm.convert_sync_batchnorm(build().cuda())
        net = DDP(net)
        """
    )
    assert _lazy_lines(model) == [6, 7]


def test_a_class_constructor_holds_its_lazy_layers_unless_it_runs_its_own_forward() -> None:
    holds = _model(
        """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.LazyLinear(2)
        DDP(Net())
        """
    )
    assert _lazy_lines(holds) == [8]
    probes = _model(
        """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.LazyLinear(2)
                self(torch.zeros(1, 3))
        DDP(Net())
        """
    )
    assert _lazy_lines(probes) == []


def test_only_torch_lazy_layers_count() -> None:
    model = _model(
        """
        from mylib import LazyLinear
        net = nn.Sequential(LazyLinear(3), nn.Linear(3, 3))
        DDP(net)
        """
    )
    assert _lazy_lines(model) == []
    assert lazy.is_lazy_layer("torch.nn.modules.conv.LazyConv2d")
    assert not lazy.is_lazy_layer("torch.nn.modules.lazy.LazyModuleMixin")


def _materialised(body: str) -> bool:
    model = _model(body)
    wrap = _wrap(model)
    arg = wrap.arg(0)
    assert arg is not None
    return lazy.materialised_before(model, arg, wrap)


def test_a_forward_or_a_state_dict_before_the_wrap_materialises() -> None:
    assert _materialised(
        """
        net = nn.Sequential(nn.LazyLinear(3))
        net(torch.zeros(1, 5))
        net = DDP(net)
        """
    )
    assert _materialised(
        """
        net = nn.Sequential(nn.LazyLinear(3))
        net.load_state_dict(torch.load("w.pt"))
        net = DDP(net)
        """
    )


def test_a_forward_after_the_wrap_or_in_a_function_called_after_it_does_not() -> None:
    assert not _materialised(
        """
        net = nn.Sequential(nn.LazyLinear(3))
        wrapped = DDP(net)
        net(torch.zeros(1, 5))
        """
    )
    assert not _materialised(
        """
        def train(m):
            m(torch.zeros(1, 5))
        def main():
            net = nn.Sequential(nn.LazyLinear(3))
            wrapped = DDP(net)
            train(net)
        """
    )
    assert not _materialised(
        """
        other = nn.Sequential(nn.LazyLinear(3))
        other(torch.zeros(1, 5))
        net = nn.Sequential(nn.LazyLinear(3))
        net = DDP(net)
        """
    )
