"""Whether a command's report may use colour: the one rule every command follows."""

from __future__ import annotations

import os
import sys
from typing import Iterable, Optional, Sequence, TextIO


def use_color(output_file: Optional[str] = None, stream: Optional[TextIO] = None) -> bool:
    """Colour only on a terminal (standard output unless `stream` is given), never into a file;
    NO_COLOR wins over FORCE_COLOR."""
    if output_file or os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    stream = stream or sys.stdout
    return stream is not None and stream.isatty()  # None: descriptor 1 closed


def rich_output(output_file: Optional[str] = None) -> bool:
    """Rich tables (boxes, wrapping to the window) only where a person reads a terminal; pipes,
    files and CI logs get plain lines, one record a line, never wrapped -- as ruff does."""
    return use_color(output_file)


def plain_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the last column is never padded or cut, so a line is
    as long as its content and `grep`, `cut` and `less -S` see whole records."""
    body = [[str(cell) for cell in row] for row in rows]
    table = [list(headers), *body] if headers else body
    if not table:
        return []
    widths = [max(len(row[i]) for row in table if i < len(row)) for i in range(len(table[0]))]
    lines = []
    for row in table:
        cells = [cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return lines


# C0 controls, DEL and C1 controls: what a terminal may act on (escape sequences, a carriage return
# that hides a line's start), and the Unicode line separators. Tabs and newlines too: one record is
# one line. Each is written as Python would escape it (`\n`, `\x1b`, `\x85`, `\u2028`): the one
# table for every command's output (lint's file names and messages, env, probe and guard).
_CONTROL = {
    code: {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    for code in [*range(0x00, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
}


def escape_controls(text: str) -> str:
    """`text` with every control character written as an escape (`\\x1b`), so that text from a socket,
    a file or the environment cannot move the cursor, recolour or rewrite a terminal's lines."""
    return text.translate(_CONTROL)
