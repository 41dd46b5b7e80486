"""Running `ddpdoctor` in-process from a given folder (click's CliRunner), for the CLI tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from click.testing import CliRunner, Result

from ddpdoctor.cli import main


def invoke(args: list[str], cwd: Path, stdin: Optional[bytes] = None, env: Optional[dict[str, str]] = None) -> Result:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, args, input=stdin, env=env, catch_exceptions=False)
    finally:
        os.chdir(old)
