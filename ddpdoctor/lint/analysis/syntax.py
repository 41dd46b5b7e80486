"""Pure helpers on libcst nodes: dotted names, cheap walks, literals, and the canonical torch names.

The bottom layer of the analysis: it imports nothing of ddpdoctor. Everything above reads names and
literals through here, so one spelling rule holds everywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Iterator, Optional, Protocol

import libcst as cst

Expr = cst.BaseExpression

# Canonical spellings: torch re-exports the same object from several modules.
CANONICAL_NAMES: dict[str, str] = {
    "torch.nn.parallel.distributed.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.data_parallel.DataParallel": "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel": "torch.nn.DataParallel",
    "torch.nn.modules.batchnorm.SyncBatchNorm": "torch.nn.SyncBatchNorm",
    "torch.nn.modules.SyncBatchNorm": "torch.nn.SyncBatchNorm",
    "torch.utils.data.distributed.DistributedSampler": "torch.utils.data.DistributedSampler",
    "torch.utils.data.dataloader.DataLoader": "torch.utils.data.DataLoader",
    "torch.distributed.distributed_c10d": "torch.distributed",
    "torch.cuda.amp.grad_scaler.GradScaler": "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.autocast_mode.autocast": "torch.cuda.amp.autocast",
    "torch.nn.utils.clip_grad.clip_grad_norm_": "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_": "torch.nn.utils.clip_grad_value_",
    "torch.multiprocessing.spawn.spawn": "torch.multiprocessing.spawn",
}


def canonical(name: str) -> str:
    for prefix, replacement in CANONICAL_NAMES.items():
        if name == prefix or name.startswith(prefix + "."):
            return replacement + name[len(prefix):]
    return name


def dotted_name(node: Optional[cst.CSTNode]) -> Optional[str]:
    """`a.b.c` for Name/Attribute chains, else None."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None



def last_segment(name: str) -> str:
    return name.rsplit(".", 1)[-1]


_SKIP_FIELD_PREFIXES = (
    "whitespace", "lpar", "rpar", "comma", "leading_lines", "lines_after", "header", "footer",
    "semicolon", "equal", "colon", "dot", "operator", "star", "lbracket", "rbracket", "lbrace",
    "rbrace", "asynchronous", "trailing_whitespace", "first_line", "last_line", "newline",
)
_field_cache: dict[type, tuple[str, ...]] = {}


def child_fields(cls: type) -> tuple[str, ...]:
    names = _field_cache.get(cls)
    if names is None:
        names = tuple(
            f.name for f in dataclasses.fields(cls) if not f.name.startswith(_SKIP_FIELD_PREFIXES)
        )
        _field_cache[cls] = names
    return names


def exits(block: cst.BaseSuite) -> bool:
    """True when a block always leaves its enclosing block (return/raise/continue/break/exit())."""
    body = block.body
    if not body:
        return False
    last = body[-1]
    if isinstance(last, cst.SimpleStatementLine):
        small = last.body[-1] if last.body else None
        if isinstance(small, (cst.Return, cst.Raise, cst.Continue, cst.Break)):
            return True
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            name = dotted_name(small.value.func)
            return name in {"exit", "sys.exit", "quit", "os._exit"}
    if isinstance(last, cst.SimpleStatementSuite):
        small = last.body[-1] if last.body else None
        return isinstance(small, (cst.Return, cst.Raise, cst.Continue, cst.Break))
    return False



class Span(Protocol):
    """Anything the model numbers in source order: a loop, a function (`order` .. `end_order`)."""

    order: int
    end_order: int


def contains(outer: Span, order: int) -> bool:
    """True when the item numbered `order` lies inside `outer`. The one place that answers the
    `order`/`end_order` containment question: bodies are numbered between the two."""
    return outer.order < order < outer.end_order


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"

    def __bool__(self) -> bool:
        return False


UNKNOWN: object = _Unknown()


def walk(node: cst.CSTNode, skip: Optional[Callable[[cst.CSTNode], bool]] = None) -> Iterator[cst.CSTNode]:
    """Every statement/expression node in a subtree (whitespace and token nodes skipped), in no
    particular order; `skip` prunes a node and everything under it. The same cheap walk the builder
    uses, for the analysis layer's deeper questions (rules never walk the tree:
    tests/test_analysis_layering.py)."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if skip is not None and skip(current):
            continue
        yield current
        for name in child_fields(type(current)):
            value = getattr(current, name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif type(value) in (tuple, list):
                stack.extend(v for v in value if isinstance(v, cst.CSTNode))


def names_in(node: cst.CSTNode) -> Iterable[str]:
    """Every dotted name (Name/Attribute chain) read in a subtree, outermost chains only."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        name = dotted_name(current)
        if name is not None:
            yield name
            continue
        for field_name in child_fields(type(current)):
            value = getattr(current, field_name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif type(value) in (tuple, list):
                stack.extend(v for v in value if isinstance(v, cst.CSTNode))


def mentions_identifier(node: cst.CSTNode, words: Iterable[str]) -> bool:
    """True when a subtree names one of `words` as a variable or an attribute (`model`,
    `net.state_dict()`, `self.params`)."""
    wanted = frozenset(words)
    for current in walk(node):
        if isinstance(current, cst.Name) and current.value in wanted:
            return True
        if isinstance(current, cst.Attribute) and current.attr.value in wanted:
            return True
    return False


def modulo_divisors(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """The right operands of every `%` in a subtree (`(i + 1) % accum_steps == 0` -> `accum_steps`)."""
    return [
        current.right for current in walk(node)
        if isinstance(current, cst.BinaryOperation) and isinstance(current.operator, cst.Modulo)
    ]


def is_zero_literal(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.evaluated_value == 0


def bool_literal(node: Optional[cst.BaseExpression]) -> Optional[bool]:
    """`True` -> True, `False` -> False, anything else (None included) -> None."""
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


def literal_int(node: cst.BaseExpression) -> Optional[int]:
    """`3` -> 3, `-1` -> -1 (a unary minus on an integer), anything else -> None."""
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and isinstance(node.expression, cst.Integer):
        return -int(node.expression.evaluated_value)
    return None


def literal_ints(node: cst.BaseExpression) -> Optional[list[int]]:
    """`[0, -1]` / `(0,)` / `{0}` -> the ints, or None when any element is not an int literal."""
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        values = []
        for element in node.elements:
            value = literal_int(element.value)
            if value is None:
                return None
            values.append(value)
        return values
    return None


# The operator that keeps a comparison's meaning when its sides swap (`0 < n` is `n > 0`).
MIRRORED_OPERATORS: dict[type[cst.BaseCompOp], type[cst.BaseCompOp]] = {
    cst.Equal: cst.Equal, cst.NotEqual: cst.NotEqual, cst.LessThan: cst.GreaterThan,
    cst.GreaterThan: cst.LessThan, cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual,
}


def flatten_boolean(test: cst.BooleanOperation) -> list[cst.BaseExpression]:
    """`a and b and c` -> [a, b, c] (one operator kind; parenthesised groups stay whole)."""
    operator_type = type(test.operator)
    out: list[cst.BaseExpression] = []
    for side in (test.left, test.right):
        if isinstance(side, cst.BooleanOperation) and type(side.operator) is operator_type and not side.lpar:
            out.extend(flatten_boolean(side))
        else:
            out.append(side)
    return out


# Binary operators that bind at least as tightly as `*`: `a / b * c` keeps its meaning.
_AS_TIGHT_AS_PRODUCT = (cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.MatrixMultiply, cst.Power)


def as_left_factor(node: cst.BaseExpression, code: str) -> str:
    """`code` (the source of `node`) made safe as the left operand of `*`: parenthesized unless it
    binds at least as tightly (`lr + 1` -> `(lr + 1)`, `args.lr / 2` stays)."""
    if node.lpar:
        return code
    if isinstance(node, cst.BinaryOperation):
        return code if isinstance(node.operator, _AS_TIGHT_AS_PRODUCT) else f"({code})"
    if isinstance(node, cst.UnaryOperation):
        return f"({code})" if isinstance(node.operator, cst.Not) else code
    if isinstance(node, (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.Call, cst.Subscript)):
        return code
    return f"({code})"
