"""Reading the expected findings pinned in fixture files.

Each expected finding is pinned on the line it is reported at, by a trailing comment:

    torch.cuda.set_device(0)  # expect: DDP003
    model = nn.DataParallel(model, device_ids=[0, 1, 2])  # expect: DP001, DP002

(a code listed twice is two findings on that line). A file that expects nothing says so in a comment
line of its own, `# expect: none`, so that an empty expectation is always deliberate. Optional
header lines (in the first 10 lines):

    # world-size: 3                  the --world-size the script runs with
    # pending: issue 10: <why>       the linter does not produce this yet: the test is a strict xfail

Comments are found with the tokenizer, so `# expect:` inside a string is not a pin.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

_EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>.*?)\s*$")
_WORLD = re.compile(r"^#\s*world-size:\s*(?P<n>\d+)\s*$", re.MULTILINE)
_PENDING = re.compile(r"^#\s*pending:\s*(?P<why>.+?)\s*$", re.MULTILINE)
_CODE = re.compile(r"^[A-Z]+[0-9]{3}$")


class PinError(Exception):
    """A fixture whose pins cannot be read: fix the fixture, not the linter."""


@dataclass(frozen=True)
class Pins:
    findings: Counter[tuple[int, str]]  # (line, code) -> how many
    world_size: Optional[int]
    pending: Optional[str]

    @property
    def codes(self) -> set[str]:
        return {code for _, code in self.findings}


def read_pins(text: str, name: str = "<fixture>") -> Pins:
    findings: Counter[tuple[int, str]] = Counter()
    says_none = False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as error:
        raise PinError(f"{name}: cannot tokenize: {error}") from error
    lines = text.splitlines()
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        match = _EXPECT.match(token.string)
        if match is None:
            continue
        line = token.start[0]
        alone = not lines[line - 1][: token.start[1]].strip()
        raw = match.group("codes")
        if alone:
            if raw.lower() != "none":
                raise PinError(f"{name}:{line}: a pin goes on the reported line, not on a line of its own")
            says_none = True
            continue
        for code in (c.strip() for c in raw.split(",")):
            if not _CODE.match(code):
                raise PinError(f"{name}:{line}: {code!r} is not a rule code")
            findings[(line, code)] += 1
    if says_none and findings:
        raise PinError(f"{name}: says `# expect: none` but pins findings")
    if not says_none and not findings:
        raise PinError(f"{name}: pins no finding and lacks `# expect: none`")
    head = "\n".join(lines[:10])
    world = _WORLD.search(head)
    pending = _PENDING.search(head)
    return Pins(
        findings=findings,
        world_size=int(world.group("n")) if world else None,
        pending=pending.group("why") if pending else None,
    )


def read_pins_file(path: Path) -> Pins:
    return read_pins(path.read_text(encoding="utf-8"), str(path))


def describe(counter: Counter[tuple[int, str]]) -> str:
    return ", ".join(f"{code}@{line}" + (f"x{n}" if n > 1 else "") for (line, code), n in sorted(counter.items()))
