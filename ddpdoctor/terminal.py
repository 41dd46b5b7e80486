"""Whether a command's report may use colour: the one rule every command follows."""

from __future__ import annotations

import os
import sys
from typing import Optional


def use_color(output_file: Optional[str] = None) -> bool:
    """Colour only on a terminal, never into a file; NO_COLOR wins over FORCE_COLOR."""
    if output_file or os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return sys.stdout.isatty()
