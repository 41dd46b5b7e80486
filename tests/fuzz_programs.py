"""Programs to fuzz the linter with: mutations of real-looking training code that stress the
tokenizer and parser corners (line endings, form feeds, continuations, odd whitespace, nesting).

Used by the fuzz test in the suite and by `benchmarks/fuzz_lint.py`; a dev helper, imported by
neither the linter nor the CLI.
"""

from __future__ import annotations

import random
from typing import Callable

_EXTRA_LINES = [
    "x = 1\\",
    "\\",
    "\x0c",
    "if True:\n\x0c    pass",
    "y = (1 +\n  2)",
    "z = [i for i in range(3)]",
    "# comment \\",
    "class A(b=1, *c):\n    pass",
    "(w): int = 1",
    "v = 1 if x else 2",
    "def f(a, /, b=2, *c, d, **e):\n    return a",
    "u = f'{x!r:>{w}}'",
    "t = lambda: (yield)",
    "with (open(a) as b, open(c) as d):\n    pass",
    "match x:\n    case [1, *rest]:\n        pass",
    "s = 'a' 'b' r'c' b'd'",
    "async def g():\n    return [x async for x in y]",
    "try:\n    pass\nexcept* ValueError:\n    pass",
]


def _line_endings(text: str, rng: random.Random) -> str:
    return text.replace("\n", rng.choice(["\r\n", "\r", "\n"]))


def _drop_final_newline(text: str, rng: random.Random) -> str:
    return text.rstrip("\r\n")


def _trailing_continuation(text: str, rng: random.Random) -> str:
    return text + rng.choice(["\\", "\\\n", "\\\n\n", " \\\n"])


def _form_feeds(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    index = rng.randrange(len(lines))
    lines[index] = "\x0c" + lines[index]
    return "\n".join(lines)


def _insert_line(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    lines.insert(rng.randrange(len(lines) + 1), rng.choice(_EXTRA_LINES))
    return "\n".join(lines)


def _delete_line(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    if len(lines) > 1:
        del lines[rng.randrange(len(lines))]
    return "\n".join(lines)


def _duplicate_line(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    index = rng.randrange(len(lines))
    lines.insert(index, lines[index])
    return "\n".join(lines)


def _tabs(text: str, rng: random.Random) -> str:
    return text.replace("    ", "\t") if rng.random() < 0.5 else text.replace("\t", "    ")


def _nest(text: str, rng: random.Random) -> str:
    depth = rng.choice([10, 50, 100, 150, 199, 250])
    return text + "\nq = " + "(" * depth + "1" + ")" * depth + "\n"


def _chain(text: str, rng: random.Random) -> str:
    links = rng.choice([10, 100, 300])
    part = rng.choice([".b", "[0]", "()", " + 1"])
    return text + "\nq = a" + part * links + "\n"


def _byte_flip(text: str, rng: random.Random) -> str:
    if not text:
        return text
    index = rng.randrange(len(text))
    return text[:index] + rng.choice(" ()[]{}:,.\\\n\t\r\x0c'\"#=") + text[index + 1 :]


MUTATIONS: list[Callable[[str, random.Random], str]] = [
    _line_endings, _drop_final_newline, _trailing_continuation, _form_feeds, _insert_line,
    _delete_line, _duplicate_line, _tabs, _nest, _chain, _byte_flip,
]


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        text = rng.choice(MUTATIONS)(text, rng)
    return text


def compiles(text: str) -> bool:
    try:
        compile(text, "<fuzz>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


# The linter parses only files that mention what some rule looks at (its pre-filter): generated
# programs get this first line so that they reach the parser and the rules.
TRIGGER = "import torch.distributed as dist; from torch.nn.parallel import DistributedDataParallel as DDP\n"


def with_trigger(program: str) -> str:
    return program if "__future__" in program else TRIGGER + program
