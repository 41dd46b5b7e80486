"""Whether a command's report may use colour: the one rule every command follows."""

from __future__ import annotations

import os
import sys
from typing import Optional, TextIO


def use_color(output_file: Optional[str] = None, stream: Optional[TextIO] = None) -> bool:
    """Colour only on a terminal (standard output unless `stream` is given), never into a file;
    NO_COLOR wins over FORCE_COLOR."""
    if output_file or os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return (stream or sys.stdout).isatty()
