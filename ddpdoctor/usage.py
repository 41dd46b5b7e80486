"""Command-line input checked before any work starts: one line on stderr and exit 2 when it is bad.

Shared by the `guard` and `env` commands: numbers must be finite and within sensible bounds (`nan`,
`inf` and `1e20` are usage errors, not a job stopped after 2 s or an internal error later), and an
output file must be writable before a job runs for an hour only to lose its report.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

import click

EXIT_USAGE = 2


def usage_error(message: str) -> click.exceptions.Exit:
    click.echo(f"ddpdoctor: error: {message}", err=True)
    return click.exceptions.Exit(EXIT_USAGE)


class OneLineErrors(click.Command):
    """Usage errors as one line on stderr and exit 2, like the rest of ddpdoctor, instead of
    click's three-line usage block."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            raise usage_error(f"{ctx.info_name}: {error.format_message()}") from None


class Bounded(click.ParamType):
    """A finite number in [low, high]; `integer` rejects fractions."""

    def __init__(self, low: float, high: float, integer: bool = False) -> None:
        self.low, self.high, self.integer = low, high, integer
        self.name = "integer" if integer else "seconds"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or not self.low <= number <= self.high:
            low, high = (f"{int(self.low)}", f"{int(self.high)}") if self.integer else (f"{self.low:g}", f"{self.high:g}")
            kind = "an integer" if self.integer else "a number"
            self.fail(f"{value!r} is not {kind} from {low} to {high}", param, ctx)
        if self.integer:
            if number != int(number):
                self.fail(f"{value!r} is not an integer", param, ctx)
            return int(number)
        return number


def check_writable(path: str, option: str) -> None:
    """Raise a usage error unless `path` can be written (tried now, leaving no file behind)."""
    existed = os.path.lexists(path)
    if os.path.isdir(path):
        raise usage_error(f"{option}: {path} is a directory")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise usage_error(f"{option}: cannot write {path}: {error.strerror or error}") from None
    if not existed:
        os.unlink(path)
