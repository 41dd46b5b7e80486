"""The documented Python API: lint files or an in-memory source and get `Finding`s back.

    >>> from ddpdoctor import lint_source
    >>> [f.code for f in lint_source(open("train.py").read(), "train.py")]
    ['DDP001']

`import ddpdoctor` stays cheap: this module (and libcst with it) is imported on first use of
`ddpdoctor.lint_source` / `ddpdoctor.lint_paths`. Nothing here imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union

from ddpdoctor.config import Settings, find_config, load_settings
from ddpdoctor.findings import Finding

if TYPE_CHECKING:
    from ddpdoctor.lint.engine import FileResult

PathLike = Union[str, "os.PathLike[str]"]


def _settings(
    base: Settings,
    select: Optional[Sequence[str]],
    ignore: Optional[Sequence[str]],
    extend_select: Optional[Sequence[str]],
    world_size: Optional[int],
) -> Settings:
    """The command line's precedence: `select` starts afresh (dropping the configuration's
    ignore/extend-select), `ignore`/`extend_select` add to what is there."""
    if select is not None:
        base = base.merged(select=tuple(select), ignore=(), extend_select=())
    if ignore is not None:
        base = base.merged(ignore=base.ignore + tuple(ignore))
    if extend_select is not None:
        base = base.merged(extend_select=base.extend_select + tuple(extend_select))
    settings = base.merged(world_size=world_size)
    settings.enabled_codes()  # validates every code now, not half-way through a run
    return settings


def lint_source(
    source: Union[str, bytes],
    path: str = "<stdin>",
    *,
    select: Optional[Sequence[str]] = None,
    ignore: Optional[Sequence[str]] = None,
    extend_select: Optional[Sequence[str]] = None,
    world_size: Optional[int] = None,
    settings: Optional[Settings] = None,
) -> list[Finding]:
    """Lint one Python source held in memory and return its findings, sorted by position.

    `path` is the name findings carry (and what per-file ignores match); the file need not exist
    and is never read. A `path` ending in `.ipynb` makes `source` a notebook's JSON: its code cells
    are linted as one module and each finding's `cell` and `line` say where in it. `source` as bytes is decoded as Python would (BOM, coding cookie).
    `select`/`ignore`/`extend_select` take codes or prefixes (`"DDP001"`, `"HVD"`, `"ALL"`) as
    the command line does; without `select`, the rules that are on by default run. `settings`
    (a `ddpdoctor.config.Settings`, e.g. from `load_settings`) is the base the others apply to.

    Each finding's `fix` (if any) holds the edits `--fix` would apply (`fix.applicable`: safe).
    A source that cannot be decoded or parsed (or a notebook that is not one) gives one `DDP999`
    finding, never an exception.
    Raises `ddpdoctor.config.ConfigError` (a `ValueError`) for an unknown code.
    """
    from ddpdoctor.lint.engine import lint_source as lint_one

    chosen = _settings(settings or Settings(), select, ignore, extend_select, world_size)
    return _findings([lint_one(source, path, chosen)])


def lint_paths(
    paths: Sequence[PathLike],
    *,
    select: Optional[Sequence[str]] = None,
    ignore: Optional[Sequence[str]] = None,
    extend_select: Optional[Sequence[str]] = None,
    world_size: Optional[int] = None,
    config: Union[PathLike, None, bool] = True,
    jobs: int = 1,
) -> list[Finding]:
    """Lint files and folders (folders are searched for `*.py` and `*.ipynb`, as `ddpdoctor lint`
    does) and return every finding, sorted by path and position.

    The modules the linted files import are read as the analysis needs them (project-aware, as on
    the command line). `config=True` finds the nearest `pyproject.toml`/`ddpdoctor.toml` above the
    first path, as the command line does; a path uses that file; `False`/`None` uses none. The
    keyword options override the configuration. `jobs` > 1 lints in that many forked worker
    processes. No result cache is read or written.

    Raises `ddpdoctor.config.ConfigError` (a `ValueError`) for an unknown code or a broken
    configuration file, and `ddpdoctor.lint.files.PathError` for a path that does not exist or
    cannot be read. A file that cannot be read during the run (or a notebook that is not one) is
    reported as a `DDP999` finding.
    """
    from ddpdoctor.lint.engine import lint_paths as lint_many

    names = [os.fspath(p) for p in paths]
    if config is True:
        start = Path(names[0]) if names else Path(".")
        base = load_settings(find_config((start if start.exists() else Path(".")).resolve()))
    elif config:
        base = load_settings(Path(os.fspath(config)))
    else:
        base = Settings()
    chosen = _settings(base, select, ignore, extend_select, world_size)
    run, _ = lint_many(names or ["."], chosen, jobs=jobs, use_cache=False)
    return _findings(run.files)


def _findings(results: Sequence["FileResult"]) -> list[Finding]:
    """Every finding, and a DDP999 for each file that could not be read (or a notebook that is
    not one), which the command line reports as an error: never silence for an unread file."""
    from ddpdoctor.lint.engine import PARSE_ERROR_CODE, given_up

    unread = [f for r in results if r.error for f in given_up(r.path, frozenset({PARSE_ERROR_CODE}), r.error).findings]
    return sorted([f for r in results for f in r.findings] + unread, key=Finding.sort_key)


__all__ = ["Finding", "lint_paths", "lint_source"]
