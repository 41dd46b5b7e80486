"""DP001 dataparallel-uneven-batch: `nn.DataParallel` fed batches that do not split evenly over its GPUs."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis import Call, dotted_name
from ddpdoctor.lint.rules.base import Rule

DATA_PARALLEL = "torch.nn.DataParallel"
DATA_LOADER = "torch.utils.data.DataLoader"


def chunk_sizes(batch: int, devices: int) -> list[int]:
    """How `DataParallel`'s scatter splits a batch: `Tensor.chunk(devices)` along dim 0, i.e.
    chunks of ceil(batch / devices) with a smaller last one (and fewer chunks than devices when the
    batch is too small)."""
    size = -(-batch // devices)
    out = [size] * (batch // size)
    if batch % size:
        out.append(batch % size)
    return out


class DataParallelUnevenBatch(Rule):
    """
    Valid:
        # world-size: 4
        loader = DataLoader(dataset, batch_size=64, shuffle=True)
        model = nn.DataParallel(model).cuda()
        for images, target in loader:
            loss = criterion(model(images), target)
            loss.backward()
    Invalid:
        loader = DataLoader(dataset, batch_size=64, shuffle=True)
        model = nn.DataParallel(model, device_ids=[0, 1, 2]).cuda()
        for images, target in loader:
            loss = criterion(model(images), target)
            loss.backward()
    """

    code = "DP001"
    trigger_words = ("DataParallel",)

    def check(self) -> None:
        wrappers = self.model.calls_named(DATA_PARALLEL)
        if not wrappers:
            return
        for wrapper in wrappers:
            devices = self._device_count(wrapper)
            if devices is None or devices[0] < 2:
                continue
            count, source = devices
            reported: set[int] = set()
            for loader in self._feeding_loaders(wrapper):
                if id(loader) in reported:
                    continue
                batch = self._batch_size(loader)
                if batch is None or batch % count == 0:
                    continue
                reported.add(id(loader))
                sizes = ", ".join(str(s) for s in chunk_sizes(batch, count))
                lower, upper = batch - batch % count, batch + count - batch % count
                suggestion = f"{lower} or {upper}" if lower > 0 else str(upper)
                self.report(
                    wrapper.node,
                    f"DataParallel splits each batch of {batch} (DataLoader at line {self.line(loader.node)}) "
                    f"over {count} GPUs ({source}) into chunks of {sizes}: the GPUs get unequal work and "
                    f"BatchNorm sees different-sized chunks. Use a batch size divisible by {count} "
                    f"(e.g. {suggestion}).",
                )

    # ---- the number of devices

    def _device_count(self, wrapper: Call) -> Optional[tuple[int, str]]:
        ids = wrapper.arg(1, "device_ids")
        if ids is not None and not (isinstance(ids, cst.Name) and ids.value == "None"):
            count = self._length(ids, wrapper.order, wrapper, 0)
            if count is None:
                return None  # device_ids we cannot count: do not fall back to --world-size
            return count, f"device_ids at line {self.line(ids)}"
        if self.model.world_size is None:
            return None
        return self.model.world_size, f"all visible GPUs, --world-size {self.model.world_size}"

    def _length(self, expr: cst.BaseExpression, order: int, at: Call, depth: int) -> Optional[int]:
        """The length of a literal list/tuple, of `range(n)`/`list(range(n))` with a constant n, or of
        a variable holding one (one reaching value only)."""
        if depth > 4:
            return None
        if isinstance(expr, (cst.List, cst.Tuple)):
            if any(isinstance(e, cst.StarredElement) for e in expr.elements):
                return None
            return len(expr.elements)
        if isinstance(expr, cst.Call) and expr.args and not any(a.star or a.keyword for a in expr.args):
            callee = dotted_name(expr.func)
            if callee in ("list", "tuple") and len(expr.args) == 1:
                return self._length(expr.args[0].value, order, at, depth + 1)
            if callee == "range":
                constants = [self.model.const_value(a.value, order, at.function) for a in expr.args]
                bounds = [b for b in constants if isinstance(b, int) and not isinstance(b, bool)]
                if len(bounds) == len(constants) and 1 <= len(bounds) <= 2:
                    start, stop = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
                    return max(0, stop - start)
            return None
        if dotted_name(expr) is not None:
            values = [v for v in self.model.reaching_values(expr, order, at.function) if v is not expr]
            lengths = {self._length(v, order, at, depth + 1) for v in values}
            if len(lengths) == 1:
                return lengths.pop()
        return None

    # ---- the batches that reach the model

    def _feeding_loaders(self, wrapper: Call) -> list[Call]:
        """DataLoaders iterated by a loop in which the DataParallel model is called (`model(x)`),
        following the model and the loader through variables, attributes and parameters."""
        out: list[Call] = []
        for call in self.model.calls:
            if not call.loops or call.name is not None or call.dotted is None:
                continue
            origins = self.model.origin_calls(call.node.func, call.order, call.function)
            if wrapper not in origins:
                continue
            for loop in call.loops:
                # Training loops only: there the imbalance costs every step and skews BatchNorm.
                if any(c.attr == "backward" for c in self.model.calls_within(loop, depth=2)):
                    out.extend(c for c in self.model.loop_sources(loop) if c.name == DATA_LOADER)
        return out

    def _batch_size(self, loader: Call) -> Optional[int]:
        if loader.has_star_args() or loader.arg(4, "batch_sampler") is not None:
            return None
        expr = loader.arg(1, "batch_size")
        if expr is None:
            return None  # the default of 1 is never what a DataParallel trainer means: stay silent
        value = self.model.const_value(expr, loader.order, loader.function)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            return None
        name = dotted_name(expr)
        if name is not None and "." in name:
            # `args.batch_size = int(args.batch_size / ngpus_per_node)` in another function mutates
            # the shared namespace: any assignment to the attribute that is not the same constant
            # makes the value undecidable here.
            for assignment in self.model.assignments_to(name):
                other = self.model.const_value(assignment.value, assignment.order, assignment.function)
                if other != value:
                    return None
        return value
